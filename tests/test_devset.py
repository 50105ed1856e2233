"""The dev set's recipes: every answer is literally in its passage; a two-hop row's bridge is literally in
its first passage and the answer only in the second; deterministic, split in halves, the original 40 kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


# ---- bench/devset_types.jsonl: yes/no, comparison and numeric questions -------------------------------

TYPED = DEVSET.with_name("devset_types.jsonl")


@pytest.fixture(scope="module")
def typed_rows() -> list[dict]:
    from bench import make_typed_devset

    return make_typed_devset.make_typed_devset(0)


@pytest.fixture(scope="module")
def entries() -> dict[str, dict]:
    return make_devset.wiki_entries()


def _fact(row: dict, entry: dict) -> Any:
    """The fact the row's recipe (its id's middle) reads from one of its passages' entries."""
    from bench import make_typed_devset

    return make_typed_devset.FACTS[row["id"].split("-")[1]](entry)


def test_typed_committed_file_is_the_generator_output(typed_rows: list[dict]) -> None:
    assert [json.loads(line) for line in TYPED.read_text().splitlines()] == typed_rows


def test_typed_sizes_halves_and_fields(typed_rows: list[dict]) -> None:
    fields = {"id", "question", "answer", "source_title", "source_titles", "hops", "split", "type"}
    assert all(set(row) == fields for row in typed_rows)
    assert len({r["id"] for r in typed_rows}) == len({r["question"] for r in typed_rows}) == len(typed_rows)
    for kind in ("yesno", "comparison", "numeric"):
        splits = [r["split"] for r in typed_rows if r["type"] == kind]
        assert splits.count(f"{kind}-dev") == splits.count(f"{kind}-heldout") >= 12, kind
    titles = [title for row in typed_rows for title in row["source_titles"]]
    assert len(titles) == len(set(titles))  # no passage in two rows: learning on one half never reads the other's


def test_yesno_rows_are_balanced_and_true_to_their_passage(typed_rows: list[dict], wiki_passages: dict[str, str],
                                                           entries: dict[str, dict]) -> None:
    yesno = [r for r in typed_rows if r["type"] == "yesno"]
    for split in ("yesno-dev", "yesno-heldout"):
        golds = [r["answer"] for r in yesno if r["split"] == split]
        assert golds.count(["yes"]) == golds.count(["no"]), split
    for row in yesno:
        fact = _fact(row, entries[row["source_title"]])
        passage = wiki_passages[row["source_title"]]
        claim = row["question"].rsplit(" by ", 1)[1] if " by " in row["question"] else \
            row["question"].removeprefix(f"Is the capital of {fact.name} ")
        claim = claim.removesuffix("?")
        assert fact.value in passage and (claim == fact.value) == (row["answer"] == ["yes"]), row
        assert row["answer"] == ["yes"] or claim not in passage, row  # a false claim the passage does not make


def test_comparison_gold_is_right_by_both_passages_in_both_orders(
        typed_rows: list[dict], wiki_passages: dict[str, str], entries: dict[str, dict]) -> None:
    from bench.make_typed_devset import as_number

    comparison = [r for r in typed_rows if r["type"] == "comparison"]
    for row in comparison:
        facts = [_fact(row, entries[title]) for title in row["source_titles"]]
        assert all(f.value in wiki_passages[f.title] and f.name in row["question"] for f in facts), row
        pick = max if "population" in row["id"] else min
        assert row["answer"] == [pick(facts, key=lambda f: as_number(f.value)).name], row
    for split in ("comparison-dev", "comparison-heldout"):
        first = [r["source_title"] == r["source_titles"][0] for r in comparison if r["split"] == split]
        assert first.count(True) == first.count(False), split


def test_numeric_answers_are_literally_in_their_passages(typed_rows: list[dict], wiki_passages: dict[str, str],
                                                         entries: dict[str, dict]) -> None:
    for row in (r for r in typed_rows if r["type"] == "numeric"):
        assert row["answer"][0] in wiki_passages[row["source_title"]], row
        assert row["answer"][0].replace(",", "").isdigit() and row["answer"][0] == _fact(row, entries[row["source_title"]]).value


def test_typed_splits_are_eval_splits(typed_rows: list[dict]) -> None:
    from mia_engine.evals.evaluate import select_questions

    questions = select_questions(str(TYPED), "yesno-dev", None)
    assert [q.id for q in questions] == [r["id"] for r in typed_rows if r["split"] == "yesno-dev"]
    assert questions[0].answers in (["yes"], ["no"])


def test_typed_deterministic_for_a_seed(typed_rows: list[dict]) -> None:
    from bench import make_typed_devset

    assert make_typed_devset.make_typed_devset(0) == typed_rows
    assert make_typed_devset.make_typed_devset(1) != typed_rows
