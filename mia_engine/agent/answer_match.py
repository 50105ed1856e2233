"""Normalised string matching of answers: SQuAD-style normalisation, exact and contains match (the
eval's accuracy, the ``match`` grader) and the word sets the evidence rules compare
(``evidence_support.py``).
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans({char: " " for char in string.punctuation + "‘’“”–—"})


def normalize_answer(text: str) -> str:
    """SQuAD-style: lower case, accents and punctuation removed, articles dropped, spaces collapsed."""
    text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode("ascii")
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION))
    return " ".join(text.split())


def exact_match(prediction: str | None, gold_answers: Sequence[str]) -> bool:
    """The normalised prediction equals one normalised gold answer."""
    if not prediction:
        return False
    predicted = normalize_answer(prediction)
    return any(predicted == normalize_answer(gold) for gold in gold_answers if normalize_answer(gold))


def contains_match(prediction: str | None, gold_answers: Sequence[str]) -> bool:
    """One normalised gold answer occurs in the normalised prediction as whole words."""
    if not prediction:
        return False
    predicted = f" {normalize_answer(prediction)} "
    return any(f" {gold} " in predicted for gold in map(normalize_answer, gold_answers) if gold)


def is_match(prediction: str | None, gold_answers: Sequence[str]) -> bool:
    """Exact or contains match: a cheap accuracy proxy; the LLM grader is the paper's metric."""
    return exact_match(prediction, gold_answers) or contains_match(prediction, gold_answers)
