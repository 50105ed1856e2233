"""Generate ``bench/devset_types.jsonl``: 72 questions of three answer types from the wiki-offline passages,
24 per type, each type split in halves ``<type>-dev`` (tune on it) and ``<type>-heldout`` (don't).

The types are the benchmark's, not the product's: every answer is checkable against the passages, and
the questions come from templates over facts the passages state literally (the same facts
``make_devset.py`` reads), never from what an agent happens to answer well.

  yesno       "Is the capital of X Y?"  /  "Was the 1968 film "X" directed by Y?"       gold "yes" / "no"
              Half true, half false; a false one names a real entity of the same kind (another country's
              capital, another film's director) that X's passage does not mention.
  comparison  "Which was founded earlier, X or Y?"  /  "Which came out first, the novel "X" or the film "Y"?"
              /  "Which city has the larger population, X or Y?"                  gold: one of the two names
              Both numbers are literally in their passages; the gold name is first in half the rows, second
              in the other half; populations differ by at least ``MIN_POPULATION_RATIO`` (census years differ).
  numeric     "In which year was X founded?"  /  "In which year was the novel "X" published?"
              /  "What is the population of X?"               gold: the year or figure as the passage writes it
              (a figure also without its thousands separators)

Rows have the fields of ``devset_wiki.jsonl`` (``id``, ``question``, ``answer``, ``source_title``,
``source_titles``, ``hops``, ``split``) plus ``type``. ``source_titles`` are the passages a reader needs
(two for a comparison; ``source_title`` is the gold one's); no passage is asked about by two rows, so
learning on one split never sees another split's passages. Within each recipe the split alternates dev /
heldout, and the gold (yes/no, first/second) alternates in pairs, so each half is balanced. Deterministic
for a seed: candidates are collected in file order and sampled with ``random.Random``.

Run:  python bench/make_typed_devset.py [--seed 0] [--out bench/devset_types.jsonl]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.make_devset import _VERBS, _WORK, country_capital, display_title, wiki_entries  # noqa: E402

RECIPES = {
    "numeric": {"founded": 4, "released": 10, "population": 10},
    "comparison": {"founded": 8, "released": 8, "population": 8},
    "yesno": {"capital": 12, "work": 12},
}
"""Rows per (type, recipe); every count is a multiple of 2 (comparison and yes/no: of 4) so the halves match.
Sampled in this order (the scarcest facts first), each passage used once."""
TYPES = ("yesno", "comparison", "numeric")
"""The order of the rows in the file."""
MIN_POPULATION_RATIO = 1.5
"""A population comparison's larger figure over its smaller: two censuses of different years must not flip it."""

_FOUNDED = r"^(?:It|The \w+|{name}) (?:was|is|were) (?:\w+ )?(?:founded|established|formed|incorporated)\b[^.]{{0,60}}?\bin (\d{{4}})\b"
_FIGURE = re.compile(r"\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)? (?:million|billion)")
_POPULATION = re.compile(r"\bpopulation of (?:about |approximately |around |over |more than |roughly )?(\d{1,3}(?:,\d{3})+)\b")
_CITY = re.compile(r"(?:Capital|City|Largest city|Metropolis|Most populous)\b")
_RELEASE_VERBS = {"film": "released", "novel": "published", "novella": "published", "book": "published",
                  "poem": "published"}


# ---- facts the passages state literally ----------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    """One fact a passage states."""

    title: str
    """The passage's title."""
    name: str
    """The entity as a question names it (``display_title``)."""
    value: str
    """The year, figure, capital or maker, exactly as the passage writes it."""
    kind: str
    """What the entity is (``film``, ``novel``, ``country``, ``city``; "" when any entity will do)."""
    year: str = ""
    """A work's year from its description ("" if none): it tells two films of the same name apart."""


def founded_fact(entry: dict) -> Fact | None:
    """"It was founded in 1885" (or the entry's own name as subject) → the year."""
    pattern = _FOUNDED.format(name=re.escape(display_title(entry["title"])))
    for sentence in re.split(r"(?<=\.) ", entry["extract"]):
        match = re.search(pattern, sentence)
        if match:
            return Fact(entry["title"], display_title(entry["title"]), match.group(1), "")
    return None


