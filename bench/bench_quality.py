"""Answer quality on a dev set whose answers are in the corpus: the model alone vs the agent, before
and after test-time learning (memory + GRPO), on the embedded default model.

    python bench/bench_quality.py --limit 20 --out bench/results/quality.json

Stages, in one process and one fresh data dir: (1) the bare model (manager role) answers directly;
(2) the agent (G = 1, empty memory) answers; (3) a test-time-learning pass over the same questions
with ground truth (G = 4: judge, rewards, workflow memories, GRPO updates of the Planner); (4) the
agent answers again, now with memory and the updated Planner. Accuracy = normalised answer match
(contains) against the gold answers; the LLM judge's own verdicts are reported beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mia_engine.agent.answer_match import is_match  # noqa: E402
from mia_engine.agent.llm import complete, sampling_options  # noqa: E402
from mia_engine.agent.loop import ResearchRequest  # noqa: E402
from mia_engine.config import load_config  # noqa: E402
from mia_engine.base.data import load_dataset  # noqa: E402
from mia_engine.services import Services  # noqa: E402

# Budgets for a 135M model on 2 CPU cores (the paper's are for 7-32B models on GPUs).
OVERRIDES = {
    "agent.max_turns": 3, "agent.tool_response_max_words": 120, "agent.trace_max_words": 250,
    "agent.sampling.planner": {"temperature": 0.0, "max_tokens": 100},
    "agent.sampling.executor": {"temperature": 0.0, "max_tokens": 200, "presence_penalty": 1.1},
    "agent.sampling.manager": {"temperature": 0.0, "max_tokens": 120},
    "agent.sampling.grader": {"temperature": 0.0, "max_tokens": 4},
    "agent.sampling.router": {"temperature": 0.0, "max_tokens": 16},
    "agent.regex": {"max_think_chars": 200, "max_answer_chars": 200, "max_query_chars": 60, "max_queries": 1},
    "agent.min_tool_calls": 1, "learner.batch_size": 4,
}


async def bare_model(services: Services, questions, gate: asyncio.Semaphore) -> list[str]:
    async def one(q) -> str:
        async with gate:
            messages = [{"role": "user", "content": f"Answer with only the name or number.\nQuestion: {q.question}"}]
            (text,) = await complete(services.roles.role("manager"), messages,
                                     sampling_options(services.config.agent.sampling.manager))
            return text

    return await asyncio.gather(*(one(q) for q in questions))


async def agent_pass(services: Services, questions, gate: asyncio.Semaphore, *, learn: bool, rollouts: int):
    done = []

    async def one(q):
        async with gate:
            request = ResearchRequest(q.question, q.answers if learn else None, rollouts, learn, q.id)
            result = await services.agent.agent.research(request)
        done.append(q.id)
        print(f"  {len(done)}/{len(questions)} {q.id}: {result.answer[:60]!r}", flush=True)
        return result

    return await asyncio.gather(*(one(q) for q in questions))


def accuracy(predictions: list[str], questions) -> float:
    return sum(is_match(p, q.answers) for p, q in zip(predictions, questions)) / len(questions)


async def main_async(args: argparse.Namespace) -> dict:
    data_dir = Path(tempfile.mkdtemp(prefix="mia-quality-"))
    extra = {"tools.index_dir": args.index_dir} if args.index_dir else {}
    config = load_config(args.config, {**OVERRIDES, **extra, "data_dir": str(data_dir)})
    questions = load_dataset(args.dataset, args.limit)
    services = Services(config)
    await services.start()
    gate = asyncio.Semaphore(args.concurrency)
    report: dict = {"questions": len(questions), "config": args.config, "overrides": OVERRIDES}
    try:
        t = time.perf_counter()
        bare = await bare_model(services, questions, gate)
        report["bare_model"] = {"match": accuracy(bare, questions), "seconds": time.perf_counter() - t}
        print("bare model", report["bare_model"], flush=True)
        t = time.perf_counter()
        before = await agent_pass(services, questions, gate, learn=False, rollouts=1)
        report["agent_no_memory"] = {"match": accuracy([r.answer for r in before], questions),
                                     "seconds": time.perf_counter() - t}
        print("agent, empty memory", report["agent_no_memory"], flush=True)
        t = time.perf_counter()
        learning = await agent_pass(services, questions, gate, learn=True, rollouts=args.rollouts)
        await services.learner.flush()
        report["ttl_pass"] = {
            "match_of_returned_answer": accuracy([r.answer for r in learning], questions),
            "judge_says_correct": sum(bool(r.rollouts[r.chosen].verdict and r.rollouts[r.chosen].verdict.is_correct)
                                      for r in learning) / len(questions),
            "updates_published": sum(u.is_published for u in services.learner.reports),
            "updates": len(services.learner.reports), "seconds": time.perf_counter() - t,
            "memories": (await services.memory.service.stats()).num_entries}
        print("ttl pass", report["ttl_pass"], flush=True)
        t = time.perf_counter()
        after = await agent_pass(services, questions, gate, learn=False, rollouts=1)
        report["agent_after_ttl"] = {"match": accuracy([r.answer for r in after], questions),
                                     "memories_used": sum(bool(r.memory_ids_used) for r in after),
                                     "seconds": time.perf_counter() - t}
        print("agent after ttl", report["agent_after_ttl"], flush=True)
        report["examples"] = [{"question": q.question, "gold": q.answers, "bare": b, "before": x.answer,
                               "after": y.answer} for q, b, x, y in list(zip(questions, bare, before, after))[:8]]
    finally:
        await services.stop()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="default")
    parser.add_argument("--dataset", default=str(Path(__file__).with_name("devset_wiki.jsonl")))
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--rollouts", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--index-dir", default="", help="reuse a built passage index cache (tools.index_dir)")
    args = parser.parse_args()
    from bench.results_io import Result

    result = Result("quality")
    report = asyncio.run(main_async(args))
    print(json.dumps({k: v for k, v in report.items() if k != "examples"}, indent=2))
    result.add_run(**{k: v for k, v in report.items() if k != "examples"})  # one pass over the questions
    result.write(args.out, report, args, echo=False)


if __name__ == "__main__":
    main()
