"""Benchmark of memory retrieval (paper appendix 10 score + top-k per label) on one bucket.

Compares, on the same data in the same run:
  (a) loop        a per-entry Python loop like the reference implementation: cosine per entry
                  in numpy (dot / (‖q‖·‖e‖), ‖q‖ once per query), the score in Python, then
                  ``sorted`` per label.
  (a') loop-dot   the same loop with a bare dot product (legal because the embeddings are
                  normalised): the fastest honest per-entry loop, a lower bound for (a).
                  Where a full loop would exceed ``--loop-budget-s`` it is timed on a prefix of
                  the bucket and scaled linearly (marked "~"; O(N) apart from the final sort).
  (b) faiss       faiss.IndexFlatIP over all N entries (search with k = N, because min-max needs
                  every similarity), then the score and top-k rescoring in numpy.
  (b0) faiss-nn   IndexFlatIP top-k search alone: *not* a valid retrieval (ignores min-max, Val,
                  Freq), shown as the "plain nearest-neighbour search" floor.
  (c) torch       ``memory_topk(backend="torch")``, the reference; ``cpu``: the fast CPU path;
                  ``cpu fp16``: the fast path on fp16 keys.
A second table times the similarity-product alternatives the CPU path chooses between; a GPU
section (only with CUDA) times the Triton kernel at 1M×384 fp16 against the copy-bandwidth floor.

Run:  python bench/bench_memory_score.py --sizes 1000,10000,100000,1000000
or:   python -m pytest bench/bench_memory_score.py --benchmark-only   (pytest-benchmark, ≤ 100k)
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from mia_kernels.memory_score import ScoreResult, memory_topk  # noqa: E402
from mia_kernels.memory_score_triton import DEFAULT_LAUNCH, LaunchShape  # noqa: E402
from mia_engine.doctor import cuda_seconds  # noqa: E402
from mia_engine.config.memory import ScoreWeights  # noqa: E402

WEIGHTS = ScoreWeights()


@dataclass(frozen=True)
class Bucket:
    """One bucket and a batch of queries, as torch tensors (numpy views share their memory)."""

    query_q: torch.Tensor  # (B, d)
    query_c: torch.Tensor | None  # (B, d)
    has_caption: torch.Tensor | None  # (B,)
    keys_q: torch.Tensor  # (N, d)
    keys_c: torch.Tensor | None  # (N, d)
    usage: torch.Tensor  # (N,)
    success: torch.Tensor  # (N,)
    labels: torch.Tensor  # (N,) int8

    def kwargs(self) -> dict:
        return dict(query_q=self.query_q, query_c=self.query_c, has_caption=self.has_caption,
                    keys_q=self.keys_q, keys_c=self.keys_c, usage=self.usage, success=self.success,
                    labels=self.labels)


def make_bucket(num_entries: int, dim: int, batch: int, has_captions: bool, seed: int = 0) -> Bucket:
    """Random normalised embeddings; with captions every query has one and 30% of entries lack one."""
    gen = torch.Generator().manual_seed(seed)

    def unit(*shape: int) -> torch.Tensor:
        return torch.nn.functional.normalize(torch.randn(*shape, generator=gen), dim=-1)

    keys_c = None
    if has_captions:
        keys_c = unit(num_entries, dim)
        keys_c[torch.rand(num_entries, generator=gen) < 0.3] = 0.0
    usage = torch.randint(0, 20, (num_entries,), generator=gen).float()
    return Bucket(
        query_q=unit(batch, dim),
        query_c=unit(batch, dim) if has_captions else None,
        has_caption=torch.ones(batch, dtype=torch.bool) if has_captions else None,
        keys_q=unit(num_entries, dim),
        keys_c=keys_c,
        usage=usage,
        success=torch.floor(usage * torch.rand(num_entries, generator=gen)),
        labels=torch.randint(0, 2, (num_entries,), generator=gen, dtype=torch.int8),
    )


# ----------------------------------------------------------------------------------------------
# (a) per-entry Python loop
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoopStore:
    """The list-of-entries layout a per-entry implementation keeps (built once, not timed)."""

    rows_q: list
    rows_c: list | None
    usage: list
    success: list
    labels: list


def loop_store(bucket: Bucket, num_entries: int | None = None) -> LoopStore:
    n = bucket.keys_q.shape[0] if num_entries is None else num_entries
    return LoopStore(
        rows_q=list(bucket.keys_q[:n].numpy()),
        rows_c=None if bucket.keys_c is None else list(bucket.keys_c[:n].numpy()),
        usage=bucket.usage[:n].tolist(), success=bucket.success[:n].tolist(), labels=bucket.labels[:n].tolist(),
    )


def _cosine(a: np.ndarray, b: np.ndarray, norm_a: float) -> float:
    norm = norm_a * float(np.linalg.norm(b))
    return float(np.dot(a, b)) / norm if norm > 0.0 else 0.0  # entries without caption: zero rows


def loop_topk(store: LoopStore, query_q: np.ndarray, query_c: np.ndarray | None, k: int,
              w: ScoreWeights, use_cosine: bool) -> tuple[list[int], list[int]]:
    """One query: similarity per entry, min-max, Val/Freq, then sort each label. Returns (pos, neg) ids."""
    norm_q = float(np.linalg.norm(query_q))
    norm_c = 0.0 if query_c is None else float(np.linalg.norm(query_c))
    sims = []
    for i, row_q in enumerate(store.rows_q):
        sim = _cosine(query_q, row_q, norm_q) if use_cosine else float(np.dot(query_q, row_q))
        if query_c is not None:
            row_c = store.rows_c[i]
            sim_c = _cosine(query_c, row_c, norm_c) if use_cosine else float(np.dot(query_c, row_c))
            sim = w.alpha_question * sim + w.alpha_caption * sim_c
        sims.append(sim)
    lo, hi = min(sims), max(sims)
    scored = ([], [])
    for i, sim in enumerate(sims):
        u = store.usage[i]
        score = (w.lambda_sim * (sim - lo) / (hi - lo + w.eps) + w.lambda_value * store.success[i] / (u + 1)
                 + w.lambda_freq / (u + 1))
        scored[0 if store.labels[i] else 1].append((-score, i))
    return [i for _, i in sorted(scored[0])[:k]], [i for _, i in sorted(scored[1])[:k]]


def loop_batch(store: LoopStore, bucket: Bucket, k: int, use_cosine: bool) -> list[tuple[list[int], list[int]]]:
    query_c = bucket.query_c.numpy() if bucket.query_c is not None else None
    return [loop_topk(store, q, None if query_c is None else query_c[b], k, WEIGHTS, use_cosine)
            for b, q in enumerate(bucket.query_q.numpy())]


def loop_ids(store: LoopStore, bucket: Bucket, k: int, use_cosine: bool) -> np.ndarray:
    """(B, 2, k) ids of the loop, -1 padded like ScoreResult.ids."""
    return np.array([[pos + [-1] * (k - len(pos)), neg + [-1] * (k - len(neg))]
                     for pos, neg in loop_batch(store, bucket, k, use_cosine)])


# ----------------------------------------------------------------------------------------------
# (b) FAISS flat inner product + numpy rescoring
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaissStore:
    index_q: object
    index_c: object | None


def faiss_store(bucket: Bucket) -> FaissStore:
    import faiss

    def build(keys: torch.Tensor) -> object:
        index = faiss.IndexFlatIP(keys.shape[1])
        index.add(keys.numpy())
        return index

    return FaissStore(build(bucket.keys_q), None if bucket.keys_c is None else build(bucket.keys_c))


def _faiss_all_sims(index: object, queries: np.ndarray) -> np.ndarray:
    """(B, N) similarities in entry order: search with k = N, then scatter back."""
    num_entries = index.ntotal
    dist, ids = index.search(queries, num_entries)  # (B, N) sorted by similarity
    sims = np.empty_like(dist)
    np.put_along_axis(sims, ids, dist, axis=1)
    return sims


def faiss_topk(store: FaissStore, bucket: Bucket, k: int, w: ScoreWeights = WEIGHTS) -> np.ndarray:
    """(B, 2, k) ids (-1 padded), ties to the lower index."""
    sim = _faiss_all_sims(store.index_q, bucket.query_q.numpy())
    if store.index_c is not None:
        sim = w.alpha_question * sim + w.alpha_caption * _faiss_all_sims(store.index_c, bucket.query_c.numpy())
    usage, success = bucket.usage.numpy(), bucket.success.numpy()
    lo, hi = sim.min(axis=1, keepdims=True), sim.max(axis=1, keepdims=True)
    score = w.lambda_sim * (sim - lo) / (hi - lo + w.eps) + w.lambda_value * success / (usage + 1) \
        + w.lambda_freq / (usage + 1)
    is_pos = bucket.labels.numpy() != 0
    out = np.full((score.shape[0], 2, k), -1, dtype=np.int64)
    for slot, mask in enumerate((is_pos, ~is_pos)):
        masked = np.where(mask, score, -np.inf)  # (B, N)
        kk = min(k, int(mask.sum()))
        if kk == 0:
            continue
        part = np.argpartition(-masked, kk - 1, axis=1)[:, :kk]  # (B, kk) unordered
        for b in range(score.shape[0]):
            order = np.lexsort((part[b], -masked[b, part[b]]))
            out[b, slot, :kk] = part[b][order]
    return out


def faiss_nn_only(store: FaissStore, bucket: Bucket, k: int) -> np.ndarray:
    """Plain top-k inner-product search; not the retrieval score (for scale only)."""
    return store.index_q.search(bucket.query_q.numpy(), k)[1]


# ----------------------------------------------------------------------------------------------
# timing
# ----------------------------------------------------------------------------------------------


STATS = {"median": statistics.median, "min": min}


def time_call(fn: Callable[[], object], min_total_s: float = 1.0, max_repeats: int = 50,
              stat: str = "median") -> float:
    """Seconds of fn() (median or min of the runs) after one warm-up call; at least 3 runs,
    about min_total_s in all. "min" resists other processes on a shared machine."""
    fn()
    times: list[float] = []
    while len(times) < 3 or (sum(times) < min_total_s and len(times) < max_repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return STATS[stat](times)


def time_loop(bucket: Bucket, k: int, budget_s: float, stat: str, use_cosine: bool) -> tuple[float, bool]:
    """Seconds of the loop over the whole batch; (time, extrapolated?)."""
    num_entries = bucket.keys_q.shape[0]
    probe_n = min(num_entries, 20_000)
    probe = loop_store(bucket, probe_n)
    start = time.perf_counter()
    loop_batch(probe, bucket, k, use_cosine)
    per_entry = (time.perf_counter() - start) / probe_n
    if per_entry * num_entries <= budget_s:
        store = loop_store(bucket)
        run = functools.partial(loop_batch, store, bucket, k, use_cosine)
        return time_call(run, budget_s / 4, max_repeats=5, stat=stat), False
    subset_n = max(probe_n, int(budget_s / per_entry / 2))
    subset = loop_store(bucket, subset_n)
    start = time.perf_counter()
    loop_batch(subset, bucket, k, use_cosine)
    return (time.perf_counter() - start) * num_entries / subset_n, True


def ids_match(result: ScoreResult, other: np.ndarray) -> bool:
    return bool(np.array_equal(result.ids.numpy(), other))


# ----------------------------------------------------------------------------------------------
# tables
# ----------------------------------------------------------------------------------------------


def bench_size(num_entries: int, args: argparse.Namespace, has_captions: bool) -> dict:
    """One row of the main table (all times in seconds)."""
    bucket = make_bucket(num_entries, args.dim, args.batch, has_captions)
    kwargs = bucket.kwargs()
    row: dict = {"N": num_entries, "captions": "yes" if has_captions else "no"}
    reference = memory_topk(**kwargs, k=args.k, weights=WEIGHTS, backend="torch")
    timed = functools.partial(time_call, stat=args.stat)
    row["torch"] = timed(lambda: memory_topk(**kwargs, k=args.k, weights=WEIGHTS, backend="torch"))
    row["cpu"] = timed(lambda: memory_topk(**kwargs, k=args.k, weights=WEIGHTS, backend="cpu"))
    agree = ids_match(memory_topk(**kwargs, k=args.k, weights=WEIGHTS, backend="cpu"), reference.ids.numpy())
    half = {**kwargs, "query_q": bucket.query_q.half(), "keys_q": bucket.keys_q.half(),
            "query_c": None if bucket.query_c is None else bucket.query_c.half(),
            "keys_c": None if bucket.keys_c is None else bucket.keys_c.half()}
    row["cpu fp16"] = timed(functools.partial(memory_topk, **half, k=args.k, weights=WEIGHTS, backend="cpu"))
    del half  # the fp16 copies: the next backends' timings should not share memory with them
    if not args.no_faiss:
        store = faiss_store(bucket)
        row["faiss"] = timed(lambda: faiss_topk(store, bucket, args.k))
        row["faiss-nn"] = timed(lambda: faiss_nn_only(store, bucket, args.k))
        agree &= bool(np.array_equal(faiss_topk(store, bucket, args.k), reference.ids.numpy()))
        del store
    for name, use_cosine in (("loop", True), ("loop-dot", False)):
        row[name], row[name + "~"] = time_loop(bucket, args.k, args.loop_budget_s, args.stat, use_cosine)
        if not row[name + "~"]:
            agree &= bool(np.array_equal(loop_ids(loop_store(bucket), bucket, args.k, use_cosine),
                                         reference.ids.numpy()))
    row["agree"] = agree
    return row


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}" if seconds < 10 else f"{seconds * 1e3:.0f}"


def format_main_table(rows: Sequence[dict], batch: int) -> str:
    head = ("| N | captions | (a) loop ms | (a') loop-dot ms | (b) faiss+numpy ms | (b0) faiss-nn ms "
            "| torch ref ms | cpu ms | cpu fp16 ms | cpu vs (a) | cpu vs (a') | cpu vs (b) | cpu Mentries/s "
            "| ids agree |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        loop, loop_dot = (("~" if r[n + "~"] else "") + _ms(r[n]) for n in ("loop", "loop-dot"))
        faiss_ms = _ms(r["faiss"]) if "faiss" in r else "-"
        nn_ms = _ms(r["faiss-nn"]) if "faiss-nn" in r else "-"
        vs_faiss = f"{r['faiss'] / r['cpu']:.1f}x" if "faiss" in r else "-"
        lines.append(
            f"| {r['N']:,} | {r['captions']} | {loop} | {loop_dot} | {faiss_ms} | {nn_ms} | {_ms(r['torch'])} "
            f"| {_ms(r['cpu'])} | {_ms(r['cpu fp16'])} | {r['loop'] / r['cpu']:.0f}x | {r['loop-dot'] / r['cpu']:.0f}x "
            f"| {vs_faiss} | {batch * r['N'] / r['cpu'] / 1e6:.0f} | {'yes' if r['agree'] else 'NO'} |")
    return "\n".join(lines)


def bench_products(sizes: Sequence[int], dim: int, batches: Sequence[int], stat: str) -> str:
    """The similarity-product alternatives behind the CPU path's choice (fp32, ms)."""
    lines = ["| N | B | numpy q@Kᵀ | torch q@Kᵀ | torch (K@qᵀ)ᵀ | chosen (cpu path) |",
             "|---|---|---|---|---|---|"]
    # "chosen" is what mia_kernels.memory_score_cpu._blas_dot picks: numpy for B == 1 or B >= 16, else torch (K@qᵀ)ᵀ.
    from mia_kernels.memory_score_cpu import _cpu_dot

    for num_entries in sizes:
        keys = make_bucket(num_entries, dim, 1, False).keys_q
        for batch in batches:
            query = torch.nn.functional.normalize(torch.randn(batch, dim), dim=-1)
            times = [time_call(fn, min_total_s=0.5, stat=stat) for fn in (
                lambda: torch.from_numpy(query.numpy() @ keys.numpy().T),
                lambda: query @ keys.T,
                lambda: (keys @ query.T).T.contiguous(),
                lambda: _cpu_dot(query, keys),
            )]
            lines.append(f"| {num_entries:,} | {batch} | " + " | ".join(_ms(t) for t in times) + " |")
    return "\n".join(lines)


