"""Whether the retrieved passages state an answer, by string evidence alone (no model call), in any script:
the grounded judge (``judge.py: GroundedJudge``) reads it. The answer choice does not (it reads the model's
confidence in its closed-book answer, ``answer_choice.py``), so the judge checks the chosen answer with a
signal of its own.

    features(text)          character trigrams of the text's normalised tokens (``answer_match.tokens``),
                            a shorter token itself; character bigrams in a script written without
                            spaces (Han, kana, Thai, ...)
    weights(...)            each feature's inverse document frequency over windows of the retrieved
                            passages (plus the question and the answer as one window each)
    relevance(passage)      weighted share of the question's features the passage holds
    coverage(passage)       weighted share of the answer's words the passage holds (a word held when half
                            its features are), the features the question already holds left out (all of
                            them when nothing is left: the answer names one of the question's alternatives)
    grounding(answer)       the best relevance × coverage of one passage: a passage about the question's
                            subject that states the answer

It is the lexical-overlap test of textual entailment (Jijkoun & de Rijke, 2005, "Recognizing Textual
Entailment Using Lexical Similarity"; Glickman et al., 2005): the question and the answer as the
hypothesis, a passage as the text, each term weighted by its IDF (Spärck Jones, 1972) computed over the
passages themselves, so frequent words ("the", "of", "located" where every window holds it) weigh little in
any language without a stopword list. Character n-grams instead of words match inflected forms ("Толстой",
"Толстого") and need no word boundaries (McNamee & Mayfield, 2004, "Character N-Gram Tokenization for
European Language Text Retrieval"). Lexical overlap cannot check an answer the passages never write
("yes", "no", a number spelled out in words): such an answer is not grounded.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .answer_match import is_unspaced, tokens

NGRAM = 3
"""Characters per feature. McNamee & Mayfield (2004) find 4- to 5-grams best for retrieving whole documents;
answers are a word or two, and trigrams leave a short name enough features while a changed ending (an
inflection) still leaves most of a word's trigrams in place."""
WINDOW_TOKENS = 16
"""Tokens per window over which a feature's document frequency is counted: about a clause, so a word every
clause holds (a function word) has a low weight, and a name a few clauses hold a high one."""
_DOC_LINE = re.compile(r"^Doc \d+\(Title: (.*?)\) ", re.MULTILINE)


@dataclass(frozen=True)
class Passage:
    """One retrieved passage: its title and the normalised tokens of its title and body."""

    title: str
    tokens: tuple[str, ...]

    @property
    def features(self) -> frozenset[str]:
        return features(self.tokens)


def passages_of(evidence: Iterable[str]) -> list[Passage]:
    """The distinct passages of the search results' texts (the ``Doc i(Title: …) text`` lines of
    ``tools/search.py: render_results``; a text without such lines is one passage), in order: a passage two
    searches returned is one document, so repeats do not lower its words' weights."""
    passages: list[Passage] = []
    for text in evidence:
        starts = [m.start() for m in _DOC_LINE.finditer(text)] or [0]
        for begin, end in zip(starts, [*starts[1:], len(text)]):
            chunk = text[begin:end]
            header = _DOC_LINE.match(chunk)
            title = header.group(1) if header else ""
            body = chunk[header.end():] if header else chunk
            passage = Passage(title, tuple(tokens(f"{title} {body}")))
            if passage not in passages:
                passages.append(passage)
    return passages


def units(words: Iterable[str]) -> list[frozenset[str]]:
    """The features of each word: a token's character trigrams, padded with a space each side (a shorter
    token is itself); a run of unspaced-script tokens (one character each) is one word, its features the
    character bigrams of the run (most words of such scripts are two characters long; a run of one is
    itself)."""
    found: list[frozenset[str]] = []
    run: list[str] = []
    for word in [*words, ""]:
        if len(word) == 1 and is_unspaced(word):
            run.append(word)
            continue
        if run:
            found.append(frozenset("".join(run[i:i + 2]) for i in range(max(len(run) - 1, 1))))
            run = []
        if 0 < len(word) < NGRAM:
            found.append(frozenset([word]))
        elif word:
            padded = f" {word} "
            found.append(frozenset(padded[i:i + NGRAM] for i in range(len(padded) - NGRAM + 1)))
    return found


def features(words: Iterable[str]) -> frozenset[str]:
    """Every feature of the words (``units``)."""
    return frozenset().union(*units(words))


def weights(passages: Sequence[Passage], *texts: frozenset[str]) -> dict[str, float]:
    """IDF of every feature, log(1 + N / df), over the passages' windows of ``WINDOW_TOKENS`` tokens and
    ``texts`` (each one window), so every feature of ``texts`` has df >= 1."""
    windows = [features(p.tokens[i:i + WINDOW_TOKENS]) for p in passages
               for i in range(0, max(len(p.tokens), 1), WINDOW_TOKENS)]
    windows.extend(texts)
    df = Counter(feature for window in windows for feature in window)
    return {feature: math.log(1 + len(windows) / count) for feature, count in df.items()}


def _share(wanted: frozenset[str], held: frozenset[str], weight: dict[str, float]) -> float:
    total = sum(weight[f] for f in wanted)
    return sum(weight[f] for f in wanted & held) / total if total > 0 else 0.0


def _coverage(claim: Sequence[frozenset[str]], held: frozenset[str], weight: dict[str, float]) -> float:
    """Weighted share of the claim's words the passage holds, a word held when at least half its features
    are (an inflected form still is), weighing the sum of its features' weights."""
    totals = [sum(weight[f] for f in word) for word in claim]
    found = sum(total for word, total in zip(claim, totals) if 2 * len(word & held) >= len(word))
    return found / sum(totals) if sum(totals) > 0 else 0.0


@dataclass(frozen=True)
class Grounding:
    """How well the best passage states an answer: ``score`` = its ``relevance`` × ``coverage``."""

    score: float
    relevance: float
    coverage: float
    title: str


def grounding(question: str, answer: str | None, passages: Sequence[Passage]) -> Grounding:
    """The passage that best states ``answer`` to ``question`` (the module docstring's measure); a zero
    score for an empty answer or without passages."""
    asked, words = features(tokens(question)), units(tokens(answer or ""))
    claim = [word - asked for word in words if word - asked] or words
    if not claim or not passages:
        return Grounding(0.0, 0.0, 0.0, "")
    weight = weights(passages, asked, frozenset().union(*words))
    best = Grounding(0.0, 0.0, 0.0, "")
    for passage in passages:
        held = passage.features
        relevance, coverage = _share(asked, held, weight), _coverage(claim, held, weight)
        if relevance * coverage > best.score:
            best = Grounding(relevance * coverage, relevance, coverage, passage.title)
    return best
