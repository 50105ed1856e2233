"""Generate ``bench/devset_wiki.jsonl``: 100 questions whose answers are in the wiki-offline passages,
66 single-hop and 34 two-hop, each half "dev" (tune on it) and half "heldout" (don't).

Single-hop recipes keep only entries whose answer appears literally in the passage text, so a reader
of the retrieved passage can extract it:
  work     description "<year> film|novel|painting|... by <Name>"  → "Who directed the 1968 film X?"
  founded  "It (or X) was founded/established ... in <year>"      → "In which year was X founded?"
  capital  "Its capital (and largest city) is <Name>" in the text  → "What is the capital of X?"
Two-hop recipes need two passages: the first names a bridge entity (literally), whose own passage
holds the answer (literally); the bridge is the second passage's title, the answer is not in the first:
  nationality  work → its author's passage "<Name> was an English novelist"
               → "What nationality was the author of the 1813 novel X?"   (English)
  place        "City in Kazakhstan" → the country's passage "Its capital is Astana"
               → "What is the capital of the country where Almaty is located?"   (Astana)
Rows carry ``source_titles`` (one per hop; ``source_title`` is the one holding the answer), ``hops``
and ``split`` (alternating within each recipe, so both halves hold every recipe). The first 40 rows
are the original set, unchanged; extra single-hop rows come from what those did not sample, and
two-hop rows never reuse a passage a single-hop row asks about. Deterministic for a seed: candidates
are collected in file order and sampled with ``random.Random``.

Run:  python bench/make_devset.py [--seed 0] [--out bench/devset_wiki.jsonl]
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path

from mia_engine.tools.corpus import wiki_offline_path

PER_RECIPE = {"work": 16, "capital": 14, "founded": 10}
"""The original 40 single-hop rows (ids ``wiki-<recipe>-NN``), sampled first so they never change."""
EXTRA_PER_RECIPE = {"work": 22, "founded": 4}
"""More single-hop rows (ids ``wiki-<recipe>-NN`` continuing the numbering), from the unsampled rest."""
TWO_HOP_PER_RECIPE = {"nationality": 12, "place": 22}
_WORK = re.compile(r"^(?:(\d{4}) )?(film|novel|novella|book|short story|poem|play|painting|opera|symphony|album|"
                   r"sculpture) by ([^,;()]+)$", re.IGNORECASE)
_VERBS = {"film": "directed", "painting": "painted", "opera": "composed", "symphony": "composed",
          "album": "recorded", "sculpture": "created"}
_CAPITAL = re.compile(r"[Ii]ts capital(?: and largest city)? is ([A-Z][\w'\-]+(?: [A-Z][\w'\-]+)*)")


def display_title(title: str) -> str:
    """``Jaws (film)`` → ``Jaws``: the disambiguation is Wikipedia's, not part of the name."""
    return re.sub(r" \([^()]*\)$", "", title)


def work_question(entry: dict) -> tuple[str, str] | None:
    match = _WORK.match(entry.get("description") or "")
    if not match or match.group(3).strip() not in entry["extract"]:
        return None
    if any(len(word) > 3 and word in entry["title"] for word in match.group(3).split()):
        return None  # "Symphony No. 9 (Beethoven)": the title gives the answer away
    year, kind, author = match.group(1), match.group(2).lower(), match.group(3).strip()
    verb = _VERBS.get(kind, "wrote")
    when = f"{year} " if year else ""
    return f"Who {verb} the {when}{kind} \"{display_title(entry['title'])}\"?", author


def founded_question(entry: dict) -> tuple[str, str] | None:
    for sentence in re.split(r"(?<=\.) ", entry["extract"]):
        subject = rf"^(?:It|{re.escape(entry['title'])}) was (?:founded|established)\b[^.]{{0,60}}?\bin (\d{{4}})\b"
        match = re.search(subject, sentence)
        if match:
            return f"In which year was {display_title(entry['title'])} founded?", match.group(1)
    return None


