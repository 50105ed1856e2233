"""``eval``: answer quality of the config users get, on the same questions, in one process.

Modes (each a pass over the questions, ``concurrency`` at a time, with a progress bar):

    bare              the model alone: the ``manager`` role asked directly, no tools
    react             the Executor alone with search: no memory, no Planner (plain ReAct)
    mia_g1            the research loop with G = 1 (the low-latency path), empty memory
    mia_g4            the research loop with G = 4 (the Router picks), empty memory
    ttl_supervised    epochs 1..E of test-time learning with the gold answers (G = agent.num_rollouts),
                      each followed by a measuring pass with G = 1
    ttl_unsupervised  the same without answers: the judge is the 3 reviewers + the Area Chair

The four baselines share one set of services on a fresh data dir (none of them learns or writes
memory); each TTL variant gets its own fresh data dir, so it starts from an empty memory store and
the original Planner adapter. The passage index and the model cache are shared. Accuracy is
``is_match`` of the returned answer against the gold answers; an answer is *found* unless it is the
loop's "No answer was found." fallback.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from tqdm import tqdm

from . import report as eval_report
from ..agent.answer_choice import ask_closed_book
from ..agent.answer_match import is_match
from ..agent.loop import NO_ANSWER, ResearchRequest, ResearchResult
from ..config import MIAConfig
from ..base.data import (NAMED_DATASETS, Question, load_dataset, named_dataset_path, question_image, read_rows,
                   row_question)
from .results import BASELINES, MODES, TTL_MODES, PassResult, Prediction, summarise

if TYPE_CHECKING:  # the services (vLLM) load only when a pass runs: ``--help`` stays fast
    from ..services import Services

log = logging.getLogger(__name__)


Answer = Callable[[Question], Awaitable[Prediction]]


async def run_pass(questions: list[Question], answer: Answer, *, concurrency: int,
                   desc: str) -> tuple[list[Prediction], float]:
    """Every question through ``answer``, ``concurrency`` at a time; (predictions in question order, wall s)."""
    gate = asyncio.Semaphore(concurrency)
    progress = tqdm(total=len(questions), desc=desc, unit="q")
    found = 0

    async def one(question: Question) -> Prediction:
        nonlocal found
        async with gate:
            prediction = await answer(question)
        found += prediction.is_match
        progress.update(1)
        progress.set_postfix(acc=f"{found / progress.n:.3f}")
        return prediction

    start = time.perf_counter()
    try:
        predictions = await asyncio.gather(*(one(q) for q in questions))
    finally:
        progress.close()
    return list(predictions), time.perf_counter() - start


# ---- the ways of answering ------------------------------------------------------------------------


def bare_answer(services: Services) -> Answer:
    """The ``manager`` role asked directly: the research loop's closed-book request (``ask_closed_book``)."""

    async def answer(question: Question) -> Prediction:
        start = time.perf_counter()
        completion = await ask_closed_book(services.roles, services.config.agent, question.question)
        text, num_tokens = (completion.text.strip(), len(completion.token_ids)) if completion else ("", 0)
        return _prediction(question, text or NO_ANSWER, 0, num_tokens, time.perf_counter() - start)

    return answer


def research_answer(services: Services, make_request: Callable[[Question], ResearchRequest]) -> Answer:
    """One research query per question, the request built by ``make_request``."""
    executor = services.config.agent.roles.executor

    async def answer(question: Question) -> Prediction:
        start = time.perf_counter()
        request = make_request(question)
        if question.image is not None:
            request = msgspec.structs.replace(request, image=await asyncio.to_thread(question_image, question))
        result = await services.agent.agent.research(request)
        num_tokens = await _generated_tokens(services, executor, result)
        num_tool_calls = sum(r.trajectory.num_tool_calls for r in result.rollouts)
        verdict = result.rollouts[result.chosen].verdict
        return _prediction(question, result.answer, num_tool_calls, num_tokens, time.perf_counter() - start,
                           verdict.source if verdict is not None else None)

    return answer


