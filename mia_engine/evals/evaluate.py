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
``is_match`` of the returned answer against the gold answers (and ``exact_match`` beside it); with
``--metric judge`` the paper's LLM judge grades every answer too (``judge.py``). An answer is *found*
unless it is the loop's "No answer was found." fallback.

Test-time learning is reported twice over, per epoch: the learning pass itself (*explore*: per question
the answer the Router's plan returned while the loop learned on it, the paper's Alg. 3 and how the
paper reports TTL) and G = 1 passes after it, on the same questions (*remeasure*: with memory replay
this measures recall of what was learned) and, with ``--ttl-eval-split``, on a split it never learned
from (the baselines run on that split too, so each pass is paired on the same questions).
``--seeds N`` repeats everything N times (run i adds i to every seed of the config).
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
from ..agent.answer_match import exact_match, is_match
from ..agent.loop import NO_ANSWER, ResearchRequest, ResearchResult
from ..config import MIAConfig
from ..base.data import (NAMED_DATASETS, Question, load_dataset, named_dataset_path, question_image, read_rows,
                   row_question)
from .judge import PaperJudge, judge_role
from .results import BASELINES, METRICS, MODES, TTL_MODES, PassResult, Prediction, summarise

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


async def graded(questions: list[Question], predictions: list[Prediction], judge: PaperJudge | None, *,
                 concurrency: int) -> list[Prediction]:
    """The predictions with the paper's judge's grade on each (unchanged without a judge), graded after
    the pass so that its timings are the answering's alone."""
    if judge is None:
        return predictions
    gate = asyncio.Semaphore(concurrency)

    async def one(question: Question, prediction: Prediction) -> Prediction:
        async with gate:
            grade = await judge.grade(question.question, question.answers, prediction.prediction)
        return msgspec.structs.replace(prediction, grade=grade)

    return list(await asyncio.gather(*(one(q, p) for q, p in zip(questions, predictions))))


def _prediction(question: Question, text: str, num_tool_calls: int, num_tokens: int, seconds: float,
                judge: str | None = None) -> Prediction:
    return Prediction(question.id, text, is_match(text, question.answers), text.strip() != NO_ANSWER,
                      num_tool_calls, num_tokens, seconds, judge, exact_match(text, question.answers))


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


class QuestionSet(msgspec.Struct, frozen=True):
    """One split's questions."""

    split: str
    questions: list[Question]


class Run(msgspec.Struct, frozen=True):
    """What one of the ``--seeds`` runs answers, and how its answers are graded."""

    learned: QuestionSet
    """The baselines' questions, which test-time learning learns from."""
    unseen: QuestionSet | None = None
    """``--ttl-eval-split``: questions TTL never learns from, measured after each epoch (and by the baselines)."""
    judge_role: str | None = None
    """The role the paper's judge runs on (``--metric judge``); None: not judged."""
    seed: int = 0


def _judge(services: Services, run: Run) -> PaperJudge | None:
    return None if run.judge_role is None else PaperJudge(services.roles, services.config, run.judge_role)


async def measure(services: Services, run: Run, questions: QuestionSet, mode: str, answer: Answer,
                  concurrency: int, epoch: int | None = None) -> PassResult:
    """One measuring pass (no learning), graded when the run has a judge."""
    desc = mode if epoch is None else f"{mode} eval {epoch}"
    predictions, wall = await run_pass(questions.questions, answer, concurrency=concurrency,
                                       desc=f"{desc} ({questions.split})")
    predictions = await graded(questions.questions, predictions, _judge(services, run), concurrency=concurrency)
    return summarise(mode, epoch, predictions, wall, split=questions.split, seed=run.seed)


async def baselines(services: Services, run: Run, modes: list[str], concurrency: int) -> list[PassResult]:
    """Every baseline mode on the learned questions, then on the unseen ones."""
    results = []
    for questions in filter(None, (run.learned, run.unseen)):
        for mode in (m for m in BASELINES if m in modes):
            answer = bare_answer(services) if mode == "bare" else research_answer(services, baseline_request(mode))
            results.append(await measure(services, run, questions, mode, answer, concurrency))
            log.info("%s (%s): accuracy %.3f", mode, questions.split, results[-1].accuracy)
    return results