def capital_question(entry: dict) -> tuple[str, str] | None:
    match = _CAPITAL.search(entry["extract"])
    if not match or match.group(1) == entry["title"]:
        return None
    return f"What is the capital of {display_title(entry['title'])}?", match.group(1)


RECIPES = {"work": work_question, "founded": founded_question, "capital": capital_question}

# ---- two-hop -------------------------------------------------------------------------------------

_ROLE_NOUNS = {"film": "director", "painting": "painter", "opera": "composer", "symphony": "composer",
               "album": "artist who recorded", "sculpture": "sculptor"}
_NATIONALITY = re.compile(r"^(?:(?! was | is )[^.])*? (?:was|is) (?:an?|the) "
                          r"([A-Z][a-z]+(?:an|ish|ese|ch|ss|ic|i|ek)) [a-z]")
"""The first "was/is a(n)" of the first sentence, then an adjective shaped like a nationality."""
_COUNTRY = re.compile(r"^(?:Country|Island country|Sovereign state|Landlocked country|Transcontinental country)\b")
_COUNTRY_CAPITAL = (
    re.compile(r"\b(?:[Ii]ts|[Tt]he) capital(?: city)?(?: and (?:largest|most populous) city)? is "
               r"([A-Z][\w'\-]+(?: [A-Z][\w'\-]+)*)"),
    re.compile(r"([A-Z][\w'\-]+(?: [A-Z][\w'\-]+)*) is (?:its|the) capital(?: city)?"
               r"(?: and (?:largest|most populous) city)?\b"))
_PLACE = re.compile(r"^(?:[\w\-, ]* )?(?i:city|river|lake|island|mountain range|peninsula|park|province|region|"
                    r"desert|volcano|reservoir|canals?|waterway|temple complex|headland|archipelago|municipality)"
                    r" [\w, ]*?in ([A-Z][\w ]+)$")
MAX_PER_BRIDGE = 4
"""Two-hop rows through one bridge passage (China is the country of many places)."""


def nationality(entry: dict) -> str | None:
    """"Jane Austen was an English novelist" → ``English`` (the first sentence's adjective)."""
    match = _NATIONALITY.match(entry["extract"])
    return match.group(1) if match else None


def country_capital(entry: dict) -> str | None:
    """The capital a country's passage states, for entries described as a country."""
    if not _COUNTRY.match(entry.get("description") or ""):
        return None
    for pattern in _COUNTRY_CAPITAL:
        match = pattern.search(entry["extract"])
        if match and match.group(1) not in (entry["title"], "It", "The"):
            return match.group(1)
    return None


def nationality_question(entry: dict, by_title: dict[str, dict]) -> tuple[str, str, str] | None:
    """(question, answer, bridge title): a work's author, then the author's nationality."""
    made = work_question(entry)
    author_entry = by_title.get(made[1]) if made else None
    answer = nationality(author_entry) if author_entry else None
    if made is None or answer is None or answer in entry["extract"]:
        return None
    match = _WORK.match(entry["description"])
    year, kind = match.group(1), match.group(2).lower()
    role = _ROLE_NOUNS.get(kind, "author")
    when = f"{year} " if year else ""
    return (f"What nationality was the {role} of the {when}{kind} \"{display_title(entry['title'])}\"?",
            answer, made[1])


def place_question(entry: dict, by_title: dict[str, dict]) -> tuple[str, str, str] | None:
    """(question, answer, bridge title): a place's country, then that country's capital."""
    match = _PLACE.match(entry.get("description") or "")
    country = by_title.get(match.group(1)) if match else None
    capital = country_capital(country) if country else None
    if capital is None or capital in entry["extract"] or capital == entry["title"]:
        return None
    if not re.search(rf"\b{re.escape(country['title'])}\b", entry["extract"]):
        return None
    name = display_title(entry["title"])
    return f"What is the capital of the country where {name} is located?", capital, country["title"]