def released_fact(entry: dict) -> Fact | None:
    """A film or book described as "<year> novel by ..." whose passage's first two sentences state the year."""
    match = _WORK.match(entry.get("description") or "")
    if not match or not match.group(1) or match.group(2).lower() not in _RELEASE_VERBS:
        return None
    opening = " ".join(re.split(r"(?<=\.) ", entry["extract"])[:2])
    if not re.search(rf"\b{match.group(1)}\b", opening):
        return None
    return Fact(entry["title"], display_title(entry["title"]), match.group(1), match.group(2).lower())


def population_fact(entry: dict) -> Fact | None:
    """A city whose passage gives one figure, its population ("a population of 1,816,750")."""
    if not _CITY.match(entry.get("description") or ""):
        return None
    match = _POPULATION.search(entry["extract"])
    if not match or len(_FIGURE.findall(entry["extract"])) != 1:
        return None
    return Fact(entry["title"], display_title(entry["title"]), match.group(1), "city")


def capital_fact(entry: dict) -> Fact | None:
    """A country and the capital its passage states."""
    capital = country_capital(entry)
    if capital is None:
        return None
    return Fact(entry["title"], display_title(entry["title"]), capital, "country")


def work_fact(entry: dict) -> Fact | None:
    """A work described as "<year> film by <Name>" whose passage names its maker (not given away by the title)."""
    match = _WORK.match(entry.get("description") or "")
    if not match or match.group(3).strip() not in entry["extract"]:
        return None
    if any(len(word) > 3 and word in entry["title"] for word in match.group(3).split()):
        return None
    return Fact(entry["title"], display_title(entry["title"]), match.group(3).strip(), match.group(2).lower(),
                match.group(1) or "")


FACTS: dict[str, Callable[[dict], Fact | None]] = {
    "founded": founded_fact, "released": released_fact, "population": population_fact,
    "capital": capital_fact, "work": work_fact}


def as_number(value: str) -> float:
    return float(value.replace(",", ""))


# ---- questions from facts ------------------------------------------------------------------------


def numeric_row(recipe: str, fact: Fact) -> dict:
    if recipe == "founded":
        question = f"In which year was {fact.name} founded?"
    elif recipe == "released":
        question = f"In which year was the {fact.kind} \"{fact.name}\" {_RELEASE_VERBS[fact.kind]}?"
    else:
        question = f"What is the population of {fact.name}?"
    answers = [fact.value] + ([fact.value.replace(",", "")] if "," in fact.value else [])
    return _row(question, answers, [fact.title], fact.title)


def comparison_row(recipe: str, first: Fact, second: Fact) -> dict:
    """The gold is the earlier founding or release, or the larger population."""
    if recipe == "population":
        question = f"Which city has the larger population, {first.name} or {second.name}?"
        gold = max((first, second), key=lambda f: as_number(f.value))
    else:
        gold = min((first, second), key=lambda f: as_number(f.value))
        if recipe == "founded":
            question = f"Which was founded earlier, {first.name} or {second.name}?"
        else:
            question = (f"Which came out first, the {first.kind} \"{first.name}\" or the "
                        f"{second.kind} \"{second.name}\"?")
    return _row(question, [gold.name], [first.title, second.title], gold.title)


def yesno_row(recipe: str, fact: Fact, claimed: str) -> dict:
    """``claimed`` is the fact's own value (gold "yes") or another entity's of the same kind (gold "no")."""
    if recipe == "capital":
        question = f"Is the capital of {fact.name} {claimed}?"
    else:
        when = f"{fact.year} " if fact.year else ""
        question = f"Was the {when}{fact.kind} \"{fact.name}\" {_VERBS.get(fact.kind, 'written')} by {claimed}?"
    return _row(question, ["yes" if claimed == fact.value else "no"], [fact.title], fact.title)


def _row(question: str, answers: list[str], titles: list[str], source: str) -> dict:
    return {"question": question, "answer": answers, "source_title": source, "source_titles": titles,
            "hops": len(titles)}


