"""How well the retrieved passages support an answer to a question, by string rules alone (no model
call): the closed-book choice (``answer_choice.py``) and the evidence-grounded judge read it.

    relevance(passage)  weighted share of the question's key terms the passage contains; names
                        (capitalised or quoted words, numbers) weigh twice
    claims(answer)      what the answer asserts beyond the question: each run of names or numbers
                        less the question's words, else its other content words; of the kind the
                        question asks for (a year, a nationality) when its form says
    support(answer)     the best relevance of a passage holding most of one of its claims
    is_degenerate       empty, "The answer is:" with nothing after it, a refusal or a hedge ("not
                        specified", "the passage"), only the question's words, or nothing of the kind
                        the question asks for
    salvage(answer)     a hedged answer as its best supported claim, when one is supported

A passage about the question's subject that states the answer supports it; an unrelated passage that
happens to hold a name does not, which is the case where retrieval should not override the model
(Mallen et al., 2023, "When Not to Trust Language Models").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .answer_match import normalize_answer

STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below between
both but by can could did do does doing down during each few for from further had has have having he her here
hers him his how i if in into is it its itself just me more most my no nor not of off on once only or other our
out over own same she should so some such than that the their them then there these they this those through to
too under until up very was we were what when where which while who whom whose why will with would you your
name named called known answer question located one
""".split())
"""Words that carry no topic: left out of a question's key terms and of an answer's claims."""
NAME_WEIGHT = 2.0
"""Weight of a name-like key term (capitalised, quoted, or a number) against 1 for
another content word: the subject's name is what tells a relevant passage from a neighbour."""
_DOC_LINE = re.compile(r"^Doc \d+\(Title: (.*?)\) ", re.MULTILINE)
_QUOTED = re.compile(r"[\"“”«»]([^\"“”«»]+)[\"“”«»]")
_WORD = re.compile(r"[\w'’\-]+", re.UNICODE)
_HEDGE = re.compile(
    r"\b(not (explicitly |directly |clearly )?(specified|mentioned|stated|provided|given|known|available|found|clear|"
    r"possible|sure|certain)|no (information|answer|mention|data|record)|does ?n[o']t (say|mention|specify|state|"
    r"provide|contain)|can ?not (be )?(determined|answered|found|find|say)|i (do ?n[o']t|cannot|can ?t) know|"
    r"unable to|the (original |given )?(question|passages?|text))\b|^\W*(unknown|none|n/?a)\W*$",
    re.IGNORECASE)
