"""Generate ``bench/devset_popularity.jsonl``: single-hop questions over the wiki-offline passages in two
splits, "popular" (subjects the corpus mentions most: the model likely knows them) and "longtail"
(subjects it mentions least: the model likely doesn't), 32 each, for "MIA >= bare on popular" and
"MIA >= ReAct on the long tail" (Mallen et al. 2023, "When Not to Trust Language Models").

Popularity is decided without running any model, so selecting questions cannot depend on what the model
answers. Mallen et al. rank subjects by Wikipedia page views; the corpus has none, so the proxy is the
subject's in-links inside the corpus: ``popularity`` = the number of OTHER passages whose text mentions
the subject by name (``display_title``, case-sensitive, as whole words), because page views and in-links
both measure how much the rest of the encyclopedia talks about a subject. Ties are broken by the subject passage's
length, longer first (longer leads go with more-written-about subjects), then by title.

Recipes, all single-hop with the answer literally in the subject's passage:
  capital, founded  the recipes of ``make_devset`` (capital also takes ``make_devset.country_capital``,
                    which finds the capital of more countries than the single-hop pattern does)
  country           a place described "City in Turkey" (``make_devset``'s place pattern) whose passage
                    names the country, which has a country passage → "In which country is Gaziantep?"
The work recipe is left out: the passages are one-paragraph summaries that almost never name a novel or
film outside its own passage (Les Misérables and The Godfather have no in-links), so the proxy cannot
rank works; people are left out because every person in this corpus (Wikipedia's vital articles) is
famous and their surnames collide with common words, so their in-links rank noise.
Ranking is within each recipe and each split takes ``PER_SPLIT[recipe]`` rows from its end
(the top for "popular", the bottom for "longtail"), so both splits hold the same mix of recipes and a
difference in scores between them is one of popularity, not of question kind. Every question of
``devset_wiki.jsonl``'s "dev" split is left out, by id, by question text and by passage (two-hop bridges
included): the team tunes on it.
Deterministic: no sampling, the ranking decides.

Run:  python bench/make_popularity_sets.py [--out bench/devset_popularity.jsonl]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench import make_devset  # noqa: E402

PER_SPLIT = {"capital": 15, "country": 15, "founded": 2}
"""Rows per recipe in each split (32 in all); founded has few candidates (14, half of them in dev)."""
DEVSET = Path(__file__).with_name("devset_wiki.jsonl")
"""The dev set whose "dev" split is excluded here."""
_EDGE = "\"'()[],.;:!?“”‘’"
_WITH_ARTICLE = {"River", "Range", "Canal", "Mountains", "Desert", "Peninsula", "Sea", "Islands", "Strip"}


def country_question(entry: dict, countries: set[str]) -> tuple[str, str] | None:
    """The country a place is in, from its description, when its passage names that country."""
    match = make_devset._PLACE.match(entry.get("description") or "")
    country = match.group(1) if match else None
    if country not in countries or country in entry["title"]:
        return None
    if not re.search(rf"\b{re.escape(country)}\b", entry["extract"]):
        return None
    return f"In which country is {the(make_devset.display_title(entry['title']))}?", country


def the(name: str) -> str:
    """``Murray River`` → ``the Murray River``: a feature named by its kind takes the article."""
    return f"the {name}" if name.split()[-1] in _WITH_ARTICLE else name


def capital_question(entry: dict) -> tuple[str, str] | None:
    """The single-hop capital recipe, else the capital a country's passage states another way."""
    made = make_devset.capital_question(entry)
    if made is not None:
        return made
    capital = make_devset.country_capital(entry)
    return (f"What is the capital of {make_devset.display_title(entry['title'])}?", capital) if capital else None


def whole_answer(entry: dict, answer: str) -> bool:
    """Whether ``answer`` occurs as a whole name, not only as the start of a longer one ("Port" of
    "Port of Spain": the capital patterns stop at "of")."""
    return re.search(rf"\b{re.escape(answer)}\b(?! of [A-Z]| [A-Z])", entry["extract"]) is not None


def recipes(entries: list[dict]) -> dict[str, Callable[[dict], tuple[str, str] | None]]:
    """Recipe name → entry → (question, answer) or None."""
    countries = {entry["title"] for entry in entries if make_devset._COUNTRY.match(entry.get("description") or "")}
    return {"capital": capital_question, "country": partial(country_question, countries=countries),
            "founded": make_devset.founded_question}


