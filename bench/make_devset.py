"""Generate ``bench/devset_wiki.jsonl``: 40 single-hop questions answerable from one wiki-offline passage.

Three recipes, each keeping only entries whose answer appears literally in the passage text, so a
reader of the retrieved passage can extract it:
  work     description "<year> film|novel|painting|... by <Name>"  → "Who directed the 1968 film X?"
  founded  "It (or X) was founded/established ... in <year>"      → "In which year was X founded?"
  capital  "Its capital (and largest city) is <Name>" in the text  → "What is the capital of X?"
Deterministic for a seed: candidates are collected in file order and sampled with ``random.Random``.

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


def candidates(entries: list[dict], recipe: str) -> Iterator[dict]:
    for entry in entries:
        made = RECIPES[recipe](entry)
        if made is not None:
            question, answer = made
            yield {"question": question, "answer": [answer], "source_title": entry["title"]}


def make_devset(seed: int) -> list[dict]:
    entries = list(json.loads(wiki_offline_path().read_bytes()).values())
    rng = random.Random(seed)
    rows = []
    for recipe, count in PER_RECIPE.items():
        pool = list(candidates(entries, recipe))
        for n, row in enumerate(rng.sample(pool, count)):
            rows.append({"id": f"wiki-{recipe}-{n:02d}", **row})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).with_name("devset_wiki.jsonl")))
    args = parser.parse_args()
    rows = make_devset(args.seed)
    with open(args.out, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} questions to {args.out}")


if __name__ == "__main__":
    main()
