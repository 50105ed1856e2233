"""MemoryService with the real encoder: search terms, export/import, concurrency, restart."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import numpy as np
import pytest

from mia_engine.memory.embedder import Embedder
from mia_engine.memory.entries import MemoryEntry, MetaPlanPair
from mia_engine.memory.jsonl import decode_jsonl, encode_jsonl
from mia_engine.memory.service import MemoryService, NewMemory

from .factories import memory_config


@pytest.fixture()
async def service(tmp_path: Path, embedder: Embedder) -> AsyncIterator[MemoryService]:
    memory = await MemoryService.open(tmp_path / "store", memory_config(), encoder=embedder)
    yield memory
    await memory.close()


QUESTIONS = [
    ("What is the tallest mountain in Africa?", "correct"),
    ("Which mountain is the highest in Africa?", "incorrect"),
    ("Who composed the Four Seasons?", "correct"),
    ("When did the Berlin Wall fall?", "incorrect"),
]


async def _fill(service: MemoryService) -> list[str]:
    ids = []
    for question, label in QUESTIONS:
        ids.append((await service.add(NewMemory(question, f"1. **search** ({question})", label))).id)
    return ids


async def test_search_terms_agree_with_the_encoder_and_the_formula(service: MemoryService, embedder: Embedder) -> None:
    ids = await _fill(service)
    await service.record_outcome(ids[:2], True)
    query = "Highest peak of Africa?"
    result = await service.search(query, num_positive=2, num_negative=2)
    assert [hit.entry.question for hit in result.positives][0] == QUESTIONS[0][0]
    assert result.negatives[0].entry.question == QUESTIONS[1][0]

    keys = embedder.encode([q for q, _ in QUESTIONS])  # (4, d)
    sims = keys @ embedder.encode([query])[0]  # (4,)
    sim_norm = (sims - sims.min()) / (sims.max() - sims.min() + 1e-8)
    for hit in result.positives + result.negatives:
        row = ids.index(hit.entry.id)
        value = hit.entry.num_successes / (hit.entry.num_uses + 1)
        freq = 1 / (hit.entry.num_uses + 1)
        assert hit.sim == pytest.approx(float(sims[row]), abs=1e-4)
        assert hit.sim_norm == pytest.approx(float(sim_norm[row]), abs=1e-4)
        assert (hit.value, hit.freq) == pytest.approx((value, freq))
        assert hit.score == pytest.approx(0.7 * hit.sim_norm + 0.3 * value + 0.3 * freq, abs=1e-5)


async def test_concurrent_searches_are_scored_together_with_the_same_results(service: MemoryService) -> None:
    await _fill(service)
    queries = ["Highest peak of Africa?", "Who wrote the Four Seasons?", "Berlin Wall year?", "Kilimanjaro height"] * 4
    alone = [await service.search(q) for q in queries]
    batches_before = service._searches.num_batches
    together = await asyncio.gather(*(service.search(q) for q in queries))
    assert service._searches.num_batches - batches_before < len(queries)  # coalesced, not one call each
    assert [[h.entry.id for h in r.positives + r.negatives] for r in together] == \
        [[h.entry.id for h in r.positives + r.negatives] for r in alone]


async def test_export_import_round_trip_through_the_service(
    service: MemoryService, tmp_path: Path, embedder: Embedder
) -> None:
    ids = await _fill(service)
    await service.add(NewMemory("What is on this stamp?", "1. caption", "correct", caption="a blue stamp with a bird"))
    await service.record_outcome(ids[1:3], False)
    await service.add_meta_plan("Who composed the Four Seasons?", "search composer", "guess")
    exported = await service.export_records()
    copy = await MemoryService.open(tmp_path / "copy", memory_config(), encoder=embedder)
    try:
        assert await copy.import_records(decode_jsonl(b"".join(encode_jsonl(exported)))) == len(exported) == 6
        assert _sorted(await copy.export_records()) == _sorted(exported)
    finally:
        await copy.close()


async def test_import_embeds_records_without_embeddings(service: MemoryService, embedder: Embedder) -> None:
    bare = MemoryEntry(
        "bare", "text_image", "time", "When was this photo taken?", "1. look", "correct", caption="a crowd", num_uses=4
    )
    pair = MetaPlanPair("pair", "When was this photo taken?", "good", "bad")
    assert await service.import_records([bare, pair]) == 2
    stored = await service.get("bare")
    expected = embedder.encode(["When was this photo taken?", "a crowd"])
    assert np.allclose(np.frombuffer(stored.question_embedding, dtype="<f4"), expected[0], atol=1e-5)
    assert np.allclose(np.frombuffer(stored.caption_embedding, dtype="<f4"), expected[1], atol=1e-5)
    assert stored.num_uses == 4
    assert (await service.search_meta_plans("photo date?", k=1))[0].pair.id == "pair"


async def test_concurrent_adds_and_restart(service: MemoryService, tmp_path: Path, embedder: Embedder) -> None:
    results = await asyncio.gather(*(service.add(NewMemory(f"question number {i}", "s", "correct")) for i in range(32)))
    assert len({r.id for r in results}) == 32 and all(r.action == "inserted" for r in results)
    before = _sorted(await service.export_records())
    await service.close()
    reopened = await MemoryService.open(tmp_path / "store", memory_config(), encoder=embedder)
    try:
        assert _sorted(await reopened.export_records()) == before
    finally:
        await reopened.close()


async def test_event_loop_keeps_running_during_encoding(service: MemoryService) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(ticker())
    started = time.monotonic()
    await service.add(NewMemory(" ".join(["a long question about many things"] * 40), "s", "correct"))
    elapsed = time.monotonic() - started
    task.cancel()
    assert ticks >= min(5, int(elapsed / 0.004))  # the loop ticked while the forward pass ran


def _sorted(records: list[MemoryEntry | MetaPlanPair]) -> list[bytes]:
    return sorted(msgspec.json.encode(record) for record in records)