def in_links(entries: list[dict]) -> Counter[str]:
    """Title → the number of other passages whose text mentions its display name."""
    titles_by_name: dict[str, set[str]] = {}
    for entry in entries:
        titles_by_name.setdefault(make_devset.display_title(entry["title"]), set()).add(entry["title"])
    prefixes = {" ".join(name.split()[:n]) for name in titles_by_name for n in range(1, len(name.split()))}
    counts: Counter[str] = Counter()
    for entry in entries:
        mentioned = set()
        for name in _mentioned(entry["extract"], titles_by_name, prefixes):
            mentioned |= titles_by_name[name] - {entry["title"]}
        counts.update(mentioned)
    return counts


def _mentioned(text: str, names: dict[str, set[str]], prefixes: set[str]) -> set[str]:
    """The names that occur in ``text`` as a run of whole words (edge punctuation and "'s" stripped)."""
    words = text.split()
    found = set()
    for start in range(len(words)):
        for end in range(start + 1, len(words) + 1):
            phrase = " ".join(words[start:end]).lstrip(_EDGE)
            stripped = phrase.rstrip(_EDGE)
            for candidate in (phrase, stripped, re.sub(r"['’]s$", "", stripped)):
                if candidate in names:
                    found.add(candidate)
            if phrase not in prefixes:
                break
    return found


def candidates(entries: list[dict], recipe: Callable[[dict], tuple[str, str] | None],
               popularity: Counter[str]) -> Iterator[dict]:
    for entry in entries:
        made = recipe(entry)
        if made is not None and whole_answer(entry, made[1]):
            question, answer = made
            yield {"question": question, "answer": [answer], "source_title": entry["title"],
                   "source_titles": [entry["title"]], "hops": 1,
                   "popularity": popularity[entry["title"]],
                   "_length": len(entry["extract"])}


def dev_rows(path: Path = DEVSET) -> list[dict]:
    """The rows of the dev set's "dev" split."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [row for row in rows if row["split"] == "dev"]


def make_popularity_sets(devset: Path = DEVSET) -> list[dict]:
    entries = list(make_devset.wiki_entries().values())
    popularity = in_links(entries)
    dev = dev_rows(devset)
    dev_ids = {row["id"] for row in dev}
    dev_texts = {row["question"] for row in dev}
    dev_titles = {title for row in dev for title in row["source_titles"]}
    made = recipes(entries)
    rows = []
    for recipe, count in PER_SPLIT.items():
        pool = [row for row in candidates(entries, made[recipe], popularity)
                if row["question"] not in dev_texts and row["source_title"] not in dev_titles]
        pool.sort(key=lambda row: (-row["popularity"], -row["_length"], row["source_title"]))
        if len(pool) < 2 * count:
            raise ValueError(f"PER_SPLIT[{recipe!r}] = {count} but only {len(pool)} questions for both splits")
        for split, picked in (("popular", pool[:count]), ("longtail", pool[::-1][:count])):
            rows += _numbered(recipe, split, picked, dev_ids)
    return rows


def _numbered(recipe: str, split: str, rows: list[dict], dev_ids: set[str]) -> list[dict]:
    """Ids ``<split>-<recipe>-NN`` in ranking order (most popular first in "popular", least in "longtail")."""
    numbered = []
    for n, row in enumerate(rows):
        row_id = f"{split}-{recipe}-{n:02d}"
        assert row_id not in dev_ids  # the prefixes differ from the dev set's "wiki-"
        fields = {key: value for key, value in row.items() if not key.startswith("_")}
        numbered.append({"id": row_id, **fields, "split": split})
    return numbered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).with_name("devset_popularity.jsonl")))
    args = parser.parse_args()
    rows = make_popularity_sets()
    with open(args.out, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    for split in ("popular", "longtail"):
        values = [row["popularity"] for row in rows if row["split"] == split]
        print(f"{split}: {len(values)} questions, popularity {min(values)}..{max(values)}")
    print(f"wrote {len(rows)} questions to {args.out}")


if __name__ == "__main__":
    main()