"""A refusal, a hedge or talk about the question or the passages: such an answer says nothing by itself,
though a name in it may still be the answer (``salvage``)."""
EXPECTED: tuple[tuple[re.Pattern[str], re.Pattern[str]], ...] = (
    (re.compile(r"\b(which|what) year\b|^\s*when\b", re.IGNORECASE), re.compile(r"\b\d{3,4}\b")),
    (re.compile(r"\bnationality\b", re.IGNORECASE),
     re.compile(r"\b[A-Z][a-z]+(ish|ese|ian|an|ch|ic|i)\b")),
)
"""(question form, what its answer must contain): a year question wants a year, a nationality question
a demonym ("English", "Japanese", "Russian", "Dutch"); an answer without one answers something else."""
_ANSWER_PREFIX = re.compile(r"^\s*(the )?(final )?answer\b( is)?\s*[:\-–]?\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Passage:
    """One retrieved passage: its title and its normalised words."""

    title: str
    words: frozenset[str]


@dataclass(frozen=True)
class QuestionTerms:
    """A question's key terms and their weights (``relevance`` divides by their sum)."""

    weights: dict[str, float]
    words: frozenset[str]
    """Every normalised word of the question (an answer's claims leave them out)."""
    is_choice: bool
    """The question offers alternatives ("X or Y"), so an answer may repeat its words."""
    expects: re.Pattern[str] | None = None
    """What an answer to it must contain (``EXPECTED``), None when the question's form does not say."""

    @classmethod
    def of(cls, question: str) -> QuestionTerms:
        names = set(_names(question))
        weights: dict[str, float] = {}
        for word in _words(question):
            if word not in STOPWORDS:
                weights[word] = max(weights.get(word, 0.0), NAME_WEIGHT if word in names else 1.0)
        expects = next((answer for asks, answer in EXPECTED if asks.search(question)), None)
        return cls(weights, frozenset(_words(question)), " or " in f" {question.lower()} ", expects)


def passages_of(evidence: Iterable[str]) -> list[Passage]:
    """The passages of the search results' texts (the ``Doc i(Title: …) text`` lines of
    ``tools/search.py: render_results``); a text without such lines is one passage."""
    passages = []
    for text in evidence:
        starts = [m.start() for m in _DOC_LINE.finditer(text)] or [0]
        for begin, end in zip(starts, [*starts[1:], len(text)]):
            chunk = text[begin:end]
            header = _DOC_LINE.match(chunk)
            title = header.group(1) if header else ""
            body = chunk[header.end():] if header else chunk
            passages.append(Passage(title, frozenset(_words(f"{title} {body}"))))
    return passages


def relevance(passage: Passage, terms: QuestionTerms) -> float:
    """Weighted share in [0, 1] of the question's key terms that the passage contains (0 without terms)."""
    total = sum(terms.weights.values())
    if total == 0:
        return 0.0
    return sum(w for word, w in terms.weights.items() if word in passage.words) / total


class Claim(NamedTuple):
    """One thing an answer asserts: its text as written and its words less the question's."""

    text: str
    words: frozenset[str]


def claims(answer: str, terms: QuestionTerms) -> list[Claim]:
    """What the answer asserts beyond the question, one claim per run of capitalised words or numbers
    ("Jonathan Swift", "1336") less the question's words and stopwords; without such a run, its other
    content words as one claim. A 135M model's answer is often a sentence naming several things, so each
    claim is weighed on its own; when the question's form says what it wants (``EXPECTED``), only the
    claims of that kind count."""
    runs: list[list[str]] = [[]]
    for word in _WORD.findall(answer):
        if word[0].isupper() or word[0].isdigit():
            runs[-1].append(word)
        elif runs[-1]:
            runs.append([])
    named = [Claim(text, _claim_words(text, terms)) for text in (" ".join(run) for run in runs if run)]
    found = [claim for claim in named if claim.words]
    if not found:
        rest = _claim_words(answer, terms)
        found = [Claim(answer, rest)] if rest else []
    return [c for c in found if terms.expects.search(c.text)] if terms.expects is not None else found


def claim_support(claim: Claim, passages: Sequence[Passage], terms: QuestionTerms) -> float:
    """The best relevance of a passage holding most (over half) of the claim's words; 0 when none does."""
    return max((relevance(p, terms) for p in passages if 2 * len(claim.words & p.words) > len(claim.words)),
               default=0.0)


def support(answer: str | None, passages: Sequence[Passage], terms: QuestionTerms) -> float:
    """The best support of one of the answer's claims; 0 for a degenerate answer."""
    if is_degenerate(answer, terms):
        return 0.0
    return max((claim_support(c, passages, terms) for c in claims(_body(answer or ""), terms)), default=0.0)


def salvage(answer: str | None, passages: Sequence[Passage], terms: QuestionTerms, min_support: float) -> str | None:
    """A hedged answer ("Victor Hugo ... is not mentioned in the passage") as its best supported claim
    ("Victor Hugo") when that reaches ``min_support``; any other answer unchanged."""
    if answer is None or not _HEDGE.search(answer):
        return answer
    scored = [(claim_support(c, passages, terms), c.text) for c in claims(_body(answer), terms)]
    best = max(scored, default=(0.0, ""))
    return best[1] if best[0] >= min_support else answer


def is_degenerate(answer: str | None, terms: QuestionTerms) -> bool:
    """An answer that answers nothing: empty once "The answer is:" is cut, a refusal, a hedge or talk
    about the question or the passages, (unless the question offers alternatives) only the question's
    own words, or nothing of the kind the question asks for (a year, a nationality)."""
    if answer is None:
        return True
    body = _body(answer)
    if not normalize_answer(body) or _HEDGE.search(body):
        return True
    if terms.expects is not None and not terms.expects.search(body):
        return True
    return not terms.is_choice and not claims(body, terms)


def _body(answer: str) -> str:
    """The answer without a leading "The answer is:"."""
    return _ANSWER_PREFIX.sub("", answer).strip()


def _claim_words(text: str, terms: QuestionTerms) -> frozenset[str]:
    return frozenset(w for w in _words(text) if w not in terms.words and w not in STOPWORDS
                     and (len(w) > 1 or w.isdigit()))


def _words(text: str) -> list[str]:
    return normalize_answer(text).split()


def _names(text: str) -> list[str]:
    """Normalised words of the text's names: quoted spans, capitalised words, numbers (a question's
    capitalised first word is a stopword: "Who", "In", "The")."""
    found = [w for span in _QUOTED.findall(text) for w in _words(span)]
    for word in _WORD.findall(text):
        if word[0].isdigit() or word[0].isupper():
            found.extend(_words(word))
    return found
