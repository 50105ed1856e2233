"""Batch commands over a dataset, in-process (no HTTP): ``run`` (evaluation) and ``ttl`` (test-time
learning). Both stream questions through the same research loop as the server, ``concurrency`` at a
time, with a progress bar; results are appended to a JSONL file as they finish, so an interrupted run
resumes where it stopped (questions already in the file are skipped)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..agent.answer_match import is_match
from ..agent.loop import ResearchRequest, ResearchResult
from ..config import MIAConfig
from ..base.data import Question, load_dataset, question_image
from .report import pyplot
from ..services import Services, with_services

log = logging.getLogger(__name__)


def done_ids(out: Path) -> set[str]:
    """Ids already in the results file (a torn last line from a kill is ignored)."""
    ids = set()
    if out.is_file():
        for line in out.read_text().splitlines():
            try:
                ids.add(json.loads(line)["id"])
            except (ValueError, KeyError, TypeError):
                continue
    return ids


def research_request(question: Question, rollouts: int, learn: bool, image: Any = None) -> ResearchRequest:
    """A question's request: its answers are the ground truth (supervised judge); a question without
    answers has none, so a learning pass judges it unsupervised (three reviewers and the Area Chair).
    ``image``: the question's decoded image (``data.question_image``)."""
    return ResearchRequest(question.question, question.answers or None, rollouts, learn, question.id, image=image)


def result_row(question: Question, result: ResearchResult, epoch: int) -> dict[str, Any]:
    chosen = result.rollouts[result.chosen]
    return {
        "id": question.id, "epoch": epoch, "question": question.question, "answers": question.answers,
        "prediction": result.answer, "judge_correct": chosen.verdict.is_correct if chosen.verdict else None,
        "judge": chosen.verdict.source if chosen.verdict else None,
        "match": is_match(result.answer, question.answers), "rewards": [r.reward for r in result.rollouts],
        "num_tool_calls": sum(r.trajectory.num_tool_calls for r in result.rollouts), "timings": result.timings,
    }


async def _answer_all(services: Services, questions: list[Question], out: Path, *, concurrency: int,
                      rollouts: int, learn: bool, epoch: int) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(concurrency)
    rows: list[dict[str, Any]] = []
    progress = tqdm(total=len(questions), desc=f"epoch {epoch}" if learn else "questions", unit="q")

    async def one(question: Question) -> None:
        async with gate:
            image = await asyncio.to_thread(question_image, question) if question.image is not None else None
            request = research_request(question, rollouts, learn, image)
            result = await services.agent.agent.research(request)
        row = result_row(question, result, epoch)
        rows.append(row)
        with out.open("a") as sink:
            sink.write(json.dumps(row) + "\n")
        progress.update(1)
        progress.set_postfix(judge_acc=f"{_mean(r['judge_correct'] for r in rows):.3f}")

    try:
        await asyncio.gather(*(one(q) for q in questions))
    finally:
        progress.close()
    return rows


def _mean(values: Any) -> float:
    values = [float(v) for v in values if v is not None]
    return sum(values) / len(values) if values else 0.0


def run(config: MIAConfig, dataset: str, out: Path, *, concurrency: int, rollouts: int, limit: int | None) -> None:
    """Evaluate: answer every question not yet in ``out``; print judge accuracy and string-match accuracy."""
    questions = load_dataset(dataset, limit)
    seen = done_ids(out)
    todo = [q for q in questions if q.id not in seen]
    log.info("%d questions, %d already in %s, %d to run", len(questions), len(seen), out, len(todo))

    async def work(services: Services) -> None:
        await _answer_all(services, todo, out, concurrency=concurrency, rollouts=rollouts, learn=False, epoch=0)

    asyncio.run(with_services(config, work, learns=False))
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    print(f"{len(rows)} questions: judge accuracy {_mean(r['judge_correct'] for r in rows):.3f}, "
          f"answer match {_mean(r['match'] for r in rows):.3f} ({out})")


def ttl(config: MIAConfig, dataset: str, out: Path, *, epochs: int, concurrency: int, rollouts: int,
        limit: int | None, metrics_out: Path, plot: Path | None) -> None:
    """Test-time learning over a dataset: every question learns; per-update metrics go to ``metrics_out``."""
    if plot is not None:
        pyplot()  # a missing plotting extra fails before the epochs run, not after
    questions = load_dataset(dataset, limit)

    async def work(services: Services) -> None:
        with metrics_out.open("a") as sink:
            def on_update(report: Any) -> None:
                services.metrics.record_update(report)
                sink.write(json.dumps(_update_row(report)) + "\n")
                sink.flush()

            services.learner.on_update = on_update
            for epoch in range(epochs):
                rows = await _answer_all(services, questions, out, concurrency=concurrency, rollouts=rollouts,
                                         learn=True, epoch=epoch)
                await services.learner.flush()
                sink.write(json.dumps({"epoch": epoch, "judge_accuracy": _mean(r["judge_correct"] for r in rows),
                                       "match_accuracy": _mean(r["match"] for r in rows), "time": time.time()}) + "\n")
                sink.flush()

    asyncio.run(with_services(config, work))
    if plot is not None:
        plot_metrics(metrics_out, plot)
        print(f"plot: {plot}")
    print(f"metrics: {metrics_out}; results: {out}")


def _update_row(report: Any) -> dict[str, Any]:
    step = report.step
    return {"update": True, "is_published": report.is_published, "reason": report.reason,
            "adapter_version": report.adapter_version, "reward_mean": step.reward_mean, "reward_std": step.reward_std,
            "loss": step.loss, "update_seconds": step.step_seconds, "swap_seconds": report.publish_seconds,
            "sampler_gap_mean": step.sampler_gap_mean, "num_skipped_stale": step.num_skipped_stale,
            "time": time.time()}


def plot_metrics(metrics: Path, out: Path) -> None:
    """Reward per update and accuracy per epoch, as a PNG."""
    plt = pyplot()
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    updates = [r for r in rows if r.get("update")]
    epochs = [r for r in rows if "epoch" in r and "judge_accuracy" in r]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot([r["reward_mean"] for r in updates], marker="o")
    left.set(title="reward (mean per GRPO update)", xlabel="update", ylabel="reward")
    right.plot([r["judge_accuracy"] for r in epochs], marker="o", label="judge")
    right.plot([r["match_accuracy"] for r in epochs], marker="s", label="answer match")
    right.set(title="accuracy per epoch", xlabel="epoch", ylabel="accuracy")
    right.legend()
    fig.tight_layout()
    fig.savefig(out)