async def ttl_epochs(services: Services, run: Run, mode: str, *, epochs: int, rollouts: int,
                     concurrency: int) -> list[PassResult]:
    """For each epoch: a learning pass (explore; then the learner's queue drains), then G = 1 passes on the
    learned questions and on the unseen ones."""
    published: list[bool] = []
    record = services.learner.on_update

    def on_update(report: Any) -> None:
        published.append(bool(report.is_published))
        if record is not None:
            record(report)

    services.learner.on_update = on_update
    learn = research_answer(services, learning_request(mode, rollouts))
    measured = research_answer(services, baseline_request("mia_g1"))
    passes = []
    for epoch in range(1, epochs + 1):
        before = len(published)
        predictions, wall = await run_pass(run.learned.questions, learn, concurrency=concurrency,
                                           desc=f"{mode} learn {epoch}")
        await services.learner.flush()
        predictions = await graded(run.learned.questions, predictions, _judge(services, run), concurrency=concurrency)
        explore = summarise(mode, epoch, predictions, wall, is_learning=True, num_updates=sum(published[before:]),
                            split=run.learned.split, seed=run.seed)
        after = [await measure(services, run, questions, mode, measured, concurrency, epoch)
                 for questions in filter(None, (run.learned, run.unseen))]
        passes += [explore, *after]
        log.info("%s epoch %d: explore %.3f, then %s", mode, epoch, explore.accuracy,
                 ", ".join(f"{p.split} {p.accuracy:.3f}" for p in after))
    return passes


def fresh_config(config: MIAConfig, root: Path, name: str) -> MIAConfig:
    """``config`` on an empty data dir of its own; the passage index stays where the user's config keeps it."""
    index_dir = config.tools.index_dir or str(config.resolved_data_dir() / "tools" / "index")
    tools = msgspec.structs.replace(config.tools, index_dir=index_dir)
    return msgspec.structs.replace(config, data_dir=str(root / name), tools=tools)


async def evaluate(config: MIAConfig, run: Run, modes: list[str], *, epochs: int,
                   concurrency: int) -> list[PassResult]:
    """Every mode's passes: the baselines (on one set of services), then each TTL variant's (each on its own)."""
    from ..services import with_services  # loads the services (vLLM): only when a pass runs

    root = Path(tempfile.mkdtemp(prefix="mia-eval-"))
    results: list[PassResult] = []
    rollouts = config.agent.num_rollouts
    try:
        if any(m in BASELINES for m in modes):
            results += await with_services(fresh_config(config, root, "baselines"),
                                           lambda s: baselines(s, run, modes, concurrency), learns=False)
        for mode in (m for m in TTL_MODES if m in modes):
            results += await with_services(
                fresh_config(config, root, mode),
                lambda s, mode=mode: ttl_epochs(s, run, mode, epochs=epochs, rollouts=rollouts,
                                                concurrency=concurrency))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


def seeded(config: MIAConfig, offset: int) -> MIAConfig:
    """``config`` with ``offset`` added to every seed: each engine's sampler, the loop's RNG, the learner's."""
    if offset == 0:
        return config
    engines = {name: msgspec.structs.replace(engine, seed=(engine.seed or 0) + offset)
               for name, engine in config.engines.items()}
    return msgspec.structs.replace(
        config, engines=engines, agent=msgspec.structs.replace(config.agent, seed=config.agent.seed + offset),
        learner=msgspec.structs.replace(config.learner, seed=config.learner.seed + offset))


# ---- the command -----------------------------------------------------------------------------------