TWO_HOP_RECIPES = {"nationality": nationality_question, "place": place_question}


def candidates(entries: list[dict], recipe: str) -> Iterator[dict]:
    for entry in entries:
        made = RECIPES[recipe](entry)
        if made is not None:
            question, answer = made
            yield {"question": question, "answer": [answer], "source_title": entry["title"],
                   "source_titles": [entry["title"]], "hops": 1}


def two_hop_candidates(entries: list[dict], recipe: str, exclude: set[str]) -> Iterator[dict]:
    """Rows whose passages are not in ``exclude``, at most ``MAX_PER_BRIDGE`` through one bridge."""
    by_title = {entry["title"]: entry for entry in entries}
    per_bridge: dict[str, int] = {}
    for entry in entries:
        made = None if entry["title"] in exclude else TWO_HOP_RECIPES[recipe](entry, by_title)
        if made is not None and made[2] not in exclude and per_bridge.get(made[2], 0) < MAX_PER_BRIDGE:
            question, answer, bridge = made
            per_bridge[bridge] = per_bridge.get(bridge, 0) + 1
            yield {"question": question, "answer": [answer], "source_title": bridge,
                   "source_titles": [entry["title"], bridge], "hops": 2}


def wiki_entries() -> dict[str, dict]:
    """The default corpus's entries by title (``title``, ``description``, ``extract``, ...)."""
    return json.loads(wiki_offline_path().read_bytes())


def make_devset(seed: int) -> list[dict]:
    entries = list(wiki_entries().values())
    rng = random.Random(seed)
    pools = {recipe: list(candidates(entries, recipe)) for recipe in PER_RECIPE}
    picked: dict[str, list[dict]] = {}
    for recipe, count in PER_RECIPE.items():  # first, in this order: the original 40 rows stay the same
        picked[recipe] = rng.sample(pools[recipe], count)
    asked = {row["source_title"] for rows in picked.values() for row in rows}
    for recipe, count in TWO_HOP_PER_RECIPE.items():  # before the extras: two-hop candidates are fewer
        pool = list(two_hop_candidates(entries, recipe, asked))
        picked[recipe] = rng.sample(pool, min(count, len(pool)))  # another seed may leave fewer
    used = asked | {title for recipe in TWO_HOP_PER_RECIPE for row in picked[recipe] for title in row["source_titles"]}
    for recipe, count in EXTRA_PER_RECIPE.items():
        rest = [row for row in pools[recipe] if row["source_title"] not in used]
        picked[recipe] += rng.sample(rest, min(count, len(rest)))
    rows = []
    for recipe in PER_RECIPE:  # the original rows first, then the extras, then the two-hop rows
        rows += _numbered(recipe, picked[recipe][:PER_RECIPE[recipe]], 0)
    for recipe in EXTRA_PER_RECIPE:
        rows += _numbered(recipe, picked[recipe][PER_RECIPE[recipe]:], PER_RECIPE[recipe])
    for recipe in TWO_HOP_PER_RECIPE:
        rows += _numbered(recipe, picked[recipe], 0)
    return rows


def _numbered(recipe: str, rows: list[dict], start: int) -> list[dict]:
    """Ids ``wiki-<recipe>-NN``; the split alternates dev / heldout in sampling order within a recipe."""
    return [{"id": f"wiki-{recipe}-{n:02d}", **row, "split": "dev" if n % 2 == 0 else "heldout"}
            for n, row in enumerate(rows, start)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).with_name("devset_wiki.jsonl")))
    args = parser.parse_args()
    rows = make_devset(args.seed)
    with open(args.out, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    two_hop = sum(row["hops"] == 2 for row in rows)
    dev = sum(row["split"] == "dev" for row in rows)
    print(f"wrote {len(rows)} questions ({two_hop} two-hop; {dev} dev, {len(rows) - dev} heldout) to {args.out}")


if __name__ == "__main__":
    main()
