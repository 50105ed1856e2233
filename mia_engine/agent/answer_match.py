"""Normalised string matching of answers, in any script: SQuAD-style exact and contains match (the eval's
accuracy, the ``match`` grader) and the tokens the grounded judge compares (``evidence_support.py``).

Normalisation follows the SQuAD evaluation script (Rajpurkar et al., 2016) made Unicode-aware as MLQA's
multilingual version of it does (Lewis et al., 2020, ``mlqa_evaluation_v1.py``): Unicode compatibility
forms folded (NFKC: full-width "２" is 2) and case folded, decimal digits of every script as ASCII digits,
combining marks dropped (accents, as SQuAD strips them), every
punctuation or symbol character (Unicode categories P* and S*) a space, and a text in a script written
without spaces between words (Han, kana, Thai, ...) split into one token per character (MLQA's "mixed
segmentation"), so a gold answer is found inside such a text without word boundaries.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
"""The English articles SQuAD's metric drops; part of the metric's definition (answers "The Beatles" and
"Beatles" match), not a rule of the answer choice."""
UNSPACED_SCRIPTS = frozenset({"CJK", "HIRAGANA", "KATAKANA", "IDEOGRAPHIC", "THAI", "LAO", "KHMER", "MYANMAR",
                              "TIBETAN", "BOPOMOFO", "YI"})
"""First word of the Unicode character names of the scripts written without spaces between words (UAX #14
line-break classes ID, and SA "complex context"): each of their characters is one token."""


def is_unspaced(char: str) -> bool:
    """The character is of a script written without spaces between words (``UNSPACED_SCRIPTS``)."""
    return unicodedata.name(char, "").split(" ", 1)[0] in UNSPACED_SCRIPTS


def _fold(char: str) -> str:
    """One character as a token: a space for punctuation and symbols, a decimal digit of any script as its
    ASCII digit (Arabic-Indic "٢" is 2), spaced when its script is unspaced."""
    category = unicodedata.category(char)
    if category[0] in "PSZC":
        return " "
    if category == "Nd":
        return str(unicodedata.decimal(char))
    return f" {char} " if is_unspaced(char) else char


def normalize_answer(text: str) -> str:
    """``text`` as the metric compares it: its ``tokens``, SQuAD's English articles dropped, space-separated."""
    return " ".join(_ARTICLES.sub(" ", " ".join(tokens(text))).split())


def tokens(text: str) -> list[str]:
    """The normalised tokens of ``text``: NFKC, case folded, combining marks dropped, punctuation and symbols
    spaced out, digits in ASCII, each character of an unspaced script its own token (words elsewhere). No
    word of any language is dropped (the grounded judge weighs frequent words down by their IDF instead)."""
    text = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", str(text)).casefold())
    text = unicodedata.normalize("NFC", "".join(c for c in text if unicodedata.category(c) != "Mn"))
    return "".join(map(_fold, text)).split()


def exact_match(prediction: str | None, gold_answers: Sequence[str]) -> bool:
    """The normalised prediction equals one normalised gold answer."""
    if not prediction:
        return False
    predicted = normalize_answer(prediction)
    return any(predicted == normalize_answer(gold) for gold in gold_answers if normalize_answer(gold))


def contains_match(prediction: str | None, gold_answers: Sequence[str]) -> bool:
    """One normalised gold answer occurs in the normalised prediction as whole tokens (a run of characters
    in an unspaced script: their tokens are characters)."""
    if not prediction:
        return False
    predicted = f" {normalize_answer(prediction)} "
    return any(f" {gold} " in predicted for gold in map(normalize_answer, gold_answers) if gold)


def is_match(prediction: str | None, gold_answers: Sequence[str]) -> bool:
    """Exact or contains match: a cheap accuracy proxy; the LLM grader is the paper's metric."""
    return exact_match(prediction, gold_answers) or contains_match(prediction, gold_answers)