# ---- sampling ------------------------------------------------------------------------------------


def sample_rows(kind: str, recipe: str, count: int, pool: list[Fact], used: set[str], rng: random.Random,
                passages: dict[str, str]) -> list[dict]:
    """``count`` rows of one recipe from facts whose passages are not ``used`` (they are added to it).
    Row ``n``'s gold alternates in pairs (``n // 2``): yes/no, or the gold name first/second."""
    fresh = [fact for fact in pool if fact.title not in used]
    rows: list[dict] = []
    if kind == "numeric":
        rows = [numeric_row(recipe, fact) for fact in rng.sample(fresh, count)]
    elif kind == "comparison":
        rows = [_compare(recipe, pair, n) for n, pair in enumerate(_pairs(recipe, fresh, count, rng))]
    else:
        facts = rng.sample(fresh, count)
        rows = [yesno_row(recipe, fact, _claim(fact, pool, n, rng, passages)) for n, fact in enumerate(facts)]
    used.update(title for row in rows for title in row["source_titles"])
    return rows


def _pairs(recipe: str, fresh: list[Fact], count: int, rng: random.Random) -> list[tuple[Fact, Fact]]:
    """``count`` disjoint pairs whose values differ (populations by ``MIN_POPULATION_RATIO``)."""
    order = rng.sample(fresh, len(fresh))
    pairs: list[tuple[Fact, Fact]] = []
    while order and len(pairs) < count:
        first = order.pop(0)
        partner = next((f for f in order if _comparable(recipe, first, f)), None)
        if partner is not None:
            order.remove(partner)
            pairs.append((first, partner))
    if len(pairs) < count:
        raise SystemExit(f"{recipe}: only {len(pairs)} comparable pairs for {count} rows (another seed?)")
    return pairs


def _comparable(recipe: str, a: Fact, b: Fact) -> bool:
    low, high = sorted((as_number(a.value), as_number(b.value)))
    return high >= MIN_POPULATION_RATIO * low if recipe == "population" else low != high


def _compare(recipe: str, pair: tuple[Fact, Fact], n: int) -> dict:
    """The gold name first when ``n // 2`` is even, second when odd."""
    first, second = pair
    row = comparison_row(recipe, first, second)
    if (row["source_title"] == first.title) != ((n // 2) % 2 == 0):
        row = comparison_row(recipe, second, first)
    return row


def _claim(fact: Fact, pool: list[Fact], n: int, rng: random.Random, passages: dict[str, str]) -> str:
    """The fact's value for a "yes" row (``n // 2`` even); else another same-kind fact's value, not in the passage."""
    if (n // 2) % 2 == 0:
        return fact.value
    others = sorted({other.value for other in pool if other.kind == fact.kind
                     and other.value != fact.value and other.value not in passages[fact.title]})
    return rng.choice(others)


def make_typed_devset(seed: int) -> list[dict]:
    entries = list(wiki_entries().values())
    passages = {entry["title"]: entry["extract"] for entry in entries}
    pools = {recipe: [fact for fact in map(extract, entries) if fact is not None] for recipe, extract in FACTS.items()}
    rng = random.Random(seed)
    used: set[str] = set()
    rows = []
    for kind, recipes in RECIPES.items():
        for recipe, count in recipes.items():
            made = sample_rows(kind, recipe, count, pools[recipe], used, rng, passages)
            rows += [{"id": f"{kind}-{recipe}-{n:02d}", **row, "split": f"{kind}-{'dev' if n % 2 == 0 else 'heldout'}",
                      "type": kind} for n, row in enumerate(made)]
    return sorted(rows, key=lambda row: TYPES.index(row["type"]))  # stable: each recipe's rows stay in order


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).with_name("devset_types.jsonl")))
    args = parser.parse_args()
    rows = make_typed_devset(args.seed)
    with open(args.out, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    splits = sorted({row["split"] for row in rows})
    print(f"wrote {len(rows)} questions ({', '.join(splits)}) to {args.out}")


if __name__ == "__main__":
    main()
