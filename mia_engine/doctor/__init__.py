"""``python -m mia_engine doctor``: does this machine's GPU stack do what MIA Engine needs? No vLLM.

Three checks, each a line ``PASS|FAIL|SKIP name: detail``:

1. **memory kernel**: the Triton scoring kernel (``kernels/memory_score_triton.py``) against its torch
   reference on one bucket of N x d fp16 keys (1M x 384 on a GPU): same ids, scores within fp16
   tolerance; on a GPU also its time over the bandwidth floor (bytes it must read / measured copy
   bandwidth; goal <= 2x).
2. **GRPO step**: one ``PlannerLearner.step`` of a rank-64 LoRA (q, k, v, o, gate, up, down) on a
   Qwen3-8B-shaped stack with random weights: full width, ``--layers`` deep (default 4; the memory of
   the 36-layer model follows from the per-layer figures, which the dry run's formula is shown
   beside), bf16, gradient checkpointing of the layers memory needs (``learner.checkpoint_layers``),
   micro-batches of 1, about 32k tokens a step in sequences of ``--seq-len`` tokens (8 x 4096,
   2 x 16384); the second step's time (the first also builds the optimizer state), per step and per
   token, its model-FLOPs utilisation beside the 6N convention's and the hardware's share of the GPU's
   bf16 peak (``flops.py``: what each counts), the recompute's share, a step with every layer
   recomputed for comparison where some were not, and the peak GPU memory. It fails below
   ``learner.min_model_flops_utilization``. ``--layers 36 --checks grpo`` steps the whole model.
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
from typing import TYPE_CHECKING

import msgspec

from ..config.learner import LearnerConfig
from .flops import StepFlops, floor_failure, step_flops, utilization
from .random_stack import LORA_RANK, grpo_samples, random_stack

if TYPE_CHECKING:
    from ..learner.learner import PlannerLearner
    from ..learner.step_result import StepResult

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


def run(is_small: bool, num_layers: int, seq_len: int, checks: tuple[str, ...] = DEFAULT_CHECKS,
        learner: LearnerConfig = LearnerConfig()) -> list[Check]:
    import torch

    has_gpu = torch.cuda.is_available()
    is_small = is_small or not has_gpu
    if not has_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are decorated: before import
    device = "cpu" if is_small and not has_gpu else "cuda"
    chosen = {"kernel": ("memory kernel", lambda: check_kernel(device, is_small)),
              "grpo": ("GRPO step", lambda: check_grpo_step(device, is_small, num_layers, seq_len, learner)),
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


def check_grpo_step(device: str, is_small: bool, num_layers: int, seq_len: int,
                    learner: LearnerConfig = LearnerConfig(), peak_tflops: float | None = None) -> Check:
    """One GRPO step of the Qwen3-8B-shaped stack (see the module docstring): time a step and a token, peak
    GPU memory against the dry run's formula, and its FLOPs (``flops.py``) as shares of the GPU's bf16 dense
    peak: model-FLOPs utilisation (MFU), the 6N convention's and the hardware's (with the recompute).
    ``learner`` gives the recompute settings and the MFU floor (the rest is set here); ``peak_tflops``
    stands in for the GPU's peak (on a CPU too, where otherwise nothing is measured against a peak)."""
    import torch

    from ..deploy.shapes import decoder_shape

    shape = {**(SMALL if is_small else QWEN3_8B), "num_hidden_layers": 2 if is_small else num_layers,
             "model_type": "qwen3", "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    seq_len = 64 if is_small else seq_len
    config = msgspec.structs.replace(learner, device=device, dtype="float32" if device == "cpu" else "bfloat16",
                                     lr=1e-6, micro_batch_size=1, max_grad_norm=1.0)
    samples = grpo_samples(shape["vocab_size"], seq_len)
    step = _grpo_steps(shape, config, samples)
    if step.failure:
        return Check("GRPO step", "FAIL", step.failure)
    num_tokens = len(samples) * seq_len
    where = (f"{shape['num_hidden_layers']} layers x {shape['hidden_size']} wide, r{LORA_RANK} LoRA, "
             f"{len(samples)} x {seq_len} tokens")
    timing = f"{step.seconds:.2f} s a step, {step.seconds / num_tokens * 1e6:.1f} us a token"
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    peak_tflops = peak_tflops or (bf16_peak_tflops(name) if device == "cuda" else None)
    if device == "cpu" and peak_tflops is None:
        return Check("GRPO step", "PASS", f"{where} (CPU size): {timing}; no GPU: peak memory, utilisation of the "
                     "bf16 peak and the Qwen3-8B-shaped step not measured")
    flops = _flops(decoder_shape(shape), samples, step.num_recomputed)
    figures, failure = utilization_report(flops, step.seconds, peak_tflops, name, config.min_model_flops_utilization)
    figures += f"; {step.num_recomputed:g} of {shape['num_hidden_layers']} layers recomputed"
    figures += _comparison_and_memory(step, flops, peak_tflops, config, shape, seq_len)
    return Check("GRPO step", "FAIL" if failure else "PASS", f"{where}: {timing}; {figures}"
                 + (f"; {failure}" if failure else ""))


def _comparison_and_memory(step: GrpoSteps, flops: StepFlops, peak_tflops: float | None, config: LearnerConfig,
                           shape: dict, seq_len: int) -> str:
    """The step with every layer recomputed (the same required FLOPs in its own time), and the peak GPU
    memory beside the dry run's formula, which assumes every layer recomputed."""
    from ..deploy.budget import GIB, learner_items
    from ..deploy.shapes import decoder_shape

    text = ""
    if step.all_recomputed_seconds:
        text += f"; every layer recomputed: {step.all_recomputed_seconds:.2f} s a step"
        if peak_tflops:
            text += f", MFU {100 * utilization(flops.required, step.all_recomputed_seconds, peak_tflops):.1f} %"
    if step.peak_bytes:
        estimate = sum(i.num_bytes for i in learner_items(config, decoder_shape(shape), LORA_RANK, seq_len))
        text += (f"; peak {step.peak_bytes / GIB:.2f} GiB (dry-run formula, every layer recomputed: "
                 f"{estimate / GIB:.2f} GiB)")
    return text


class GrpoSteps(msgspec.Struct, frozen=True):
    """What ``_grpo_steps`` measured."""

    seconds: float
    """The timed step's (the second)."""
    num_recomputed: float
    """Layers gradient checkpointing recomputed in the timed step, averaged over its tokens."""
    peak_bytes: int = 0
    """Peak GPU memory over the first two steps (0 on a CPU)."""
    all_recomputed_seconds: float = 0.0
    """A third step's, with every layer recomputed, where the timed one kept some."""
    failure: str = ""


def _grpo_steps(shape: dict, config: LearnerConfig, samples: list) -> GrpoSteps:
    """Build the random stack and its learner, take the timed steps (``_timed_step``), and where layers
    kept their activations one more step with every layer recomputed, for comparison."""
    import torch

    from ..learner.learner import PlannerLearner

    with tempfile.TemporaryDirectory(prefix="mia-doctor-") as tmp:
        base, adapter = random_stack(Path(tmp), shape, config.device)
        learner = PlannerLearner(base, adapter, config, publish_dtype=torch.bfloat16)
        seconds, result, layer_tokens = _timed_step(learner, samples, config.device)
        if not result.is_accepted:
            return GrpoSteps(0.0, 0, failure=f"the step was rejected: {result.reason}")
        num_layers = len(learner.recompute.layers)
        num_recomputed = layer_tokens / sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
        peak_bytes = torch.cuda.max_memory_allocated() if config.device != "cpu" else 0
        if num_recomputed >= num_layers:  # (none without gradient checkpointing: nothing to compare)
            return GrpoSteps(seconds, num_recomputed, peak_bytes)
        learner.recompute.pinned = num_layers
        all_seconds, result, _ = _timed_step(learner, samples, config.device, num_warmups=0)
    failure = "" if result.is_accepted else f"the step with every layer recomputed was rejected: {result.reason}"
    return GrpoSteps(seconds, num_recomputed, peak_bytes, all_seconds, failure)


def _timed_step(learner: PlannerLearner, samples: list, device: str,
                num_warmups: int = 1) -> tuple[float, StepResult, int]:
    """Seconds of the step after ``num_warmups`` (the first step also builds the optimizer state and CUDA's
    kernels), its result and its recomputed layers x tokens; the CUDA peak-memory counter is reset before
    the first, so the peak covers them all."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for _ in range(num_warmups):
        result = learner.step(samples)
        if not result.is_accepted:
            return 0.0, result, 0
    if device == "cuda":
        torch.cuda.synchronize()
    layer_tokens = learner.recompute.num_recomputed_layer_tokens
    started = time.perf_counter()
    result = learner.step(samples)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started, result, learner.recompute.num_recomputed_layer_tokens - layer_tokens


def _flops(shape: object, samples: list, num_recomputed: float) -> StepFlops:
    """``flops.step_flops`` of the doctor's batch: equal lengths, the completion tokens scored."""
    seq_len = len(samples[0].prompt_ids) + len(samples[0].completion_ids)
    return step_flops(shape, LORA_RANK, len(samples), seq_len, len(samples[0].completion_ids), num_recomputed)


def bf16_peak_tflops(name: str) -> float | None:
    """The bf16 dense peak of the GPU called ``name`` (torch's device name), None if not listed."""
    return next((tflops for key, tflops in BF16_DENSE_TFLOPS if key in name), None)


def utilization_report(flops: StepFlops, seconds: float, peak_tflops: float | None, name: str,
                       floor: float) -> tuple[str, str]:
    """(The utilisation figures of a step, why it fails the MFU ``floor`` or ""): MFU (required FLOPs),
    the 6N convention's share, the hardware's with the recompute and the recompute's share of it, of the
    bf16 dense peak of the GPU called ``name`` (None: not listed, only the rate is given)."""
    rate = flops.required / seconds / 1e12
    recompute = f"recompute {100 * flops.recompute / flops.hardware:.1f} % of the hardware FLOPs"
    if peak_tflops is None:
        return (f"{rate:.0f} TFLOP/s required ({flops.required / 1e15:.3f} PFLOP), {recompute}; {name}: bf16 peak "
                "unknown"), floor_failure(None, floor)
    mfu = utilization(flops.required, seconds, peak_tflops)
    figures = (f"MFU {100 * mfu:.1f} % ({rate:.0f} TFLOP/s of the {flops.required / 1e15:.3f} PFLOP a LoRA step "
               f"requires), {100 * utilization(flops.six_n, seconds, peak_tflops):.1f} % by the 6N convention "
               f"({flops.six_n / 1e15:.3f} PFLOP, a full fine-tuning step's), hardware "
               f"{100 * utilization(flops.hardware, seconds, peak_tflops):.1f} % ({recompute}) of the {name} bf16 "
               f"dense peak ({peak_tflops:.0f} TFLOP/s)")
    return figures, floor_failure(mfu, floor)


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
    from .contention import measure_all

    if is_small:
        sizes = dict(num_keys=20_000, num_layers=2, seq_len=64, shape=SMALL, num_idle_searches=20)
    else:
        sizes = dict(num_keys=1_000_000, num_layers=8, seq_len=4096, shape=QWEN3_8B, num_idle_searches=50)
    rows = measure_all(device, **sizes)  # the learner process first (what serving runs), then in-process rows
    summaries = "; ".join(row.summary() for row in rows)
    if device == "cpu":
        return Check("contention", "PASS", f"{summaries} (CPU size; no CUDA streams: goals apply on a GPU)")
    missed = rows[0].misses()
    verdict = f"; missed: {', '.join(missed)}" if missed else "; goals met"
    return Check("contention", "FAIL" if missed else "PASS", f"{summaries}{verdict}")


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


def main(is_small: bool, num_layers: int, seq_len: int, checks: tuple[str, ...] = DEFAULT_CHECKS,
         learner: LearnerConfig = LearnerConfig()) -> int:
    """Run the checks and print a line each; 1 if one failed. ``learner``: the GRPO step's recompute
    settings and MFU floor (``learner.min_model_flops_utilization``)."""
    checks = run(is_small, num_layers, seq_len, checks, learner)
    for check in checks:
        print(f"{check.status} {check.name}: {check.detail}")
    return 1 if any(c.status == "FAIL" for c in checks) else 0