def _post_torch(sim: torch.Tensor, usage: torch.Tensor, success: torch.Tensor, labels: torch.Tensor,
                k: int, w: ScoreWeights = WEIGHTS) -> torch.Tensor:
    """The score-and-select step written with torch ops (the alternative the CPU path rejected)."""
    sim_min, sim_max = torch.aminmax(sim, dim=1)
    score = w.lambda_sim * (sim - sim_min[:, None]) / (sim_max - sim_min + w.eps)[:, None]
    score = score + w.lambda_value * success / (usage + 1) + w.lambda_freq / (usage + 1)
    is_pos = labels != 0
    by_label = torch.stack([score.masked_fill(~is_pos, float("-inf")), score.masked_fill(is_pos, float("-inf"))], 1)
    return torch.topk(by_label.reshape(-1, sim.shape[1]), k + 1, dim=1).indices


def _post_numpy(sim: np.ndarray, usage: np.ndarray, success: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """The same step as the CPU path runs it (single-threaded numpy)."""
    from mia_kernels.memory_score_cpu import _mask_by_label, _topk_lowest_index

    w = WEIGHTS
    score = sim - sim.min(axis=1)[:, None]
    score /= (sim.max(axis=1) - sim.min(axis=1) + w.eps)[:, None]
    score *= w.lambda_sim
    score += w.lambda_value * (success / (usage + 1.0)) + w.lambda_freq * (1.0 / (usage + 1.0))
    return _topk_lowest_index(_mask_by_label(score, labels).reshape(-1, sim.shape[1]), k)[1]


def bench_postprocess(sizes: Sequence[int], batch: int, k: int, stat: str) -> str:
    """Score + per-label top-k from given Sim (B, N): torch (OpenMP) ops vs the numpy the CPU path uses."""
    lines = ["| N | B | torch ops ms | numpy (cpu path) ms |", "|---|---|---|---|"]
    for num_entries in sizes:
        bucket = make_bucket(num_entries, 8, batch, False)
        sim = torch.rand(batch, num_entries)
        args_t = (sim, bucket.usage, bucket.success, bucket.labels, k)
        args_n = (sim.numpy(), bucket.usage.numpy(), bucket.success.numpy(), bucket.labels.numpy(), k)
        times = [time_call(lambda: _post_torch(*args_t), 0.5, stat=stat),
                 time_call(lambda: _post_numpy(*args_n), 0.5, stat=stat)]
        lines.append(f"| {num_entries:,} | {batch} | " + " | ".join(_ms(t) for t in times) + " |")
    return "\n".join(lines)


GPU_SWEEP = [DEFAULT_LAUNCH] + [shape for shape in (
    [LaunchShape(block_n, warps, stages) for block_n in (64, 128, 256) for warps in (4, 8) for stages in (2, 3, 4)]
    + [LaunchShape(512, 8, stages) for stages in (2, 3)]) if shape != DEFAULT_LAUNCH]
"""Pass-1 launches the sweep times; the kernel's default first."""
SCORE_SWEEP = [(1024, 4)] + [(block, warps) for block in (512, 1024, 2048, 4096) for warps in (2, 4, 8, 16)
                             if (block, warps) != (1024, 4)]
"""Pass-2 (block_score, score_warps) pairs the sweep times; the kernel's default first."""


def device_seconds(fn: Callable[[], object], device: torch.device) -> float:
    """Median seconds of fn: CUDA events on a GPU, the wall clock elsewhere (the interpreted smoke run)."""
    if device.type == "cuda":
        return cuda_seconds(fn)
    return time_call(fn, min_total_s=0.0, max_repeats=3)


def _on(bucket: Bucket, device: torch.device, batch: int) -> dict:
    """The bucket's tensors on ``device``, keys in fp16, the first ``batch`` queries."""
    moved = {name: (t.to(device).half() if t.is_floating_point() and t.dim() == 2 else t.to(device))
             if isinstance(t, torch.Tensor) else t for name, t in bucket.kwargs().items()}
    for name in ("query_q", "query_c", "has_caption"):
        if moved[name] is not None:
            moved[name] = moved[name][:batch]
    return moved


def bench_gpu(num_entries: int = 1_000_000, dim: int = 384, batches: Sequence[int] = (1, 16),
              device: str = "cuda", sweep: bool = False) -> str | None:
    """Triton kernel at N×384 fp16 (1M by default) vs the floor (bytes it must read ÷ measured copy bandwidth); where
    its time goes (pass 1, pass 2 + merges, the winners' terms); torch on the same GPU; and, with
    ``sweep``, the launch sweeps of ``_gpu_sweep``."""
    target = torch.device(device)
    if target.type == "cuda" and not torch.cuda.is_available():
        return None
    bandwidth = None
    if target.type == "cuda":
        src = torch.empty(256 * 2**20, dtype=torch.float32, device=target)  # 1 GiB
        dst = torch.empty_like(src)
        bandwidth = 2 * src.nbytes / cuda_seconds(functools.partial(dst.copy_, src))  # read + write bytes/s
        del src, dst
    sections = [f"copy bandwidth {bandwidth / 1e9:.0f} GB/s (read+write)" if bandwidth else
                f"device {device}: no copy bandwidth, times are not GPU times"]
    lines = ["| N | B | captions | triton ms | floor ms | time / floor | effective GB/s |",
             "|---|---|---|---|---|---|---|"]
    plain = make_bucket(num_entries, dim, max(batches), has_captions=False)
    for has_captions in (False, True):
        bucket = plain if not has_captions else make_bucket(num_entries, dim, max(batches), has_captions=True)
        for batch in batches:
            kwargs = _on(bucket, target, batch)
            seconds = device_seconds(lambda: memory_topk(**kwargs, k=4, weights=WEIGHTS, backend="triton"), target)
            # Embeddings once, the per-entry vectors once, Sim written then read back once.
            num_bytes = (2 if has_captions else 1) * num_entries * dim * 2 + num_entries * 9 + 2 * batch * num_entries * 4
            floor = num_bytes / bandwidth if bandwidth else float("nan")
            lines.append(f"| {num_entries:,} | {batch} | {'yes' if has_captions else 'no'} | {seconds * 1e3:.3f} "
                         f"| {floor * 1e3:.3f} | {seconds / floor:.2f}x | {num_bytes / seconds / 1e9:.0f} |")
    sections.append("\n".join(lines))
    sections.append(_gpu_breakdown(_on(plain, target, 1), target))
    if sweep:
        sections.append(_gpu_sweep(plain, target, batches))
    return "\n\n".join(sections)


def _gpu_breakdown(kwargs: dict, device: torch.device) -> str:
    """B = 1, no captions: each stage of the kernel alone, and torch doing the same job on the same GPU."""
    from mia_kernels.memory_score_ref import memory_topk_ref
    from mia_kernels.memory_score_terms import gather_terms
    from mia_kernels.memory_score_triton import _launch_score_topk, _launch_sim, _launch_terms

    launch = GPU_SWEEP[0]
    usage, success = kwargs["usage"].float(), kwargs["success"].float()
    labels = kwargs["labels"].to(torch.int8)

    def pass1() -> tuple:
        return _launch_sim(kwargs["query_q"], None, None, kwargs["keys_q"], None, WEIGHTS, launch)

    sim, minmax = pass1()

    def pass2() -> tuple:
        return _launch_score_topk(sim, minmax, usage, success, labels, 4, WEIGHTS, 1024)

    top_score, top_ids = pass2()
    fp32 = {**kwargs, "query_q": kwargs["query_q"].float(), "keys_q": kwargs["keys_q"].float()}
    rows = [("whole call (memory_topk, triton)", lambda: memory_topk(**kwargs, k=4, weights=WEIGHTS, backend="triton")),
            ("pass 1: Sim + block min/max + fold", pass1),
            ("pass 2 + merges: score, top-k per label", pass2),
            ("winners' terms, one kernel (_terms_kernel)",
             lambda: _launch_terms(top_ids, top_score, sim, minmax, usage, success, WEIGHTS.eps)),
            ("winners' terms in torch (gather_terms, before)",
             lambda: gather_terms(top_ids, top_score, sim, -minmax[1], minmax[0], usage, success, WEIGHTS.eps)),
            ("torch reference (memory_topk_ref), fp16 keys", lambda: memory_topk_ref(**kwargs, k=4, weights=WEIGHTS)),
            ("torch reference, fp32 keys", lambda: memory_topk_ref(**fp32, k=4, weights=WEIGHTS)),
            ("nearest-neighbour floor: keys @ q, topk (not a valid retrieval)",
             lambda: torch.topk(kwargs["keys_q"] @ kwargs["query_q"].T, 8, dim=0))]
    lines = ["| B = 1, no captions | ms |", "|---|---|"]
    lines += [f"| {name} | {device_seconds(fn, device) * 1e3:.3f} |" for name, fn in rows]
    return "\n".join(lines)


def _gpu_sweep(bucket: Bucket, device: torch.device, batches: Sequence[int]) -> str:
    """Every pass-1 launch of GPU_SWEEP (pass 1 alone and the whole call), then every pass-2 launch of
    SCORE_SWEEP (the whole call); a launch whose ids differ from the default launch's is marked."""
    from mia_kernels.memory_score_triton import _launch_sim, memory_topk_triton

    lines = ["| B | block_n | warps | stages | pass 1 ms | whole call ms | ids as default |",
             "|---|---|---|---|---|---|---|"]
    score_lines = ["| B | block_score | score_warps | whole call ms | ids as default |", "|---|---|---|---|---|"]
    for batch in batches:
        kwargs = _on(bucket, device, batch)
        want = memory_topk_triton(**kwargs, k=4, weights=WEIGHTS).ids
        rows = []
        for launch in GPU_SWEEP:
            def pass1(launch: LaunchShape = launch) -> tuple:
                return _launch_sim(kwargs["query_q"], None, None, kwargs["keys_q"], None, WEIGHTS, launch)

            call = functools.partial(memory_topk_triton, **kwargs, k=4, weights=WEIGHTS, block_n=launch.block_n,
                                     num_warps=launch.num_warps, num_stages=launch.num_stages)
            same, call_s = _checked(call, want, device)
            rows.append((device_seconds(pass1, device) if call_s < float("inf") else call_s, call_s, launch, same))
        lines += [f"| {batch} | {launch.block_n} | {launch.num_warps} | {launch.num_stages} "
                  f"| {pass1_s * 1e3:.3f} | {call_s * 1e3:.3f} | {same} |"
                  for pass1_s, call_s, launch, same in sorted(rows, key=lambda row: row[0])]
        score_rows = []
        for block, warps in SCORE_SWEEP:
            call = functools.partial(memory_topk_triton, **kwargs, k=4, weights=WEIGHTS, block_score=block,
                                     score_warps=warps)
            score_rows.append((*_checked(call, want, device)[::-1], block, warps))
        score_lines += [f"| {batch} | {block} | {warps} | {call_s * 1e3:.3f} | {same} |"
                        for call_s, same, block, warps in sorted(score_rows, key=lambda row: row[0])]
    return "\n".join(lines + [""] + score_lines)


def _checked(call: Callable[[], ScoreResult], want: torch.Tensor, device: torch.device) -> tuple[str, float]:
    """("yes" / "**no**": the call's ids equal ``want``, its seconds); a launch the GPU cannot take
    (shared memory, registers) is a finding, not a crash: ("failed: ...", inf)."""
    try:
        same = "yes" if torch.equal(call().ids, want) else "**no**"
        return same, device_seconds(call, device)
    except Exception as err:
        return f"failed: {type(err).__name__}", float("inf")


def _ints(text: str) -> list[int]:
    """A comma-separated list of integers (``--sizes 1000,10000``)."""
    return [int(item) for item in text.split(",")]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=_ints, default="1000,10000,100000,1000000", help="comma-separated bucket sizes N")
    parser.add_argument("--dim", type=int, default=384, help="embedding width d")
    parser.add_argument("--batch", type=int, default=1, help="queries per call B")
    parser.add_argument("--k", type=int, default=4, help="memories per label")
    parser.add_argument("--captions", default="no,yes", help="which caption settings to run: no, yes or no,yes")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch and faiss threads")
    parser.add_argument("--loop-budget-s", type=float, default=30.0,
                        help="longest full run of the Python loop before it is timed on a prefix and scaled")
    parser.add_argument("--stat", choices=sorted(STATS), default="median", help="statistic over repeated runs")
    parser.add_argument("--no-faiss", action="store_true", help="skip the FAISS baselines")
    parser.add_argument("--no-main", action="store_true", help="skip the main (baselines) table")
    parser.add_argument("--no-products", action="store_true", help="skip the two alternatives tables")
    parser.add_argument("--gpu-entries", type=_ints, default="1000000",
                        help="comma-separated bucket sizes N of the GPU section (one section each)")
    parser.add_argument("--gpu-batches", type=_ints, default="1,16", help="comma-separated queries per call B of the GPU section")
    parser.add_argument("--gpu-device", default="cuda",
                        help="device of the GPU section (cpu with TRITON_INTERPRET=1: a smoke run of its code)")
    parser.add_argument("--gpu-sweep", action="store_true", help="time every launch of GPU_SWEEP (pass 1) and SCORE_SWEEP (pass 2) too")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if not args.no_faiss:
        import faiss

        faiss.omp_set_num_threads(args.threads)
    print(f"# memory_topk benchmark: d={args.dim}, B={args.batch}, k={args.k} per label, "
          f"{args.threads} threads, torch {torch.__version__}, fp32 keys unless noted, {args.stat} ms\n")
    if not args.no_main:
        rows = []
        for has_captions in [c.strip() == "yes" for c in args.captions.split(",")]:
            for num_entries in args.sizes:
                rows.append(bench_size(num_entries, args, has_captions))
                print(f"done N={num_entries:,} captions={has_captions}", file=sys.stderr, flush=True)
        print(format_main_table(rows, args.batch))
    if not args.no_products:
        print("\n## Similarity product alternatives (fp32, ms)\n")
        print(bench_products(args.sizes, args.dim, sorted({1, 4, 16, args.batch}), args.stat))
        print("\n## Score + top-k step alternatives (from Sim, ms)\n")
        print(bench_postprocess(args.sizes, args.batch, args.k, args.stat))
    for num_entries in args.gpu_entries:
        gpu = bench_gpu(num_entries, args.dim, args.gpu_batches, device=args.gpu_device, sweep=args.gpu_sweep)
        print(f"\n## GPU (Triton, fp16 keys), N = {num_entries:,}\n")
        print(gpu if gpu is not None else "no CUDA device: skipped")


