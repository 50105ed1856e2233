"""bench/calibrate_choice.py's picks on hand-made dev records (no model): the threshold that maximises the
choice's accuracy, the statistic that does better, and the judge's threshold that agrees best with gold."""

from __future__ import annotations

import math

from bench import calibrate_choice

HUGO = "Doc 1(Title: Les Misérables) Les Misérables is an 1862 novel by the French writer Victor Hugo."


def _record(closed_book: str, logprobs: list[float], own: str, gold: str, split: str = "dev") -> dict:
    return {"id": closed_book, "split": split, "question": 'Who wrote the 1862 novel "Les Misérables"?',
            "gold": [gold], "closed_book": closed_book, "logprobs": logprobs, "own": own, "evidence": [HUGO],
            "closed_book_match": closed_book == gold, "own_match": own == gold}


RECORDS = [
    _record("Victor Hugo", [-0.6, -0.6], "Claude Monet", "Victor Hugo"),             # fairly sure, right: closed book
    _record("Jules Verne", [-0.01, -0.01, -0.01, -2.0], "Victor Hugo", "Victor Hugo"),  # one unsure token: own
    _record("Émile Zola", [-3.0], "Victor Hugo", "Victor Hugo", "yesno-dev"),          # unsure: own
    _record("yes", [-2.0], "", "yes", "yesno-dev"),                                     # own empty: closed book
]


def test_the_pick_maximises_dev_accuracy_and_prefers_the_statistic_that_separates() -> None:
    picked = calibrate_choice.pick(RECORDS)
    assert picked["accuracy"]["chosen"] == 1.0 and picked["accuracy"]["evidence_only"] == 0.5
    assert picked["closed_book_confidence"] == "min"  # Verne's mean (-0.51) is above Hugo's (-0.6): no mean threshold
    assert -2.0 < picked["closed_book_min_logprob"] <= -0.6
    assert picked["by_statistic"]["mean"]["accuracy"] == 0.75
    assert picked["accuracy"]["chosen_yesno-dev"] == 1.0
    assert 0.0 <= picked["min_grounding"] <= 1.0 and picked["judge"]["num_answers"] == 7


def test_best_threshold_takes_the_middle_of_a_tie() -> None:
    threshold, score = calibrate_choice.best_threshold([0.0, 1.0, 2.0, 3.0], lambda t: float(0.5 < t < 2.5))
    assert (threshold, score) == (1.5, 1.0)
    assert calibrate_choice.best_threshold([-math.inf], lambda t: 1.0) == (0.0, 1.0)