def baseline_request(mode: str) -> Callable[[Question], ResearchRequest]:
    """The request of a research baseline: nothing learns, no ground truth (no judge)."""
    if mode == "react":
        return lambda q: ResearchRequest(q.question, None, 1, False, q.id, use_memory=False, use_planner=False)
    rollouts = {"mia_g1": 1, "mia_g4": 4}[mode]
    return lambda q: ResearchRequest(q.question, None, rollouts, False, q.id)


def learning_request(mode: str, rollouts: int) -> Callable[[Question], ResearchRequest]:
    """A TTL pass's request: supervised with the gold answers, unsupervised with none."""
    if mode == "ttl_supervised":
        return lambda q: ResearchRequest(q.question, list(q.answers), rollouts, True, q.id)
    return lambda q: ResearchRequest(q.question, None, rollouts, True, q.id)


def _prediction(question: Question, text: str, num_tool_calls: int, num_tokens: int, seconds: float,
                judge: str | None = None) -> Prediction:
    return Prediction(question.id, text, is_match(text, question.answers), text.strip() != NO_ANSWER,
                      num_tool_calls, num_tokens, seconds, judge)


async def _generated_tokens(services: Services, executor: str, result: ResearchResult) -> int:
    agent = services.config.agent
    total = 0
    for rollout in result.rollouts:
        trajectory = rollout.trajectory
        planner_texts = [rollout.plan, trajectory.reflection, trajectory.replan]
        executor_texts = [turn.raw for turn in trajectory.turns]  # a turn the loop wrote has raw ""
        if agent.answer_from == "evidence":
            executor_texts.append(trajectory.first_answer or "")
        for role, texts in ((agent.roles.planner, planner_texts), (executor, executor_texts)):
            for text in filter(None, texts):
                total += len(await services.roles.role(role).encode(text))
    return total


# ---- the passes, each on its own services --------------------------------------------------------


async def baselines(services: Services, questions: list[Question], modes: list[str],
                    concurrency: int) -> dict[str, PassResult]:
    results = {}
    for mode in (m for m in BASELINES if m in modes):
        answer = bare_answer(services) if mode == "bare" else research_answer(services, baseline_request(mode))
        predictions, wall = await run_pass(questions, answer, concurrency=concurrency, desc=mode)
        results[mode] = summarise(mode, None, predictions, wall)
        log.info("%s: accuracy %.3f", mode, results[mode].accuracy)
    return results


async def ttl_epochs(services: Services, questions: list[Question], mode: str, *, epochs: int,
                     rollouts: int, concurrency: int) -> list[PassResult]:
    """For each epoch: a learning pass (then the learner's queue drains), then a G = 1 measuring pass."""
    published: list[bool] = []
    record = services.learner.on_update

    def on_update(report: Any) -> None:
        published.append(bool(report.is_published))
        if record is not None:
            record(report)

    services.learner.on_update = on_update
    learn = research_answer(services, learning_request(mode, rollouts))
    measure = research_answer(services, baseline_request("mia_g1"))
    passes = []
    for epoch in range(1, epochs + 1):
        before = len(published)
        predictions, wall = await run_pass(questions, learn, concurrency=concurrency, desc=f"{mode} learn {epoch}")
        await services.learner.flush()
        passes.append(summarise(mode, epoch, predictions, wall, is_learning=True,
                                num_updates=sum(published[before:])))
        predictions, wall = await run_pass(questions, measure, concurrency=concurrency, desc=f"{mode} eval {epoch}")
        passes.append(summarise(mode, epoch, predictions, wall))
        log.info("%s epoch %d: accuracy %.3f", mode, epoch, passes[-1].accuracy)
    return passes


def fresh_config(config: MIAConfig, root: Path, name: str) -> MIAConfig:
    """``config`` on an empty data dir of its own; the passage index stays where the user's config keeps it."""
    index_dir = config.tools.index_dir or str(config.resolved_data_dir() / "tools" / "index")
    tools = msgspec.structs.replace(config.tools, index_dir=index_dir)
    return msgspec.structs.replace(config, data_dir=str(root / name), tools=tools)


