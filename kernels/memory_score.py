"""Fused memory-retrieval scoring (paper appendix 10): the public entry point and its dispatcher.

Public contract (the memory store calls exactly this)::

    memory_topk(query_q, query_c, has_caption, keys_q, keys_c, usage, success, labels, k, weights,
                *, backend="auto") -> ScoreResult

Inputs (B queries against one bucket of N entries, embedding width d):
    query_q      (B, d) float32 or float16, L2-normalised question embeddings.
    query_c      (B, d) or None, caption embeddings of the queries.
    has_caption  (B,) bool or None; None means no query has a caption.
    keys_q       (N, d) question embeddings of the entries (rows must be contiguous for Triton).
    keys_c       (N, d) or None, caption embeddings of the entries, zero rows where an entry has
                 no caption; None means no entry has one.
    usage, success  (N,) float32 counts u_i and s_i.
    labels       (N,) int8/bool; nonzero = positive (judged correct), 0 = negative.
    k            memories wanted per label; k' = min(k, N).
    weights      ``mia_engine.memory.config.ScoreWeights`` (or anything with its fields).

Score, for query b and entry i (cosines are dot products because embeddings are normalised):
    Sim  = alpha_question·<q, k_i> + alpha_caption·<c, c_i> if the query has a caption, else <q, k_i>
    Ŝ    = (Sim − min Sim) / (max Sim − min Sim + eps), min/max over the whole bucket (both labels)
    Val  = s_i / (u_i + 1),  Freq = 1 / (u_i + 1)
    Score = lambda_sim·Ŝ + lambda_value·Val + lambda_freq·Freq

Output :class:`ScoreResult`, every tensor (B, 2, k'), axis 1 = [positives, negatives], sorted by
descending score; ties go to the lower row index so every backend returns the same ids. Slots
beyond the number of entries of a label hold id -1, score -inf and zeros. N = 0 or k = 0 gives
(B, 2, 0) tensors.

Precision: the query is rounded to the keys' dtype (fp16 keys -> fp16 dot inputs, which is what
lets the GPU use tensor cores at 1M×384) and every product is accumulated in fp32.

Backends: "torch" is the plain reference (:mod:`mia_kernels.memory_score_ref`); "cpu" is the fast
vectorised CPU path (:mod:`mia_kernels.memory_score_cpu`); "triton" is the fused kernel
(:mod:`mia_kernels.memory_score_triton`, which describes its passes); "auto" takes "triton" for CUDA
tensors and "cpu" otherwise, the faster of the two CPU backends from 10k entries up and level with
"torch" below.

Numerics: if every Sim in a bucket is equal up to rounding, max − min is ~1e-7 and eps = 1e-8
does not damp it, so Ŝ magnifies last-bit differences into [0, 1]; backends summing in another
order may then rank such entries differently. That is the paper's formula, not a kernel bug.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from mia_kernels.memory_score_cpu import memory_topk_cpu
from mia_kernels.memory_score_ref import ScoreResult, ScoreWeightsLike, memory_topk_ref
from mia_kernels.memory_score_triton import memory_topk_triton, triton

__all__ = ["Backend", "ScoreResult", "memory_topk", "memory_topk_cpu", "memory_topk_triton"]

Backend = Literal["auto", "triton", "torch", "cpu"]
_EMBEDDING_DTYPES = (torch.float32, torch.float16)
"""bf16 is left out: Triton's CPU interpreter computes bf16 dots wrongly, so it could not be tested."""


def memory_topk(
    query_q: Tensor,
    query_c: Tensor | None,
    has_caption: Tensor | None,
    keys_q: Tensor,
    keys_c: Tensor | None,
    usage: Tensor,
    success: Tensor,
    labels: Tensor,
    k: int,
    weights: ScoreWeightsLike,
    *,
    backend: Backend = "auto",
) -> ScoreResult:
    """Top-k positive and negative memories per query; see the module docstring for the contract."""
    _check_inputs(query_q, query_c, has_caption, keys_q, keys_c, usage, success, labels, k)
    args = (query_q, query_c, has_caption, keys_q, keys_c, usage, success, labels, k, weights)
    chosen = _resolve_backend(backend, query_q)
    if chosen == "torch":
        return memory_topk_ref(*args)
    if chosen == "cpu":
        return memory_topk_cpu(*args)
    return memory_topk_triton(*args)


def _resolve_backend(backend: str, query_q: Tensor) -> str:
    """Map "auto" to Triton on CUDA, else to the CPU path measured fastest ("cpu")."""
    if backend not in ("auto", "triton", "torch", "cpu"):
        raise ValueError(f"unknown backend {backend!r}")
    if backend == "auto":
        return "triton" if query_q.is_cuda and triton is not None else "cpu"
    if backend == "triton" and triton is None:
        raise RuntimeError("backend='triton' needs the triton package")
    if backend == "cpu" and query_q.device.type != "cpu":
        raise ValueError("backend='cpu' needs CPU tensors")
    return backend


def _check_inputs(
    query_q: Tensor,
    query_c: Tensor | None,
    has_caption: Tensor | None,
    keys_q: Tensor,
    keys_c: Tensor | None,
    usage: Tensor,
    success: Tensor,
    labels: Tensor,
    k: int,
) -> None:
    """Shape/dtype/device checks shared by all backends, so every backend fails the same way."""
    if query_q.dim() != 2 or keys_q.dim() != 2 or query_q.shape[1] != keys_q.shape[1]:
        raise ValueError(f"need query_q (B, d) and keys_q (N, d), got {tuple(query_q.shape)} "
                         f"and {tuple(keys_q.shape)}")
    batch, num_entries = query_q.shape[0], keys_q.shape[0]
    for name, tensor, shape in (("query_c", query_c, query_q.shape), ("keys_c", keys_c, keys_q.shape),
                                ("has_caption", has_caption, (batch,)), ("usage", usage, (num_entries,)),
                                ("success", success, (num_entries,)), ("labels", labels, (num_entries,))):
        if tensor is None:
            continue
        if tuple(tensor.shape) != tuple(shape):
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")
        if tensor.device != query_q.device:
            raise ValueError(f"{name} is on {tensor.device}, query_q on {query_q.device}")
    for name, tensor in (("query_q", query_q), ("query_c", query_c), ("keys_q", keys_q), ("keys_c", keys_c)):
        if tensor is not None and tensor.dtype not in _EMBEDDING_DTYPES:
            raise TypeError(f"{name} has dtype {tensor.dtype}, expected one of {_EMBEDDING_DTYPES}")
    if keys_c is not None and keys_c.dtype != keys_q.dtype:
        raise TypeError(f"keys_c dtype {keys_c.dtype} differs from keys_q dtype {keys_q.dtype}")
    if not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be a non-negative int, got {k!r}")
