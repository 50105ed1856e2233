"""Local search on a real FAISS index with the real encoder: relevance, cross-caller batching, format."""

from __future__ import annotations

import asyncio
import re

import pytest

from mia_engine.tools.corpus import Corpus, Passage
from mia_engine.tools.search import LocalSearch, render_results


@pytest.fixture()
def searcher(index_dir, counting):
    search = LocalSearch(index_dir, counting, batch_wait_ms=5.0)
    yield search
    search.close()


async def test_a_passage_is_found_by_its_own_title(searcher, wiki_slice: Corpus):
    titles = [wiki_slice.passages[i].title for i in (0, 37, 150, 299)]
    results = await searcher.search(titles, top_k=3)
    assert [len(r) for r in results] == [3, 3, 3, 3]
    for title, passages in zip(titles, results):
        assert title in [p.title for p in passages]


async def test_concurrent_searches_share_forwards_and_match_one_by_one(index_dir, counting, wiki_slice):
    queries = [f"{wiki_slice.passages[i * 4].title} history" for i in range(64)]
    batched = LocalSearch(index_dir, counting, batch_wait_ms=5.0)
    try:
        concurrent = await asyncio.gather(*(batched.search([q], 3) for q in queries))
        assert counting.num_async_calls <= 4  # 64 callers, a handful of forwards
        assert batched.num_batches == counting.num_async_calls
        in_one_call = await batched.search(queries, 3)
    finally:
        batched.close()
    titles = [[p.title for p in result[0]] for result in concurrent]
    assert titles == [[p.title for p in result] for result in in_one_call]  # each caller got its own rows
    counting.num_async_calls = 0
    one_by_one_search = LocalSearch(index_dir, counting, batch_wait_ms=0.0)
    sample = range(0, 64, 4)  # single-query forwards are slow on a busy 2-core machine: check every 4th
    try:
        one_by_one = [await one_by_one_search.search([queries[i]], 3) for i in sample]
    finally:
        one_by_one_search.close()
    assert counting.num_async_calls == len(sample)
    assert [titles[i] for i in sample] == [[p.title for p in result[0]] for result in one_by_one]


async def test_mixed_top_k_and_multi_query_calls_in_one_batch(searcher, wiki_slice):
    a, b = wiki_slice.passages[3].title, wiki_slice.passages[4].title
    one, two = await asyncio.gather(searcher.search([a], 1), searcher.search([a, b], 5))
    assert len(one) == 1 and len(one[0]) == 1 and [len(r) for r in two] == [5, 5]
    assert one[0][0] == two[0][0]
    assert await searcher.search([], 3) == []


async def test_repeated_queries_are_encoded_once(searcher, counting, wiki_slice):
    title = wiki_slice.passages[20].title
    results = await asyncio.gather(*(searcher.search([title, "other topic"], 2) for _ in range(4)))
    assert counting.num_texts == 2 and all(result == results[0] for result in results)


async def test_a_cancelled_caller_does_not_break_the_batch(searcher, wiki_slice):
    title = wiki_slice.passages[10].title
    doomed = asyncio.ensure_future(searcher.search([title], 3))
    survivor = asyncio.ensure_future(searcher.search([title], 3))
    await asyncio.sleep(0)
    doomed.cancel()
    assert title in [p.title for p in (await survivor)[0]]


async def test_event_loop_stays_responsive_during_search(searcher, wiki_slice):
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(ticker())
    await searcher.search([p.title for p in wiki_slice.passages[:128]], 3)
    task.cancel()
    assert ticks > 1


def test_render_results_reference_format():
    results = [[Passage("Lima", "Lima is the capital of Peru."), Passage("Peru", "Peru is a country.")],
               [Passage("Cusco", "Cusco is a city.")]]
    text = render_results(["lima", "cusco"], results, max_words=100)
    assert text == ("Doc 1(Title: Lima) Lima is the capital of Peru.\nDoc 2(Title: Peru) Peru is a country."
                    "\n=======\nDoc 1(Title: Cusco) Cusco is a city.")
    short = render_results(["lima"], results[:1], max_words=5)
    assert short.startswith("Doc 1(Title: Lima) Lima is") and short.endswith("(truncated)")
    assert len(re.findall(r"\S+", short.replace("... (truncated)", ""))) == 5
    assert "No results" in render_results(["zzz"], [[]], max_words=10)
