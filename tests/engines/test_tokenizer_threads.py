"""An engine's tokenizer runs on its own ``tokenizer_threads``. The ``tokenizers`` library keeps its BPE word
cache per thread, so the threads that tokenize bound that memory; on the event loop's default executor it
grew with every thread the executor added. Real tokenizer (the tiny model's byte-level BPE), real glibc."""

from __future__ import annotations

import asyncio
import random
import string
import threading
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from bench.stats import has_malloc_counters, malloc_bytes_in_use
from mia_engine.config import SamplingDefaults, load_config
from mia_engine.engines.role_handle import RoleTarget
from mia_engine.engines.roles import RoleServer
from mia_engine.engines.vllm_engine import VLLMEngine
from mia_engine.models.tiny import build_tiny

THREADS = 2
WORDS_PER_TEXT = 1000
TEXTS = 96
"""96,000 distinct words: more than the library's 10,000-word cache on each of the default executor's threads
(``min(32, cores + 4)``, 6 on a 2-core machine)."""


def _texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    words = iter({"".join(rng.choices(string.ascii_lowercase, k=9)) for _ in range(count * WORDS_PER_TEXT * 2)})
    return [" ".join(next(words) for _ in range(WORDS_PER_TEXT)) for _ in range(count)]


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    build_tiny(out)
    return out / "base"


def _role_server(base: Path, threads: int) -> tuple[RoleServer, VLLMEngine]:
    """A role server over the tiny engine with only its tokenizer loaded (the targets ``start`` builds)."""
    config = load_config("tiny", {"engines.tiny.tokenizer_threads": threads})
    engine = VLLMEngine("tiny", config.engines["tiny"], base)
    engine.tokenizer = AutoTokenizer.from_pretrained(base)
    server = RoleServer(config)
    server.serve("tiny", RoleTarget(engine, None, SamplingDefaults(), "engine", {}))
    return server, engine


def _one_full_cache(tokenizer, texts: list[str]) -> int:
    """Bytes one thread's word cache holds once full: measured on a fresh thread, freed when it ends."""
    held: list[int] = []

    def fill() -> None:
        before = malloc_bytes_in_use()
        for text in texts:
            tokenizer(text, add_special_tokens=False)
        held.append(malloc_bytes_in_use() - before)

    thread = threading.Thread(target=fill)
    thread.start()
    thread.join()
    return held[0]


@pytest.mark.skipif(not has_malloc_counters(), reason="needs glibc's mallinfo2")
async def test_tokenizer_caches_are_bounded_by_the_engines_tokenizer_threads(tiny_base: Path) -> None:
    server, engine = _role_server(tiny_base, THREADS)
    try:
        full = _one_full_cache(engine.tokenizer, _texts(1, 16))  # 16,000 words: past one cache's 10,000
        assert full > 500_000, full  # the cache is there to bound: a full one holds well over 0.5 MB
        texts = _texts(2, TEXTS)
        before = malloc_bytes_in_use()

        async def count(i: int, text: str) -> int:  # keeps the count only: the ids would count as held
            if i % 2:
                return len(await server.role("tiny").tokenize(text))
            return len(await server.role("tiny").render_chat([{"role": "user", "content": text}]))

        lengths = await asyncio.gather(*(count(i, text) for i, text in enumerate(texts)))
        held = malloc_bytes_in_use() - before
        assert min(lengths) >= WORDS_PER_TEXT
        assert held < (THREADS + 1) * full, (held, full)  # THREADS full caches, not one per executor thread
    finally:
        engine.shutdown()


async def test_every_tokenizer_call_runs_on_the_engines_threads(tiny_base: Path) -> None:
    server, engine = _role_server(tiny_base, THREADS)
    seen: set[str] = set()
    tokenizer = engine.tokenizer
    original = tokenizer.apply_chat_template

    def recording(*args, **kwargs):  # the real template, noting which thread ran it
        seen.add(threading.current_thread().name)
        return original(*args, **kwargs)

    tokenizer.apply_chat_template = recording
    try:
        await asyncio.gather(*(server.role("tiny").render_chat([{"role": "user", "content": f"question {i}"}])
                               for i in range(32)),
                             *(server.role("tiny").extend_chat([1, 2], f"reply {i}") for i in range(32)))
        assert seen and all(name.startswith("tokenizer-tiny") for name in seen), seen
        assert len(seen) <= THREADS, seen
    finally:
        engine.shutdown()


def test_tokenizer_threads_must_be_positive() -> None:
    from mia_engine.config import ConfigError

    with pytest.raises(ConfigError, match="engines.tiny.tokenizer_threads"):
        load_config("tiny", {"engines.tiny.tokenizer_threads": 0})


async def test_tokenizer_work_after_shutdown_is_refused_as_engine_unavailable(tiny_base: Path) -> None:
    from mia_engine.engines.client import EngineUnavailable

    server, engine = _role_server(tiny_base, THREADS)
    assert await server.role("tiny").tokenize("Lima")
    engine.shutdown()
    with pytest.raises(EngineUnavailable, match="engine tiny is shut down"):
        await server.role("tiny").tokenize("Quito")
