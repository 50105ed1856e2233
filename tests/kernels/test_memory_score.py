"""Memory-retrieval score: Triton kernel and CPU fast path against the torch reference.

Without a GPU the Triton kernel runs on CPU through Triton's interpreter. Triton reads
TRITON_INTERPRET when it is first imported and when ``@triton.jit`` decorates a function, so this
module sets it before importing anything that imports triton (only where there is no CUDA: there
compiled Triton cannot run anyway). If some earlier test module imported triton without it, the
in-process Triton tests skip and ``test_triton_suite_in_fresh_interpreter`` reruns them in a
subprocess with the variable set, so they never go untested.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from mia_kernels import memory_score_triton  # noqa: E402  (after TRITON_INTERPRET on purpose)
from mia_kernels.memory_score import ScoreResult, memory_topk  # noqa: E402
from mia_kernels.memory_score_ref import memory_topk_ref  # noqa: E402
from mia_engine.config.memory import ScoreWeights  # noqa: E402

WEIGHTS = ScoreWeights()
FIELDS = ("score", "sim", "sim_norm", "value", "freq")
HAS_TRITON = memory_score_triton.triton is not None
# Both ours and triton.language's own @jit helpers (tl.max) must have been decorated interpreted.
IS_INTERPRETED = HAS_TRITON and all(type(fn).__name__ == "InterpretedFunction"
                                    for fn in (memory_score_triton._sim_kernel, memory_score_triton.tl.max))
CAN_RUN_TRITON = IS_INTERPRETED or (HAS_TRITON and torch.cuda.is_available())


def _run_triton(bucket: dict[str, Any], k: int, weights: ScoreWeights = WEIGHTS, **kwargs: Any) -> ScoreResult:
    """Call the Triton backend on CPU tensors: interpreted on CPU, or moved to the GPU and back."""
    device = "cpu" if IS_INTERPRETED else "cuda"
    moved = {name: t.to(device) if isinstance(t, torch.Tensor) else t for name, t in bucket.items()}
    result = memory_score_triton.memory_topk_triton(**moved, k=k, weights=weights, **kwargs)
    return ScoreResult(*(t.cpu() for t in result))


@pytest.fixture
def run_triton() -> Any:
    """The Triton backend, or a skip where it cannot run in this process."""
    if not CAN_RUN_TRITON:
        pytest.skip("Triton unavailable here, or imported before TRITON_INTERPRET was set "
                    "(see test_triton_suite_in_fresh_interpreter)")
    return _run_triton


@pytest.fixture
def maybe_triton() -> Any:
    """The Triton backend, or None: for tests whose CPU-backend checks must run regardless."""
    return _run_triton if CAN_RUN_TRITON else None


def test_triton_suite_in_fresh_interpreter() -> None:
    """Fallback for a process where triton was imported without TRITON_INTERPRET and no GPU."""
    if CAN_RUN_TRITON or not HAS_TRITON:
        pytest.skip("the Triton tests run in this process")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(command, env=env, cwd=Path(__file__).parents[2], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


# ----------------------------------------------------------------------------------------------
# Factories
# ----------------------------------------------------------------------------------------------


def _unit(*shape: int, generator: torch.Generator) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(*shape, generator=generator), dim=-1)


def make_bucket(
    num_entries: int,
    dim: int,
    *,
    batch: int = 3,
    captions: str = "mixed",
    labels: str = "mixed",
    dtype: torch.dtype = torch.float32,
    has_keys_c: bool = True,
    seed: int = 0,
) -> dict[str, Any]:
    """Random normalised embeddings; captions: "none" | "all" | "mixed"; labels: "mixed" | "pos" | "neg"."""
    gen = torch.Generator().manual_seed(seed)
    keys_c = _unit(num_entries, dim, generator=gen)
    keys_c[torch.rand(num_entries, generator=gen) < 0.3] = 0.0  # entries without a caption
    usage = torch.randint(0, 10, (num_entries,), generator=gen).float()
    label_values = {"mixed": torch.randint(0, 2, (num_entries,), generator=gen),
                    "pos": torch.ones(num_entries), "neg": torch.zeros(num_entries)}[labels]
    has_caption = {"none": None, "all": torch.ones(batch, dtype=torch.bool),
                   "mixed": torch.arange(batch) % 2 == 0}[captions]
    return dict(
        query_q=_unit(batch, dim, generator=gen).to(dtype),
        query_c=None if captions == "none" else _unit(batch, dim, generator=gen).to(dtype),
        has_caption=has_caption,
        keys_q=_unit(num_entries, dim, generator=gen).to(dtype),
        keys_c=keys_c.to(dtype) if has_keys_c else None,
        usage=usage,
        success=torch.floor(usage * torch.rand(num_entries, generator=gen)),
        labels=label_values.to(torch.int8),
    )


def assert_same_result(got: ScoreResult, want: ScoreResult, *, atol: float = 1e-5) -> None:
    """Exact ids; every float term within tolerance (and -inf exactly where the reference has it)."""
    assert got.ids.dtype == torch.int64
    assert got.ids.shape == want.ids.shape
    assert torch.equal(got.ids, want.ids), f"ids differ:\n{got.ids}\nvs reference\n{want.ids}"
    for field in FIELDS:
        got_t, want_t = getattr(got, field), getattr(want, field)
        assert got_t.dtype == torch.float32, field
        torch.testing.assert_close(got_t, want_t, atol=atol, rtol=1e-5, msg=field)


# Each case: (bucket kwargs, k); sizes stay small because the Triton interpreter is slow.
CASES = {
    "one_entry": (dict(num_entries=1, dim=16), 3),
    "odd_n_odd_d": (dict(num_entries=37, dim=7), 4),
    "d384_multi_block": (dict(num_entries=301, dim=384), 5),
    "no_captions": (dict(num_entries=129, dim=33, captions="none"), 3),
    "all_captions": (dict(num_entries=129, dim=33, captions="all"), 3),
    "captions_without_keys_c": (dict(num_entries=50, dim=16, has_keys_c=False), 3),
    "k_larger_than_bucket": (dict(num_entries=9, dim=8), 20),
    "only_positive": (dict(num_entries=40, dim=12, labels="pos"), 4),
    "only_negative": (dict(num_entries=40, dim=12, labels="neg"), 4),
    "batch_1": (dict(num_entries=77, dim=24, batch=1), 2),
    "batch_20": (dict(num_entries=65, dim=24, batch=20), 2),
    "fp16": (dict(num_entries=200, dim=64, dtype=torch.float16), 4),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_triton_matches_reference(run_triton: Any, case: tuple[dict, int]) -> None:
    bucket_kwargs, k = case
    bucket = make_bucket(**bucket_kwargs)
    want = memory_topk_ref(**bucket, k=k, weights=WEIGHTS)
    assert_same_result(run_triton(bucket, k), want)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_cpu_path_matches_reference(case: tuple[dict, int]) -> None:
    bucket_kwargs, k = case
    bucket = make_bucket(**bucket_kwargs)
    want = memory_topk_ref(**bucket, k=k, weights=WEIGHTS)
    assert_same_result(memory_topk(**bucket, k=k, weights=WEIGHTS, backend="cpu"), want)
    assert_same_result(memory_topk(**bucket, k=k, weights=WEIGHTS), want)  # "auto" on CPU


@pytest.mark.parametrize("batch", [1, 5, 17])  # the three product shapes the CPU path picks from
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cpu_path_larger_buckets(batch: int, dtype: torch.dtype) -> None:
    bucket = make_bucket(20_011, 384, batch=batch, dtype=dtype, seed=batch)
    want = memory_topk_ref(**bucket, k=8, weights=WEIGHTS)
    assert_same_result(memory_topk(**bucket, k=8, weights=WEIGHTS, backend="cpu"), want)


@pytest.mark.parametrize("block_score", [16, 32])
def test_triton_multi_level_merge(run_triton: Any, block_score: int) -> None:
    """Small pass-2 blocks force candidates through one or more merge levels."""
    bucket = make_bucket(300, 16, batch=2, seed=3)
    for k in (1, 5, 12):
        want = memory_topk_ref(**bucket, k=k, weights=WEIGHTS)
        got = run_triton(bucket, k, block_score=block_score)
        assert_same_result(got, want)


def _all_backends(maybe_triton: Any, bucket: dict, k: int) -> dict[str, ScoreResult]:
    """Every backend on the same bucket; Triton with small pass-2 blocks so merges run too."""
    results = {name: memory_topk(**bucket, k=k, weights=WEIGHTS, backend=name) for name in ("torch", "cpu")}
    if maybe_triton is not None:
        results["triton"] = maybe_triton(bucket, k, block_score=16)
    return results


def test_empty_bucket(maybe_triton: Any) -> None:
    bucket = make_bucket(0, 8, batch=2)
    for name, result in _all_backends(maybe_triton, bucket, k=3).items():
        for field in ("ids",) + FIELDS:
            assert getattr(result, field).shape == (2, 2, 0), (name, field)


def test_k_zero_and_missing_label_padding(maybe_triton: Any) -> None:
    bucket = make_bucket(5, 8, batch=2, labels="pos")
    for name, result in _all_backends(maybe_triton, bucket, k=0).items():
        assert result.ids.shape == (2, 2, 0), name
    for name, result in _all_backends(maybe_triton, bucket, k=7).items():
        assert result.ids.shape == (2, 2, 5), name
        assert (result.ids[:, 1] == -1).all() and torch.isneginf(result.score[:, 1]).all(), name
        assert (result.sim[:, 1] == 0).all() and (result.freq[:, 1] == 0).all(), name
        assert sorted(result.ids[0, 0].tolist()) == [0, 1, 2, 3, 4], name


def test_all_equal_similarities(maybe_triton: Any) -> None:
    """Every key the same: max Sim − min Sim = 0, eps keeps Ŝ at 0; Val/Freq then decide.

    Dyadic values keep the dot products exact: with rounded ones the 1e-8 eps would amplify
    last-bit differences between BLAS code paths into Ŝ (a property of the paper's formula).
    """
    bucket = make_bucket(33, 4, batch=2, seed=5)
    bucket["query_q"] = torch.tensor([[0.5, -0.25, 0.0, 0.75], [0.25, 0.25, 0.5, 0.0]])
    bucket["query_c"] = torch.tensor([[0.0, 0.5, 0.5, 0.5], [0.5, 0.0, 0.0, 0.5]])
    bucket["keys_q"] = torch.tensor([[0.5, 0.5, 0.25, 0.0]]).repeat(33, 1)
    bucket["keys_c"] = torch.tensor([[0.25, 0.0, 0.75, 0.5]]).repeat(33, 1)
    want = memory_topk_ref(**bucket, k=4, weights=WEIGHTS)
    assert (want.sim_norm[want.ids >= 0] == 0).all()
    for name, result in _all_backends(maybe_triton, bucket, k=4).items():
        assert_same_result(result, want)


def _exact_tie_bucket() -> dict[str, Any]:
    """Entries in three duplicate groups; dyadic values keep every dot product exact in fp32."""
    keys = torch.tensor([[0.5, 0.25, 0.0, 0.0], [0.25, 0.5, 0.0, 0.25], [0.0, 0.0, 0.5, 0.5]])
    group = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1])  # entry i is a copy of keys[group[i]]
    return dict(
        query_q=torch.tensor([[0.5, 0.5, 0.25, 0.0], [0.0, 0.25, 0.5, 0.5]]),
        query_c=torch.tensor([[0.25, 0.0, 0.0, 0.5], [0.0, 0.0, 0.0, 0.0]]),
        has_caption=torch.tensor([True, False]),
        keys_q=keys[group],
        keys_c=keys.flip(0)[group],
        usage=torch.full((11,), 2.0),
        success=torch.ones(11),
        labels=torch.tensor([1, 1, 0, 0, 1, 0, 1, 0, 1, 1, 0], dtype=torch.int8),
    )


def test_exact_ties_go_to_lower_index(maybe_triton: Any) -> None:
    bucket = _exact_tie_bucket()
    want = memory_topk_ref(**bucket, k=4, weights=WEIGHTS)
    num_ties = 0
    for row in range(2):
        for slot, label in enumerate((1, 0)):
            ids = want.ids[row, slot].tolist()
            scores = want.score[row, slot].tolist()
            assert all(bucket["labels"][i] == label for i in ids)
            for (a, sa), (b, sb) in zip(zip(ids, scores), zip(ids[1:], scores[1:])):
                assert sa > sb or (sa == sb and a < b)
                num_ties += sa == sb
    assert num_ties >= 4  # the bucket really exercises tie-breaking
    for name, result in _all_backends(maybe_triton, bucket, k=4).items():
        assert_same_result(result, want)


def test_score_formula_by_hand(maybe_triton: Any) -> None:
    """Four entries worked out with plain arithmetic, not with the reference."""
    keys_q = [[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [0.8, 0.6]]
    keys_c = [[0.0, 1.0], [1.0, 0.0], [0.0, 0.0], [0.6, 0.8]]  # entry 2 has no caption
    usage, success, labels = [4.0, 0.0, 1.0, 3.0], [1.0, 0.0, 1.0, 3.0], [1, 0, 0, 1]
    query_q, query_c = [1.0, 0.0], [0.0, 1.0]
    # Query 0 has a caption: Sim = 0.8·cos_q + 0.2·cos_c; query 1 has none: Sim = cos_q.
    cos_q = [1.0, 0.0, 0.6, 0.8]
    cos_c = [1.0, 0.0, 0.0, 0.8]
    sims = [[0.8 * a + 0.2 * b for a, b in zip(cos_q, cos_c)], cos_q]  # [1, 0, .48, .8], [1, 0, .6, .8]
    value = [0.2, 0.0, 0.5, 0.75]  # s / (u + 1)
    freq = [0.2, 1.0, 0.5, 0.25]  # 1 / (u + 1)
    expected_score = [[0.82, 0.30, 0.636, 0.86],  # 0.7·Ŝ + 0.3·Val + 0.3·Freq, Ŝ = Sim (min 0, max 1)
                      [0.82, 0.30, 0.720, 0.86]]
    expected_ids = [[[3, 0], [2, 1]], [[3, 0], [2, 1]]]  # entry 3 beats the closer entry 0 on Val
    bucket = dict(
        query_q=torch.tensor([query_q, query_q]), query_c=torch.tensor([query_c, query_c]),
        has_caption=torch.tensor([True, False]), keys_q=torch.tensor(keys_q), keys_c=torch.tensor(keys_c),
        usage=torch.tensor(usage), success=torch.tensor(success), labels=torch.tensor(labels, dtype=torch.int8),
    )
    for name, result in _all_backends(maybe_triton, bucket, k=2).items():
        assert result.ids.tolist() == expected_ids, name
        for b in range(2):
            for slot in range(2):
                for j, entry in enumerate(expected_ids[b][slot]):
                    sim = sims[b][entry]
                    assert result.score[b, slot, j].item() == pytest.approx(expected_score[b][entry], abs=1e-6)
                    assert result.sim[b, slot, j].item() == pytest.approx(sim, abs=1e-6)
                    assert result.sim_norm[b, slot, j].item() == pytest.approx(sim / (1.0 + 1e-8), abs=1e-6)
                    assert result.value[b, slot, j].item() == pytest.approx(value[entry], abs=1e-7)
                    assert result.freq[b, slot, j].item() == pytest.approx(freq[entry], abs=1e-7)


def test_custom_weights_and_bool_labels() -> None:
    weights = ScoreWeights(alpha_question=0.5, alpha_caption=0.5, lambda_sim=1.0, lambda_value=0.0,
                           lambda_freq=2.0, eps=1e-6)
    bucket = make_bucket(90, 20, seed=9)
    bucket["labels"] = bucket["labels"].bool()
    want = memory_topk_ref(**bucket, k=3, weights=weights)
    assert_same_result(memory_topk(**bucket, k=3, weights=weights, backend="cpu"), want)


def test_invalid_inputs_raise() -> None:
    bucket = make_bucket(10, 8)
    with pytest.raises(ValueError):
        memory_topk(**{**bucket, "keys_q": bucket["keys_q"][:, :4]}, k=2, weights=WEIGHTS)
    with pytest.raises(ValueError):
        memory_topk(**{**bucket, "usage": bucket["usage"][:3]}, k=2, weights=WEIGHTS)
    with pytest.raises(ValueError):
        memory_topk(**{**bucket, "query_c": None}, k=2, weights=WEIGHTS)  # captioned, no query_c
    with pytest.raises(ValueError):
        memory_topk(**bucket, k=-1, weights=WEIGHTS)
    with pytest.raises(ValueError):
        memory_topk(**bucket, k=2, weights=WEIGHTS, backend="gpu")
    with pytest.raises(TypeError):
        memory_topk(**{**bucket, "keys_c": bucket["keys_c"].half()}, k=2, weights=WEIGHTS)
    with pytest.raises(TypeError):
        memory_topk(**{**bucket, "keys_q": bucket["keys_q"].bfloat16()}, k=2, weights=WEIGHTS)


def test_triton_rejects_strided_rows(run_triton: Any) -> None:
    bucket = make_bucket(10, 8)
    strided = torch.randn(8, 10).T  # (10, 8) with stride(1) == 10
    with pytest.raises(ValueError, match="contiguous"):
        run_triton({**bucket, "keys_q": strided}, 2)


_COMPILE_FOR_SM90 = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from mia_kernels import memory_score_triton as ms

def compile_kernel(fn, signature, constexprs):
    source = ASTSource(fn=fn, signature={**signature, **{c: "constexpr" for c in constexprs}}, constexprs=constexprs)
    triton.compile(source, target=GPUTarget("cuda", 90, 32))

for query in ("*fp32", "*fp16"):  # an fp32 query is rounded to the fp16 keys' dtype in the kernel
    compile_kernel(ms._sim_kernel, {"query_q_ptr": query, "query_c_ptr": query, "captioned_ptr": "*i8",
        "keys_q_ptr": "*fp16", "keys_c_ptr": "*fp16", "sim_ptr": "*fp32", "partials_ptr": "*fp32", "B": "i32",
        "N": "i32", "D": "i32", "stride_kq": "i32", "stride_kc": "i32", "num_blocks": "i32", "alpha_q": "fp32",
        "alpha_c": "fp32"}, {"USE_CAPTION": True, "HAS_KEYS_C": True, "BLOCK_B": 16, "BLOCK_N": 64, "BLOCK_D": 64})
compile_kernel(ms._score_topk_kernel, {"sim_ptr": "*fp32", "minmax_ptr": "*fp32",
    "usage_ptr": "*fp32", "success_ptr": "*fp32", "label_ptr": "*i8", "out_score_ptr": "*fp32", "out_id_ptr": "*i64",
    "B": "i32", "N": "i32", "k": "i32", "num_blocks": "i32", "lambda_sim": "fp32", "lambda_value": "fp32",
    "lambda_freq": "fp32", "eps": "fp32"}, {"BLOCK": 1024})
compile_kernel(ms._terms_kernel, {"ids_ptr": "*i64", "score_ptr": "*fp32", "sim_ptr": "*fp32", "minmax_ptr": "*fp32",
    "usage_ptr": "*fp32", "success_ptr": "*fp32", "out_ptr": "*fp32", "B": "i32", "N": "i32", "width": "i32",
    "eps": "fp32"}, {"BLOCK": 16})
compile_kernel(ms._merge_topk_kernel, {"in_score_ptr": "*fp32", "in_id_ptr": "*i64", "out_score_ptr": "*fp32",
    "out_id_ptr": "*i64", "M": "i32", "k": "i32", "num_blocks": "i32"}, {"BLOCK": 2048})
"""


def test_kernels_compile_for_a_real_gpu(tmp_path: Path) -> None:
    """The interpreter accepts code the GPU compiler rejects: compile to sm_90 cubin (no GPU needed)."""
    if not HAS_TRITON:
        pytest.skip("needs triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_SM90], env=env, cwd=Path(__file__).parents[2],
                          capture_output=True, text=True)
    if "No module named 'triton.backends.nvidia'" in done.stderr:
        pytest.skip("this triton build has no NVIDIA backend")
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_triton_on_gpu_matches_reference(dtype: torch.dtype) -> None:
    """The compiled kernel on a real GPU (fp16 dots on tensor cores, fp32 with IEEE dots)."""
    for num_entries, batch in ((5_000, 4), (100_003, 33)):
        bucket = make_bucket(num_entries, 384, batch=batch, dtype=dtype, seed=11)
        want = memory_topk_ref(**bucket, k=8, weights=WEIGHTS)
        on_gpu = {name: (t.cuda() if isinstance(t, torch.Tensor) else t) for name, t in bucket.items()}
        got = memory_topk(**on_gpu, k=8, weights=WEIGHTS)  # "auto" -> triton on CUDA
        assert_same_result(ScoreResult(*(t.cpu() for t in got)), want, atol=1e-4)


def test_the_kernel_launches_on_the_keys_device(run_triton: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton launches on the calling thread's current device: every launch runs under the keys' one."""
    from contextlib import contextmanager

    scoped: list[torch.device] = []
    real = memory_score_triton.on_device_of

    @contextmanager
    def spy(tensor: torch.Tensor):
        with real(tensor):
            scoped.append(tensor.device)
            yield
            scoped.append(tensor.device)

    monkeypatch.setattr(memory_score_triton, "on_device_of", spy)
    bucket = make_bucket(300, 32, seed=5)
    assert_same_result(run_triton(bucket, 3), memory_topk_ref(**bucket, k=3, weights=WEIGHTS))
    assert len(scoped) == 2 and scoped[0] == scoped[1]  # entered once, around every launch


def test_the_device_scope_is_the_tensors_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    entered: list[object] = []
    monkeypatch.setattr(torch.cuda, "device", lambda device: entered.append(device) or "scope")

    class OnGpu7:
        is_cuda, device = True, torch.device("cuda", 7)

    assert memory_score_triton.on_device_of(OnGpu7()) == "scope" and entered == [torch.device("cuda", 7)]
    with memory_score_triton.on_device_of(torch.zeros(1)):  # a CPU tensor: nothing to select
        pass
    assert entered == [torch.device("cuda", 7)]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_triton_from_a_thread_on_another_gpu() -> None:
    """A store on GPU 1 called from a thread whose current device is GPU 0."""
    import threading

    bucket = make_bucket(5_000, 384, batch=4, dtype=torch.float16, seed=12)
    want = memory_topk_ref(**bucket, k=8, weights=WEIGHTS)
    on_gpu1 = {name: (t.to("cuda:1") if isinstance(t, torch.Tensor) else t) for name, t in bucket.items()}
    results: list[ScoreResult] = []

    def call() -> None:
        torch.cuda.set_device(0)
        results.append(memory_topk(**on_gpu1, k=8, weights=WEIGHTS))

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    assert_same_result(ScoreResult(*(t.cpu() for t in results[0])), want, atol=1e-4)
