"""How well the retrieved passages support an answer to a question, by string rules alone (no model
call): the closed-book choice (``answer_choice.py``) and the evidence-grounded judge read it.

    relevance(passage)  weighted share of the question's key terms the passage contains; names
                        (capitalised or quoted words, numbers) weigh twice
    claims(answer)      what the answer asserts beyond the question: each run of names or numbers
                        less the question's words, else its other content words
    support(answer)     the best relevance of a passage holding (half of) one of its claims
    is_degenerate       empty, "The answer is:" with nothing after it, "not specified / mentioned",
                        a refusal, an answer that only repeats the question's words, or one without
                        what the question asks for (a year, a nationality)

A passage about the question's subject that states the answer supports it; an unrelated passage that
happens to hold a name does not, which is the case where retrieval should not override the model
(Mallen et al., 2023, "When Not to Trust Language Models").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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
_DEGENERATE = re.compile(
    r"\b(not (explicitly |directly |clearly )?(specified|mentioned|stated|provided|given|known|available|found|clear|"
    r"possible|sure|certain)|no (information|answer|mention|data|record)|does ?n[o']t (say|mention|specify|state|"
    r"provide|contain)|can ?not (be )?(determined|answered|found|find|say)|i (do ?n[o']t|cannot|can ?t) know|"
    r"unable to)\b|^\W*(unknown|none|n/?a)\W*$", re.IGNORECASE)
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


def claims(answer: str, terms: QuestionTerms) -> list[frozenset[str]]:
    """What the answer asserts beyond the question, one word set per claim: each run of capitalised
    words or numbers ("Jonathan Swift", "1336") less the question's words and stopwords; without such
    a run, its other content words as one claim. A 135M model's answer is often a sentence naming
    several things, so each claim is weighed on its own."""
    runs: list[list[str]] = [[]]
    for word in _WORD.findall(answer):
        if word[0].isupper() or word[0].isdigit():
            runs[-1].append(word)
        elif runs[-1]:
            runs.append([])
    named = [_claim(" ".join(run), terms) for run in runs if run]
    found = [claim for claim in named if claim]
    if found:
        return found
    rest = _claim(answer, terms)
    return [rest] if rest else []


def support(answer: str | None, passages: Sequence[Passage], terms: QuestionTerms) -> float:
    """The best relevance of a passage holding at least half the words of one of the answer's claims; 0
    for a degenerate answer or when no passage holds any."""
    if answer is None or is_degenerate(answer, terms):
        return 0.0
    return max((relevance(p, terms) for claim in claims(answer, terms) for p in passages
                if 2 * len(claim & p.words) >= len(claim)), default=0.0)


def is_degenerate(answer: str | None, terms: QuestionTerms) -> bool:
    """An answer that answers nothing: empty once "The answer is:" is cut, a refusal or "not
    specified", (unless the question offers alternatives) only the question's own words, or nothing of
    the kind the question asks for (a year, a nationality)."""
    if answer is None:
        return True
    body = _ANSWER_PREFIX.sub("", answer).strip()
    if not normalize_answer(body) or _DEGENERATE.search(body):
        return True
    if terms.expects is not None and not terms.expects.search(body):
        return True
    return not terms.is_choice and not claims(body, terms)


def _claim(text: str, terms: QuestionTerms) -> frozenset[str]:
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
