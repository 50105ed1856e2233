"""The popularity sets: >= 30 single-hop questions per split, none from the dev split (id, text, passage),
answers literally (and whole) in their passage, the popular rows above the long-tail rows of their recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import make_popularity_sets

POPULARITY_SET = Path(make_popularity_sets.__file__).with_name("devset_popularity.jsonl")


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return [json.loads(line) for line in POPULARITY_SET.read_text(encoding="utf-8").splitlines()]


def test_committed_file_is_the_generator_output(rows: list[dict]) -> None:
    assert make_popularity_sets.make_popularity_sets() == rows


def test_size_and_fields(rows: list[dict]) -> None:
    splits = [row["split"] for row in rows]
    assert set(splits) == {"popular", "longtail"} and min(splits.count(s) for s in set(splits)) >= 30
    assert len({row["id"] for row in rows}) == len({row["question"] for row in rows}) == len(rows)
    for row in rows:
        assert row["hops"] == 1 and row["source_titles"] == [row["source_title"]], row
        assert isinstance(row["popularity"], int) and row["popularity"] >= 0, row


def test_no_overlap_with_the_dev_split(rows: list[dict]) -> None:
    dev = make_popularity_sets.dev_rows()
    assert dev
    dev_titles = {title for row in dev for title in row["source_titles"]}
    assert not {row["id"] for row in rows} & {row["id"] for row in dev}
    assert not {row["question"] for row in rows} & {row["question"] for row in dev}
    assert not {row["source_title"] for row in rows} & dev_titles


def test_answers_are_literally_in_their_passages(rows: list[dict], wiki_passages: dict[str, str]) -> None:
    for row in rows:
        assert row["answer"][0] in wiki_passages[row["source_title"]], row
        assert row["answer"][0] not in row["question"], row


def test_popular_rows_rank_above_long_tail_rows(rows: list[dict]) -> None:
    for recipe in make_popularity_sets.PER_SPLIT:
        popular = [row["popularity"] for row in rows if row["split"] == "popular" and f"-{recipe}-" in row["id"]]
        tail = [row["popularity"] for row in rows if row["split"] == "longtail" and f"-{recipe}-" in row["id"]]
        assert popular and tail and min(popular) >= max(tail), recipe


def test_in_links_count_other_passages_by_whole_name() -> None:
    entries = [
        {"title": "Ruritania", "extract": "Ruritania is a country. Ruritania's capital is Strelsau."},
        {"title": "Strelsau", "extract": "Strelsau is the capital of Ruritania."},
        {"title": "Zenda (novel)", "extract": "A novel set in Ruritania's south, near Strelsau, by Anthony Hope."},
        {"title": "Anthony Hope", "extract": "Anthony Hope wrote Zenda. Hopeful Ruritanians (sic) abound."},
    ]
    counts = make_popularity_sets.in_links(entries)
    assert counts["Ruritania"] == 2  # itself not counted; "Ruritania's" counts, "Ruritanians" does not
    assert counts["Strelsau"] == 2 and counts["Zenda (novel)"] == 1  # by its display name "Zenda"
    assert counts["Anthony Hope"] == 1  # a two-word name, as a run of whole words


def test_cut_off_answers_are_rejected() -> None:
    entry = {"title": "Trinidad and Tobago", "extract": "Its capital is Port of Spain. Port Louis is elsewhere."}
    assert not make_popularity_sets.whole_answer(entry, "Port")
    assert make_popularity_sets.whole_answer(entry, "Port Louis")
