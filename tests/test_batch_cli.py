"""``run`` (resumable evaluation) and ``ttl`` (test-time learning) on the tiny model, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DEVSET = Path(__file__).resolve().parent.parent / "bench" / "devset_wiki.jsonl"


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MIA_HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, "-m", "mia_engine", *args, "--config", "tiny",
                           "--data-dir", str(tmp_path / "data")], capture_output=True, text=True, env=env,
                          timeout=600)


@pytest.mark.slow
def test_run_is_resumable_and_reports_accuracy(tmp_path: Path) -> None:
    """A results file holding the first question (an earlier, interrupted run's) is resumed: that row is kept
    as it was and only the second question runs (one engine start: a second run would cost one more), with
    no test-time learner started."""
    out = tmp_path / "results.jsonl"
    first_id = json.loads(DEVSET.read_text().splitlines()[0])["id"]
    earlier = {"id": first_id, "prediction": "from the earlier run", "judge_correct": False, "match": False}
    out.write_text(json.dumps(earlier) + "\n")
    result = _cli(tmp_path, "run", "--dataset", str(DEVSET), "--out", str(out), "--limit", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and rows[0] == earlier, rows  # the first was skipped, not run again
    assert rows[1]["id"] != first_id and rows[1]["prediction"] and rows[1]["judge_correct"] in (True, False)
    assert "judge accuracy" in result.stdout
    # an evaluation learns nothing: no learner (a process importing torch and peft, a copy of the Planner)
    assert "test-time learning off: nothing here learns" in result.stderr
    assert "test-time learner ready" not in result.stderr, result.stderr[-3000:]


@pytest.mark.slow
def test_ttl_writes_metrics_and_a_plot_and_judges_unanswered_questions_without_gold(tmp_path: Path) -> None:
    """Two questions with answers, then two without (a dataset may mix them): the first are judged
    against their answers, the others by the reviewers and the Area Chair; one run, one engine start."""
    rows_in = [json.loads(line) for line in DEVSET.read_text().splitlines()[:4]]
    dataset = tmp_path / "mixed.jsonl"
    dataset.write_text("".join(json.dumps(row if i < 2 else {"id": row["id"], "question": row["question"]}) + "\n"
                               for i, row in enumerate(rows_in)))
    metrics, plot, out = tmp_path / "metrics.jsonl", tmp_path / "curves.png", tmp_path / "r.jsonl"
    result = _cli(tmp_path, "ttl", "--dataset", str(dataset), "--out", str(out), "--limit", "4",
                  "--metrics-out", str(metrics), "--plot", str(plot))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    updates = [r for r in rows if r.get("update")]
    assert len(updates) == 2  # 4 questions, learner.batch_size = 2
    assert all({"reward_mean", "loss", "update_seconds", "swap_seconds", "adapter_version"} <= set(u) for u in updates)
    assert any("judge_accuracy" in r for r in rows)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert len(results) == 4
    for i, row in enumerate(rows_in):
        judged = results[row["id"]]
        if i < 2:
            assert judged["answers"] == row["answer"] and judged["judge"] == "supervised", judged
        else:
            assert judged["answers"] == [] and judged["judge"] == "unsupervised", judged


def test_bad_dataset_is_a_one_line_error(tmp_path: Path) -> None:
    result = _cli(tmp_path, "run", "--dataset", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o.jsonl"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"python -m mia_engine: error: --dataset: no such file: "
                                                  f"{tmp_path / 'missing.jsonl'}"]


def test_a_question_without_answers_is_judged_unsupervised() -> None:
    from mia_engine.evals.batch import research_request
    from mia_engine.base.data import Question, row_question

    unanswered = row_question({"id": "q", "question": "Who?"}, 0)
    assert unanswered is not None and unanswered.answers == []
    request = research_request(unanswered, 4, True)
    assert request.ground_truth is None and request.learn and request.num_rollouts == 4  # the reviewers + Area Chair
    answered = research_request(Question("a", "Who?", ["Ann"]), 1, False)
    assert answered.ground_truth == ["Ann"] and not answered.learn  # supervised against the answers
