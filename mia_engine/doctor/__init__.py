"""``python -m mia_engine doctor``: does this machine's GPU stack do what MIA Engine needs? No vLLM.

Three checks, each a line ``PASS|FAIL|SKIP name: detail``:

1. **memory kernel**: the Triton scoring kernel (``kernels/memory_score_triton.py``) against its torch
   reference on one bucket of N x d fp16 keys (1M x 384 on a GPU): same ids, scores within fp16
   tolerance; on a GPU also its time over the bandwidth floor (bytes it must read / measured copy
   bandwidth; goal <= 2x).
2. **GRPO step**: one ``PlannerLearner.step`` of a rank-64 LoRA (q, k, v, o, gate, up, down) on a
   Qwen3-8B-shaped stack with random weights: full width, ``--layers`` deep (default 4; the memory of
   the 36-layer model follows from the per-layer figures, which the dry run's formula is shown
   beside), bf16, gradient checkpointing, micro-batches of 1, about 32k tokens a step in sequences of
   ``--seq-len`` tokens (8 x 4096, 2 x 16384); the second step's time (the first also builds the
   optimizer state), per step and per token, its share of the GPU's bf16 peak, and the peak GPU
   memory over both. ``--layers 36 --checks grpo`` steps the whole model.
3. **faiss-gpu**: an exact inner-product search over 1M x 384 on the GPU, when FAISS has GPU support.
4. **contention** (only when asked: ``--checks contention``): memory searches while the learner takes
   GRPO steps on the same GPU, with the serving process's stream priorities and, for comparison, on the
   shared default stream (``contention.py``); it fails where the priority streams miss their goals.

``--small`` (automatic without a GPU) runs the same code at CPU sizes (the kernel under Triton's
interpreter), says what it skipped, and exits 0 unless a check failed.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from .random_stack import grpo_samples, random_stack

QWEN3_8B = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 12288, "vocab_size": 151936}
SMALL = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
         "intermediate_size": 768, "vocab_size": 4096}
BF16_DENSE_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4), ("H200 NVL", 835.0),
                     ("H200", 989.4), ("A100", 312.0))
"""bf16 dense tensor-core peak (TFLOP/s, NVIDIA's datasheets, without sparsity) by a part of torch's
device name, most specific first; a GPU not listed gets "peak unknown"."""


class Check(msgspec.Struct, frozen=True):
    name: str
    status: str
    """``PASS``, ``FAIL`` or ``SKIP``."""
    detail: str


CHECKS = ("kernel", "grpo", "faiss", "contention")
"""What ``--checks`` can pick, in the order they run."""
DEFAULT_CHECKS = ("kernel", "grpo", "faiss")
"""What runs without ``--checks``."""


def run(is_small: bool, num_layers: int, seq_len: int, checks: tuple[str, ...] = DEFAULT_CHECKS) -> list[Check]:
    import torch

    has_gpu = torch.cuda.is_available()
    is_small = is_small or not has_gpu
    if not has_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are decorated: before import
    device = "cpu" if is_small and not has_gpu else "cuda"
    chosen = {"kernel": ("memory kernel", lambda: check_kernel(device, is_small)),
              "grpo": ("GRPO step", lambda: check_grpo_step(device, is_small, num_layers, seq_len)),
              "faiss": ("faiss-gpu", lambda: check_faiss_gpu(has_gpu, is_small)),
              "contention": ("contention", lambda: check_contention(device, is_small))}
    return [_guarded(*chosen[name]) for name in CHECKS if name in checks]


def _guarded(name: str, check: Callable[[], Check]) -> Check:
    try:
        return check()
    except Exception as err:  # a broken stack is the finding, not a crash
        return Check(name, "FAIL", f"{type(err).__name__}: {err}")


def check_kernel(device: str, is_small: bool) -> Check:
    import torch

    from mia_kernels.memory_score import memory_topk
    from mia_kernels.memory_score_ref import memory_topk_ref
    from mia_kernels.memory_score_triton import triton

    from ..config.memory import ScoreWeights

    if triton is None:
        return Check("memory kernel", "SKIP", "triton is not installed")
    num_entries, dim = (3000, 384) if is_small else (1_000_000, 384)
    gen = torch.Generator().manual_seed(0)
    keys = torch.nn.functional.normalize(torch.randn(num_entries, dim, generator=gen), dim=1).half()
    query = torch.nn.functional.normalize(torch.randn(1, dim, generator=gen), dim=1)
    usage = torch.randint(0, 20, (num_entries,), generator=gen).float()
    args = dict(query_q=query, query_c=None, has_caption=None, keys_q=keys, keys_c=None, usage=usage,
                success=torch.floor(usage * torch.rand(num_entries, generator=gen)),
                labels=(torch.rand(num_entries, generator=gen) < 0.5).to(torch.int8), k=4, weights=ScoreWeights())
    on_device = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    got = memory_topk(**on_device, backend="triton")
    want = memory_topk_ref(**args)
    if not torch.equal(got.ids.cpu(), want.ids) or not torch.allclose(got.score.cpu(), want.score, atol=1e-3):
        return Check("memory kernel", "FAIL", f"{num_entries}x{dim} fp16: top-k differs from the torch reference")
    if device == "cpu":
        return Check("memory kernel", "PASS", f"{num_entries}x{dim} fp16 under the Triton interpreter matches the "
                     "torch reference (no GPU: time vs bandwidth floor not measured)")
    seconds = cuda_seconds(lambda: memory_topk(**on_device, backend="triton"))
    floor = (num_entries * dim * 2 + num_entries * 9 + 2 * num_entries * 4) / _copy_bandwidth()
    return Check("memory kernel", "PASS", f"{num_entries}x{dim} fp16 matches the reference; {seconds * 1e3:.3f} ms "
                 f"= {seconds / floor:.2f}x the bandwidth floor ({floor * 1e3:.3f} ms; goal <= 2x)")


def check_grpo_step(device: str, is_small: bool, num_layers: int, seq_len: int) -> Check:
    """One GRPO step of the Qwen3-8B-shaped stack (see the module docstring): time a step and a token, peak
    GPU memory against the dry run's formula, and the share of the GPU's bf16 dense peak.

    Model FLOPs of a step = 6·N·tokens (N = the stack's parameters, embeddings included): 2·N·tokens for
    the forward, 2 for the gradient checkpointing's recompute and 2 for the backward, which computes the
    frozen base weights' input gradients only (the LoRA matmuls are not counted). The second share adds
    causal attention, 8·L·T²·(heads x head_dim) a sequence (its forward 2·L·T²·d, recomputed, and its
    backward twice that), which grows with T: per token it is 4x larger at 16k than at 4k."""
    import torch

    from ..deploy.budget import GIB, learner_items
    from ..deploy.shapes import decoder_shape
    from ..config.learner import LearnerConfig
    from ..learner.learner import PlannerLearner

    shape = {**(SMALL if is_small else QWEN3_8B), "num_hidden_layers": 2 if is_small else num_layers,
             "model_type": "qwen3", "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    seq_len = 64 if is_small else seq_len
    config = LearnerConfig(device=device, dtype="float32" if device == "cpu" else "bfloat16", lr=1e-6,
                           micro_batch_size=1, gradient_checkpointing=True, max_grad_norm=1.0)
    samples = grpo_samples(shape["vocab_size"], seq_len)
    with tempfile.TemporaryDirectory(prefix="mia-doctor-") as tmp:
        base, adapter = random_stack(Path(tmp), shape, device)
        learner = PlannerLearner(base, adapter, config, publish_dtype=torch.bfloat16)
        seconds, result = _timed_step(learner, samples, device)
    if not result.is_accepted:
        return Check("GRPO step", "FAIL", f"the step was rejected: {result.reason}")
    num_tokens = len(samples) * seq_len
    where = (f"{shape['num_hidden_layers']} layers x {shape['hidden_size']} wide, r64 LoRA, "
             f"{len(samples)} x {seq_len} tokens")
    timing = f"{seconds:.2f} s a step, {seconds / num_tokens * 1e6:.1f} us a token"
    if device == "cpu":
        return Check("GRPO step", "PASS", f"{where} (CPU size): {timing}; no GPU: peak memory, share of the bf16 "
                     "peak and the Qwen3-8B-shaped step not measured")
    peak = torch.cuda.max_memory_allocated()
    estimate = sum(i.num_bytes for i in learner_items(config, decoder_shape(shape), 64, seq_len))
    flops = step_flops(decoder_shape(shape), len(samples), seq_len)
    share = peak_share(flops, seconds, torch.cuda.get_device_name())
    return Check("GRPO step", "PASS", f"{where}: {timing}, {share}; peak "
                 f"{peak / GIB:.2f} GiB (dry-run formula {estimate / GIB:.2f} GiB)")


def _timed_step(learner: object, samples: list, device: str) -> tuple[float, object]:
    """Seconds of the second step (the first also builds the optimizer state and CUDA's kernels) and its
    result; the CUDA peak-memory counter is reset before the first, so the peak covers both."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    result = learner.step(samples)
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    if result.is_accepted:
        result = learner.step(samples)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started, result


def step_flops(shape: object, num_sequences: int, seq_len: int) -> tuple[float, float]:
    """(6·N·tokens, causal attention's 8·L·T²·d a sequence): see ``check_grpo_step``."""
    linear = 6 * shape.num_params * num_sequences * seq_len
    attention = 8 * shape.num_layers * seq_len**2 * shape.num_heads * shape.head_dim * num_sequences
    return float(linear), float(attention)


def peak_share(flops: tuple[float, float], seconds: float, name: str) -> str:
    """"x TFLOP/s = y % of the <GPU> bf16 dense peak ... z % with attention" for the GPU called ``name``
    (torch's device name), or "bf16 peak unknown" for one not in BF16_DENSE_TFLOPS."""
    linear, attention = flops
    rate = linear / seconds / 1e12
    peak = next((tflops for key, tflops in BF16_DENSE_TFLOPS if key in name), None)
    if peak is None:
        return f"{rate:.0f} TFLOP/s by 6*N*tokens, {name}: bf16 peak unknown"
    return (f"{rate:.0f} TFLOP/s = {100 * rate / peak:.1f} % of the {name} bf16 dense peak ({peak:.0f}) by "
            f"6*N*tokens, {100 * (linear + attention) / seconds / 1e12 / peak:.1f} % with attention")


def check_faiss_gpu(has_gpu: bool, is_small: bool) -> Check:
    import importlib.util

    import numpy as np

    if not has_gpu or is_small:
        return Check("faiss-gpu", "SKIP", "no GPU (or --small)")
    if importlib.util.find_spec("faiss") is None:
        return Check("faiss-gpu", "SKIP", "FAISS is not installed (the memory index then runs faiss-cpu or none)")
    import faiss

    if getattr(faiss, "get_num_gpus", lambda: 0)() <= 0:
        return Check("faiss-gpu", "SKIP",
                     'FAISS was built without GPU support (the gpu extra\'s faiss-cpu: memory.index_device = "cpu")')
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((1_000_000, 384), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = faiss.GpuIndexFlatIP(faiss.StandardGpuResources(), 384)
    index.add(vectors)
    started = time.perf_counter()
    _, ids = index.search(vectors[:16], 4)
    seconds = time.perf_counter() - started
    if not (ids[:, 0] == np.arange(16)).all():
        return Check("faiss-gpu", "FAIL", "a vector's nearest neighbour is not itself")
    return Check("faiss-gpu", "PASS", f"1M x 384 exact search of 16 queries in {seconds * 1e3:.1f} ms")


def check_contention(device: str, is_small: bool) -> Check:
    """Searches and learner steps alone and together (``contention.py``): 1M keys and an 8-layer stack
    at 8 x 4096 tokens on a GPU, CPU sizes otherwise."""
    from .contention import measure

    if is_small:
        sizes = dict(num_keys=20_000, num_layers=2, seq_len=64, shape=SMALL, num_idle_searches=20)
    else:
        sizes = dict(num_keys=1_000_000, num_layers=8, seq_len=4096, shape=QWEN3_8B, num_idle_searches=50)
    bound = measure(device, use_streams=True, **sizes)
    if device == "cpu":
        return Check("contention", "PASS", f"{bound.summary()} (CPU size; no CUDA streams: goals apply on a GPU)")
    shared = measure(device, use_streams=False, **sizes)
    missed = bound.misses()
    verdict = f"; missed: {', '.join(missed)}" if missed else "; goals met"
    return Check("contention", "FAIL" if missed else "PASS", f"{bound.summary()}; {shared.summary()}{verdict}")


def _copy_bandwidth() -> float:
    import torch

    src = torch.empty(256 * 2**20, dtype=torch.float32, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    seconds = cuda_seconds(lambda: dst.copy_(src))
    return 2 * src.nbytes / seconds  # read + write bytes per second


def cuda_seconds(fn: Callable[[], object], repeats: int = 20) -> float:
    """Median seconds of ``fn`` on the GPU (CUDA events), after one warm-up call."""
    import statistics

    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main(is_small: bool, num_layers: int, seq_len: int, checks: tuple[str, ...] = DEFAULT_CHECKS) -> int:
    checks = run(is_small, num_layers, seq_len, checks)
    for check in checks:
        print(f"{check.status} {check.name}: {check.detail}")
    return 1 if any(c.status == "FAIL" for c in checks) else 0
