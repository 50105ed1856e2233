"""``python -m mia_engine doctor``: does this machine's GPU stack do what MIA Engine needs? No vLLM.

Three checks, each a line ``PASS|FAIL|SKIP name: detail``:

1. **memory kernel**: the Triton scoring kernel (``kernels/memory_score_triton.py``) against its torch
   reference on one bucket of N x d fp16 keys (1M x 384 on a GPU): same ids, scores within fp16
   tolerance; on a GPU also its time over the bandwidth floor (bytes it must read / measured copy
   bandwidth; goal <= 2x).
2. **GRPO step**: one ``PlannerLearner.step`` of a rank-64 LoRA (q, k, v, o, gate, up, down) on a
   Qwen3-8B-shaped stack with random weights: full width, ``--layers`` deep (default 4; the memory of
   the 36-layer model follows from the per-layer figures, which the dry run's formula is shown
   beside), bf16, gradient checkpointing, micro-batches of 1, two groups of four sequences of
   ``--seq-len`` tokens; the second step's time (the first also builds the optimizer state) and the
   peak GPU memory over both. ``--layers 36 --checks grpo`` steps the whole model.
3. **faiss-gpu**: an exact inner-product search over 1M x 384 on the GPU, when FAISS has GPU support.

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

QWEN3_8B = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 12288, "vocab_size": 151936}
SMALL = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
         "intermediate_size": 768, "vocab_size": 4096}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class Check(msgspec.Struct, frozen=True):
    name: str
    status: str
    """``PASS``, ``FAIL`` or ``SKIP``."""
    detail: str


CHECKS = ("kernel", "grpo", "faiss")
"""What ``--checks`` can pick, in the order they run."""


def run(is_small: bool, num_layers: int, seq_len: int, checks: tuple[str, ...] = CHECKS) -> list[Check]:
    import torch

    has_gpu = torch.cuda.is_available()
    is_small = is_small or not has_gpu
    if not has_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are decorated: before import
    device = "cpu" if is_small and not has_gpu else "cuda"
    chosen = {"kernel": ("memory kernel", lambda: check_kernel(device, is_small)),
              "grpo": ("GRPO step", lambda: check_grpo_step(device, is_small, num_layers, seq_len)),
              "faiss": ("faiss-gpu", lambda: check_faiss_gpu(has_gpu, is_small))}
    return [_guarded(*chosen[name]) for name in CHECKS if name in checks]


def _guarded(name: str, check: Callable[[], Check]) -> Check:
    try:
        return check()
    except Exception as err:  # a broken stack is the finding, not a crash
        return Check(name, "FAIL", f"{type(err).__name__}: {err}")


def check_kernel(device: str, is_small: bool) -> Check:
    import torch

    from kernels.memory_score import memory_topk
    from kernels.memory_score_ref import memory_topk_ref
    from kernels.memory_score_triton import triton

    from .memory.config import ScoreWeights

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
    import torch

    from .deploy.budget import GIB, learner_items
    from .deploy.shapes import decoder_shape
    from .learner.config import LearnerConfig
    from .learner.learner import PlannerLearner

    shape = {**(SMALL if is_small else QWEN3_8B), "num_hidden_layers": 2 if is_small else num_layers,
             "model_type": "qwen3", "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    seq_len = 64 if is_small else seq_len
    config = LearnerConfig(device=device, dtype="float32" if device == "cpu" else "bfloat16", lr=1e-6,
                           micro_batch_size=1, gradient_checkpointing=True, max_grad_norm=1.0)
    with tempfile.TemporaryDirectory(prefix="mia-doctor-") as tmp:
        base, adapter = _random_stack(Path(tmp), shape, device)
        learner = PlannerLearner(base, adapter, config, publish_dtype=torch.bfloat16)
        samples = _samples(shape["vocab_size"], seq_len)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        result = learner.step(samples)  # the first step also builds the optimizer state and CUDA's kernels
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        if result.is_accepted:
            result = learner.step(samples)  # the time a step takes in steady state; the peak covers both
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    if not result.is_accepted:
        return Check("GRPO step", "FAIL", f"the step was rejected: {result.reason}")
    budget = sum(i.num_bytes for i in learner_items(config, decoder_shape(shape), 64, seq_len))
    kept = seq_len - min(len(s.prompt_ids) for s in samples) + 1  # logits from the last prompt token on
    estimate = sum(i.num_bytes for i in learner_items(config, decoder_shape(shape), 64, seq_len, kept))
    where = (f"{shape['num_hidden_layers']} layers x {shape['hidden_size']} wide, r64 LoRA, "
             f"{len(samples)} x {seq_len} tokens")
    if device == "cpu":
        return Check("GRPO step", "PASS", f"{where} (CPU size) in {seconds:.2f} s; no GPU: peak memory and the "
                     "Qwen3-8B-shaped step not measured")
    peak = torch.cuda.max_memory_allocated()
    return Check("GRPO step", "PASS", f"{where}: {seconds:.2f} s a step, peak {peak / GIB:.2f} GiB (dry-run "
                 f"formula {estimate / GIB:.2f} GiB at the {kept} positions it keeps logits for; the dry run "
                 f"budgets {budget / GIB:.2f} GiB, logits for every position)")


def _random_stack(folder: Path, shape: dict, device: str) -> tuple[Path, Path]:
    """A random-weight Qwen3 stack of ``shape`` saved as a model folder, and a rank-64 adapter for it.

    Initialised on ``device``: on a GPU, filling the 36-layer stack's 8 B random weights on the CPU
    would take longer than the step it is built for."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from .models.lora import write_lora_adapter

    config = Qwen3Config(**{k: v for k, v in shape.items() if k not in ("model_type", "torch_dtype")})
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM._from_config(config, dtype=torch.bfloat16)  # never a float32 copy
    model.save_pretrained(folder / "base")
    del model
    write_lora_adapter(folder / "adapter", shape, rank=64, alpha=128, target_modules=LORA_TARGETS, seed=0,
                       b_std=0.0, base_model_name=str(folder / "base"))
    return folder / "base", folder / "adapter"


def _samples(vocab_size: int, seq_len: int) -> list:
    import random

    from .learner.batching import GRPOSample

    rng = random.Random(0)
    prompt_len = seq_len // 4
    samples = []
    for group in range(2):
        prompt = [rng.randrange(vocab_size) for _ in range(prompt_len)]
        for i in range(4):
            samples.append(GRPOSample(prompt_ids=prompt, reward=float(i % 2), group_id=f"g{group}",
                                      completion_ids=[rng.randrange(vocab_size) for _ in range(seq_len - prompt_len)]))
    return samples


def check_faiss_gpu(has_gpu: bool, is_small: bool) -> Check:
    import importlib.util

    import numpy as np

    if not has_gpu or is_small:
        return Check("faiss-gpu", "SKIP", "no GPU (or --small)")
    if importlib.util.find_spec("faiss") is None:
        return Check("faiss-gpu", "SKIP", "FAISS is not installed (the memory index then runs faiss-cpu or none)")
    import faiss

    if getattr(faiss, "get_num_gpus", lambda: 0)() <= 0:
        return Check("faiss-gpu", "SKIP", "FAISS was built without GPU support (install faiss-gpu-cu12)")
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


def main(is_small: bool, num_layers: int, seq_len: int, checks: tuple[str, ...] = CHECKS) -> int:
    checks = run(is_small, num_layers, seq_len, checks)
    for check in checks:
        print(f"{check.status} {check.name}: {check.detail}")
    return 1 if any(c.status == "FAIL" for c in checks) else 0