class EvalOptions(msgspec.Struct, frozen=True):
    """The ``eval`` command's arguments (the config itself comes from ``--config`` and its overrides)."""

    dataset: str
    out: Path
    plot: Path | None
    split: str = "all"
    """Only rows whose ``split`` field says so (``dev``, ``heldout``, ``yesno-dev``, ...); ``all``: every row."""
    limit: int | None = None
    epochs: int = 3
    modes: tuple[str, ...] = MODES
    concurrency: int = 8
    metric: str = "match"
    """The headline metric (table, pairing, plot): ``match``, ``exact`` or ``judge`` (the paper's LLM judge
    grades every answer; match and exact are recorded beside it whatever this is)."""
    judge_role: str = "manager"
    """Who grades with ``--metric judge``: a loop role (``agent.roles``: the Manager by default, the paper's
    judge LLM) or a role id of the config."""
    ttl_eval_split: str | None = None
    """A split TTL never learns from, measured after each epoch beside the learned one (None: none)."""
    seeds: int = 1
    """Runs of everything, run i with i added to every seed; the table gives median (min–max)."""

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise SystemExit(f"python -m mia_engine: error: --metric {self.metric}: choose from {', '.join(METRICS)}")
        if self.seeds < 1:
            raise SystemExit(f"python -m mia_engine: error: --seeds {self.seeds}: must be >= 1")
        if self.ttl_eval_split is not None and self.ttl_eval_split == self.split:
            raise SystemExit(f"python -m mia_engine: error: --ttl-eval-split {self.ttl_eval_split}: "
                             "the split learned from (--split); name another")


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


def question_sets(options: EvalOptions) -> tuple[QuestionSet, QuestionSet | None]:
    """The learned split's questions and the unseen split's (``--ttl-eval-split``), which share none."""
    learned = QuestionSet(options.split, select_questions(options.dataset, options.split, options.limit))
    if options.ttl_eval_split is None:
        return learned, None
    unseen = QuestionSet(options.ttl_eval_split, select_questions(options.dataset, options.ttl_eval_split,
                                                                   options.limit))
    shared = {q.id for q in learned.questions} & {q.id for q in unseen.questions}
    if shared:
        raise SystemExit(f"python -m mia_engine: error: --ttl-eval-split {unseen.split}: {len(shared)} of its "
                         f"questions are in --split {learned.split} too")
    return learned, unseen


def main(config: MIAConfig, config_name: str, overrides: dict[str, Any], options: EvalOptions) -> dict[str, Any]:
    """Run every mode (``seeds`` times), print the table, write the JSON (and the plot); the JSON is returned."""
    if options.plot is not None:
        eval_report.pyplot()  # a missing plotting extra fails before the passes run, not after
    learned, unseen = question_sets(options)
    role = judge_role(config, options.judge_role) if options.metric == "judge" else None
    log.info("eval: %d questions, modes %s, config %s %s", len(learned.questions), ", ".join(options.modes),
             config_name, overrides or "(no overrides)")
    start = time.time()
    passes: list[PassResult] = []
    for seed in range(options.seeds):
        run = Run(learned, unseen, role, seed)
        passes += asyncio.run(evaluate(seeded(config, seed), run, list(options.modes), epochs=options.epochs,
                                       concurrency=options.concurrency))
    everything = learned.questions + (unseen.questions if unseen else [])
    document = eval_report.report(passes, {
        "config": config_name, "overrides": overrides, "dataset": options.dataset, "split": options.split,
        "ttl_eval_split": options.ttl_eval_split, "num_questions": len(learned.questions),
        "question_ids": [q.id for q in learned.questions],
        "unseen_question_ids": [q.id for q in unseen.questions] if unseen else [],
        "gold": {q.id: q.answers for q in everything}, "modes": list(options.modes), "epochs": options.epochs,
        "ttl_rollouts": config.agent.num_rollouts, "concurrency": options.concurrency, "seeds": options.seeds,
        "judge_role": role, "started_at": start, "wall_seconds": time.time() - start}, metric=options.metric)
    eval_report.write_json(document, options.out)
    print(eval_report.table(passes, metric=options.metric))
    print(f"results: {options.out}")
    if options.plot is not None:
        title = f"{config_name}: {len(learned.questions)} questions ({options.split})"
        eval_report.plot(passes, options.plot, title=title, metric=options.metric)
        print(f"plot: {options.plot}")
    return document