async def evaluate(config: MIAConfig, questions: list[Question], modes: list[str], *, epochs: int,
                   concurrency: int) -> dict[str, Any]:
    """Every mode's passes, as {mode: PassResult} for baselines and {mode: [PassResult, ...]} for TTL."""
    from ..services import with_services  # loads the services (vLLM): only when a pass runs

    root = Path(tempfile.mkdtemp(prefix="mia-eval-"))
    results: dict[str, Any] = {}
    rollouts = config.agent.num_rollouts
    try:
        if any(m in BASELINES for m in modes):
            results.update(await with_services(fresh_config(config, root, "baselines"),
                                               lambda s: baselines(s, questions, modes, concurrency)))
        for mode in (m for m in TTL_MODES if m in modes):
            results[mode] = await with_services(
                fresh_config(config, root, mode),
                lambda s, mode=mode: ttl_epochs(s, questions, mode, epochs=epochs, rollouts=rollouts,
                                                concurrency=concurrency))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


# ---- the command -----------------------------------------------------------------------------------


class EvalOptions(msgspec.Struct, frozen=True):
    """The ``eval`` command's arguments (the config itself comes from ``--config`` and its overrides)."""

    dataset: str
    out: Path
    plot: Path | None
    split: str = "all"
    """``dev`` / ``heldout``: only rows whose ``split`` field says so; ``all``: every row."""
    limit: int | None = None
    epochs: int = 3
    modes: tuple[str, ...] = MODES
    concurrency: int = 8


def select_questions(dataset: str, split: str, limit: int | None) -> list[Question]:
    """The dataset's questions with gold answers, in file order, of one split, the first ``limit``."""
    questions = load_dataset(dataset)
    if split != "all":
        path = named_dataset_path(dataset) if dataset in NAMED_DATASETS else Path(dataset)
        rows = [row for row in read_rows(path) if isinstance(row, dict)]
        if not any("split" in row for row in rows):
            raise SystemExit(f"python -m mia_engine: error: --split {split}: {dataset} has no 'split' field")
        splits = sorted({str(row["split"]) for row in rows if "split" in row})
        if split not in splits:
            raise SystemExit(f"python -m mia_engine: error: --split {split}: {dataset} has the splits "
                             f"{', '.join(splits)} (or all)")
        ids = {q.id for i, row in enumerate(rows) if row.get("split") == split
               for q in [row_question(row, i)] if q is not None}
        questions = [q for q in questions if q.id in ids]
    answered = [q for q in questions if q.answers]
    if len(answered) < len(questions):
        log.warning("%d questions without answers are left out (accuracy needs them)", len(questions) - len(answered))
    if not answered:
        raise SystemExit(f"python -m mia_engine: error: {dataset}: no questions with answers (split {split})")
    return answered[:limit] if limit is not None else answered


def main(config: MIAConfig, config_name: str, overrides: dict[str, Any], options: EvalOptions) -> dict[str, Any]:
    """Run every mode, print the table, write the JSON (and the plot); the JSON document is returned."""
    if options.plot is not None:
        eval_report.pyplot()  # a missing plotting extra fails before the passes run, not after
    questions = select_questions(options.dataset, options.split, options.limit)
    log.info("eval: %d questions, modes %s, config %s %s", len(questions), ", ".join(options.modes), config_name,
             overrides or "(no overrides)")
    start = time.time()
    results = asyncio.run(evaluate(config, questions, list(options.modes), epochs=options.epochs,
                                   concurrency=options.concurrency))
    run = {"config": config_name, "overrides": overrides, "dataset": options.dataset, "split": options.split,
           "num_questions": len(questions), "question_ids": [q.id for q in questions],
           "gold": {q.id: q.answers for q in questions}, "modes": list(options.modes), "epochs": options.epochs,
           "ttl_rollouts": config.agent.num_rollouts, "concurrency": options.concurrency,
           "started_at": start, "wall_seconds": time.time() - start}
    document = eval_report.report(results, run)
    eval_report.write_json(document, options.out)
    print(eval_report.table(results))
    print(f"results: {options.out}")
    if options.plot is not None:
        eval_report.plot(results, options.plot, title=f"{config_name}: {len(questions)} questions ({options.split})")
        print(f"plot: {options.plot}")
    return document