# ----------------------------------------------------------------------------------------------
# pytest-benchmark entry points (python -m pytest bench/bench_memory_score.py --benchmark-only)
# ----------------------------------------------------------------------------------------------

BENCH_SIZES = [1_000, 10_000, 100_000]


@pytest.fixture(scope="module", params=BENCH_SIZES, ids=lambda n: f"N{n}")
def bench_bucket(request: pytest.FixtureRequest) -> Bucket:
    return make_bucket(request.param, 384, 1, has_captions=True)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_memory_topk(benchmark: object, bench_bucket: Bucket, backend: str) -> None:
    result = benchmark(lambda: memory_topk(**bench_bucket.kwargs(), k=4, weights=WEIGHTS, backend=backend))
    assert result.ids.shape == (1, 2, 4)


def test_faiss_flat_ip_rescoring(benchmark: object, bench_bucket: Bucket) -> None:
    pytest.importorskip("faiss")
    store = faiss_store(bench_bucket)
    ids = benchmark(lambda: faiss_topk(store, bench_bucket, 4))
    assert ids.shape == (1, 2, 4)


@pytest.mark.parametrize("use_cosine", [True, False], ids=["cosine", "dot"])
def test_python_loop(benchmark: object, bench_bucket: Bucket, use_cosine: bool) -> None:
    store = loop_store(bench_bucket)
    benchmark.pedantic(lambda: loop_batch(store, bench_bucket, 4, use_cosine), rounds=3, iterations=1)


if __name__ == "__main__":
    main()
