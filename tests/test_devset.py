"""The dev set's recipes: every answer is literally in its passage; a two-hop row's bridge is literally in
its first passage and the answer only in the second; deterministic, split in halves, the original 40 kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import make_devset

DEVSET = Path(make_devset.__file__).with_name("devset_wiki.jsonl")


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return make_devset.make_devset(0)


def test_committed_file_is_the_generator_output(rows: list[dict]) -> None:
    assert [json.loads(line) for line in DEVSET.read_text().splitlines()] == rows


def test_size_hops_and_halves(rows: list[dict]) -> None:
    assert len(rows) >= 100 and len({r["id"] for r in rows}) == len({r["question"] for r in rows}) == len(rows)
    two_hop = [r for r in rows if r["hops"] == 2]
    assert 3 * len(two_hop) >= len(rows)
    for hops in (1, 2):
        splits = [r["split"] for r in rows if r["hops"] == hops]
        assert abs(splits.count("dev") - splits.count("heldout")) <= 1 and set(splits) == {"dev", "heldout"}


def test_answers_are_literally_in_their_passages(rows: list[dict], wiki_passages: dict[str, str]) -> None:
    for row in rows:
        assert row["source_title"] == row["source_titles"][-1] and len(row["source_titles"]) == row["hops"]
        assert row["answer"][0] in wiki_passages[row["source_title"]], row


def test_two_hop_rows_need_both_passages(rows: list[dict], wiki_passages: dict[str, str]) -> None:
    for row in (r for r in rows if r["hops"] == 2):
        first, bridge = row["source_titles"]
        assert bridge in wiki_passages[first], row  # hop 1: the first passage names the bridge
        assert row["answer"][0] not in wiki_passages[first], row  # the answer is not a single hop away
        assert row["answer"][0] in wiki_passages[bridge], row  # hop 2: the bridge's own passage states it


def test_two_hop_recipes_on_made_up_entries() -> None:
    entries = {
        "Novel X": {"title": "Novel X", "description": "1900 novel by Ann Writer",
                    "extract": "Novel X is a book by Ann Writer."},
        "Ann Writer": {"title": "Ann Writer", "description": "", "extract": "Ann Writer was a Danish novelist."},
        "Townville": {"title": "Townville", "description": "City in Ruritania",
                      "extract": "Townville is a city in Ruritania."},
        "Ruritania": {"title": "Ruritania", "description": "Country in Europe", "extract": "Its capital is Strelsau."},
    }
    assert make_devset.nationality_question(entries["Novel X"], entries) == (
        'What nationality was the author of the 1900 novel "Novel X"?', "Danish", "Ann Writer")
    assert make_devset.place_question(entries["Townville"], entries) == (
        "What is the capital of the country where Townville is located?", "Strelsau", "Ruritania")
    leaky = {**entries["Townville"], "extract": "Townville is a city in Ruritania, near Strelsau."}
    assert make_devset.place_question(leaky, entries) is None  # answerable from one passage: not two-hop


def test_deterministic_for_a_seed(rows: list[dict]) -> None:
    assert make_devset.make_devset(0) == rows
    other = make_devset.make_devset(1)
    assert other != rows and [r["id"] for r in other[:40]] == [r["id"] for r in rows[:40]]
