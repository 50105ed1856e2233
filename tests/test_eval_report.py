"""The eval's paired comparison: each measured pass against the reference baseline, question by
question, with an exact sign test; TTL's explore and unseen-split passes; the spread over seeds; the
paper's judge (pure logic and a fake engine; the end-to-end run is in test_eval_cli.py)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from mia_engine.agent.loop import NO_ANSWER
from mia_engine.config import load_config
from mia_engine.agent.judge import render_gold
from mia_engine.agent.prompts import GRADER_SYSTEM as SYSTEM
from mia_engine.evals.judge import PaperJudge, judge_role

from mia_engine.evals.report import paired, report, sign_test, table
from mia_engine.evals.results import PassResult, Prediction, summarise
from tests.fakes import RolesByName


def _pass(mode: str, right: str, epoch: int | None = None, *, is_learning: bool = False, split: str = "",
          seed: int = 0, graded: str | None = None) -> PassResult:
    """A pass over questions q0..qN whose i-th answer is right where ``right[i] == "1"`` (and graded A by the
    judge where ``graded[i] == "1"``; not judged without ``graded``)."""
    grades = [None if graded is None else "A" if graded[i] == "1" else "B" for i in range(len(right))]
    predictions = [Prediction(f"q{i}", "x", flag == "1", True, 1, 1, 0.1, grade=grade)
                   for i, (flag, grade) in enumerate(zip(right, grades))]
    return summarise(mode, epoch, predictions, 1.0, is_learning=is_learning, split=split, seed=seed)


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
    passes = [_pass("bare", "0000"), _pass("react", "1100"), _pass("mia_g1", "1110"),
              _pass("ttl_supervised", "0000", 1, is_learning=True), _pass("ttl_supervised", "1111", 1)]
    lines = table(passes).splitlines()
    assert lines[0].split()[-3:] == ["vs", "react", "(match)"] and "judge" not in lines[0]  # nothing judged
    row = {line.split()[0] + (" explore" if "(explore)" in line else ""): line for line in lines[1:]}
    assert row["mia_g1"].endswith("+1 -0 p=1.00") and row["bare"].endswith("+0 -2 p=0.50")
    assert "p=" not in row["react"]
    assert row["ttl_supervised explore"].endswith("+0 -2 p=0.50")  # the paper's TTL number is paired too
    assert row["ttl_supervised"].rstrip().endswith("+2 -0 p=0.50")
    doc = report(passes, {})
    assert doc["vs"]["reference"] == "react"
    assert doc["vs"]["passes"]["mia_g1"] == {"wins": 1, "losses": 0, "p_value": 1.0}
    assert set(doc["vs"]["passes"]) == {"bare", "mia_g1", "ttl_supervised/1", "ttl_supervised/1 explore"}
    # the shape readers of earlier files know: a baseline's pass, a TTL variant's passes, the measured accuracy
    assert doc["passes"]["mia_g1"]["accuracy"] == 0.75 and len(doc["passes"]["ttl_supervised"]) == 2
    assert doc["accuracy"] == {"bare": 0.0, "react": 0.5, "mia_g1": 0.75, "ttl_supervised": {"1": 1.0}}
    assert doc["summary"]["ttl_supervised/1 explore"]["match"]["median"] == 0.0 and doc["other_passes"] == []


def test_a_split_ttl_never_learned_is_paired_with_the_baseline_on_that_split() -> None:
    passes = [_pass("react", "1100", split="dev"), _pass("react", "0000", split="heldout"),
              _pass("ttl_supervised", "1111", 1, is_learning=True, split="dev"),
              _pass("ttl_supervised", "1111", 1, split="dev"), _pass("ttl_supervised", "1000", 1, split="heldout")]
    doc = report(passes, {})
    assert doc["vs"]["passes"]["ttl_supervised/1 @heldout"] == {"wins": 1, "losses": 0, "p_value": 1.0}
    assert doc["vs"]["passes"]["ttl_supervised/1"]["wins"] == 2  # against react on dev, not on heldout
    assert doc["accuracy"]["ttl_supervised"] == {"1": 1.0}  # the learned split's measurement, as before
    assert [p["split"] for p in doc["other_passes"]] == ["heldout"]  # react on heldout
    assert doc["summary"]["ttl_supervised/1 @heldout"]["match"]["median"] == 0.25
    assert any(line.split()[:3] == ["ttl_supervised", "1", "heldout"] for line in table(passes).splitlines())


def test_several_seeds_give_median_min_max_and_a_pairing_per_seed() -> None:
    passes = [_pass("react", "1000", seed=0), _pass("mia_g1", "1100", seed=0),
              _pass("react", "1000", seed=1), _pass("mia_g1", "1111", seed=1),
              _pass("react", "0000", seed=2), _pass("mia_g1", "0000", seed=2)]
    row = next(line for line in table(passes).splitlines() if line.startswith("mia_g1"))
    assert "0.500 (0.000–1.000)" in row and row.endswith("+1 -0 p=1.00; +3 -0 p=0.25; +0 -0 p=1.00")
    doc = report(passes, {})
    assert doc["summary"]["mia_g1"]["match"] == {"median": 0.5, "min": 0.0, "max": 1.0, "per_seed": [0.5, 1.0, 0.0]}
    assert [p["wins"] for p in doc["vs"]["per_seed"]["mia_g1"]] == [1, 3, 0]
    assert doc["passes"]["mia_g1"]["seed"] == 0 and len(doc["other_passes"]) == 4


def test_the_judges_grades_are_a_column_and_the_pairing_follows_the_headline_metric() -> None:
    passes = [_pass("react", "1100", graded="0000"), _pass("mia_g1", "1100", graded="1110")]
    header, _, mia = table(passes, metric="judge").splitlines()
    assert header.split()[3:6] == ["match", "exact", "judge"] and header.endswith("vs react (judge)")
    assert mia.split()[1:4] == ["0.500", "0.000", "0.750"] and mia.endswith("+3 -0 p=0.25")
    assert table(passes).splitlines()[2].endswith("+0 -0 p=1.00")  # by match they are the same
    doc = report(passes, {}, metric="judge")
    assert doc["metric"] == "judge" and doc["summary"]["mia_g1"]["judge"]["median"] == 0.75
    assert [q["grade"] for q in doc["passes"]["mia_g1"]["predictions"]] == ["A", "A", "A", "B"]


class _Grader(RolesByName):
    """Replies with one letter; records each chat it was asked."""

    def __init__(self, reply: str) -> None:
        self.reply, self.chats = reply, []

    async def render_chat(self, model: str, messages: list[dict[str, str]]) -> list[int]:
        self.chats.append((model, messages))
        return [1, 2, 3]

    def max_tokens_for(self, model: str, prompt_len: int, requested: int | None) -> int:
        return 100

    async def generate(self, model, prompt_ids, options, request_id, *, stream):
        yield [SimpleNamespace(index=0, text=self.reply, token_ids=[1], content=None, logprobs=None)]


async def test_the_paper_judge_sends_the_references_prompt_on_the_chosen_role() -> None:
    config = load_config("tiny")
    client = _Grader(" a ")
    judge = PaperJudge(client, config, judge_role(config, "manager"))
    assert await judge.grade("Who wrote Emma?", ["Jane Austen"], "Austen") == "A"
    ((model, messages),) = client.chats
    assert model == config.agent.roles.manager
    assert messages[0] == {"role": "system", "content": SYSTEM}
    assert "Barack Obama has two daughters" in messages[1]["content"]  # the worked examples, verbatim
    assert messages[1]["content"].endswith('Question: Who wrote Emma?\nGold target: Jane Austen\n'
                                           'Predicted answer: Austen\n‘‘‘\nGrade the predicted answer of this new '
                                           'question as one of:\nA: CORRECT\nB: INCORRECT\nC: NOT_ATTEMPTED\n\n'
                                           'Just return the letters "A", "B", or "C", with no text around it.')
    assert await judge.grade("Q?", ["x"], NO_ANSWER) == "C" and len(client.chats) == 1  # nothing attempted: no call
    assert await PaperJudge(_Grader("maybe"), config, "manager").grade("Q?", ["x"], "y") == "C"  # as the reference
    assert render_gold(["1,816,750", "1816750"]) == "['1,816,750', '1816750']"
    assert judge_role(config, "judge") == config.agent.roles.judge
    with pytest.raises(SystemExit, match="--judge-role boss: not a loop role"):
        judge_role(config, "boss")


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
