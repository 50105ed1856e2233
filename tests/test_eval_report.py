"""The eval's paired comparison: each measured pass against the reference baseline, question by
question, with an exact sign test (pure logic; the end-to-end run is in test_eval_cli.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mia_engine.evals.report import paired, report, sign_test, table
from mia_engine.evals.results import PassResult, Prediction, summarise


def _pass(mode: str, right: str, epoch: int | None = None, *, is_learning: bool = False) -> PassResult:
    """A pass over questions q0..qN whose i-th answer is right where ``right[i] == "1"``."""
    predictions = [Prediction(f"q{i}", "x", flag == "1", True, 1, 1, 0.1) for i, flag in enumerate(right)]
    return summarise(mode, epoch, predictions, 1.0, is_learning=is_learning)


def test_paired_counts_only_the_questions_the_two_disagree_on() -> None:
    react = _pass("react", "1100110000")
    mia = _pass("mia_g1", "1011101111")
    result = paired(mia, react)
    assert (result.wins, result.losses) == (6, 2)
    assert abs(result.p_value - 74 / 256) < 1e-9  # 2 * P(X >= 6), X ~ Bin(8, 1/2) = 2 * (28 + 8 + 1) / 256
    same = paired(react, react)
    assert (same.wins, same.losses, same.p_value) == (0, 0, 1.0)
    assert paired(_pass("mia_g1", "1" * 10), _pass("react", "0" * 10)).p_value < 0.01


def test_the_table_and_the_json_pair_measured_passes_with_react() -> None:
    results = {"bare": _pass("bare", "0000"), "react": _pass("react", "1100"), "mia_g1": _pass("mia_g1", "1110"),
               "ttl_supervised": [_pass("ttl_supervised", "0000", 1, is_learning=True),
                                  _pass("ttl_supervised", "1111", 1)]}
    lines = table(results).splitlines()
    assert lines[0].split()[-2:] == ["vs", "react"]
    row = {line.split()[0] + (" learn" if "(learn)" in line else ""): line for line in lines[1:]}
    assert row["mia_g1"].endswith("+1 -0 p=1.00") and row["bare"].endswith("+0 -2 p=0.50")
    assert "p=" not in row["react"] and "p=" not in row["ttl_supervised learn"]  # nothing to pair
    assert row["ttl_supervised"].rstrip().endswith("+2 -0 p=0.50")
    doc = report(results, {})
    assert doc["vs"]["reference"] == "react"
    assert doc["vs"]["passes"]["mia_g1"] == {"wins": 1, "losses": 0, "p_value": 1.0}
    assert set(doc["vs"]["passes"]) == {"bare", "mia_g1", "ttl_supervised/1"}


def test_without_react_the_bare_model_is_the_reference_and_alone_nothing_is_paired() -> None:
    doc = report({"bare": _pass("bare", "01"), "mia_g1": _pass("mia_g1", "11")}, {})
    assert doc["vs"]["reference"] == "bare" and doc["vs"]["passes"]["mia_g1"]["wins"] == 1
    alone = {"mia_g1": _pass("mia_g1", "11")}
    assert report(alone, {})["vs"] == {"reference": None, "passes": {}}
    assert "vs" not in table(alone)


def test_the_sign_test_is_scipys_exact_binomial_test_at_one_half() -> None:
    """The eval needs no scipy: the same two-sided p-values as ``scipy.stats.binomtest(k, n, 0.5)``."""
    binomtest = pytest.importorskip("scipy.stats").binomtest
    for num in range(0, 61):
        for wins in range(num + 1):
            expected = binomtest(wins, num, 0.5).pvalue if num else 1.0
            assert sign_test(wins, num - wins) == pytest.approx(expected, rel=1e-12, abs=1e-300)


def test_serving_and_the_eval_table_need_no_matplotlib_and_a_plot_names_the_extra() -> None:
    """The eval's report imports no scipy; serving and the eval run without matplotlib (the ``plot``
    extra), and ``--plot`` without it is one line naming the extra."""
    code = """
import sys
sys.modules["matplotlib"] = None  # as if not installed
from mia_engine.evals import report as eval_report
assert "scipy" not in sys.modules
from mia_engine import serve
from mia_engine.evals import batch, evaluate
print(eval_report.sign_test(6, 2))
eval_report.pyplot()
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stdout.strip() == str(74 / 256), result.stdout + result.stderr
    assert result.stderr.strip().splitlines()[-1] == ("python -m mia_engine: error: --plot needs matplotlib: "
                                                      "pip install 'mia-engine[plot]'")
