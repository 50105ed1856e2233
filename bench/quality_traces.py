"""Per-question traces of the eval's research baselines, to see *why* one mode beats another.

``python -m mia_engine eval`` reports accuracy; this runs the same requests (``react``, ``mia_g1`` from
``mia_engine.evals.evaluate.baseline_request``) through the same services and keeps, for each question, the
chosen rollout's plan, searches, reflection, replan and answer. How the replan decision of
bench/history/HISTORY.md (section 5, "Latest (issue 11, ...)") was made:

    python bench/quality_traces.py --out traces.json --modes react mia_g1 -- --tools.index_dir=<index cache>
    python bench/quality_traces.py --out traces_norep.json --modes mia_g1 -- --agent.max_replans=0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from mia_engine.agent.answer_match import is_match
from mia_engine.cli import dotted_overrides
from mia_engine.config import load_config
from mia_engine.evals.evaluate import baseline_request, fresh_config, select_questions
from mia_engine.services import with_services

DEVSET = Path(__file__).with_name("devset_wiki.jsonl")


def _row(question, result, seconds: float) -> dict:
    rollout = result.rollouts[result.chosen]
    trajectory = rollout.trajectory
    return {"id": question.id, "question": question.question, "gold": question.answers, "answer": result.answer,
            "match": is_match(result.answer, question.answers), "seconds": seconds, "plan": rollout.plan,
            "reflection": trajectory.reflection, "replan": trajectory.replan,
            "first_answer": trajectory.first_answer, "answer_source": trajectory.answer_source,
            "own_answer": trajectory.own_answer, "closed_book": result.closed_book,
            "queries": [t.tool_call.arguments if t.tool_call else None for t in trajectory.turns],
            "observations": [o.text if o else None for o in trajectory.observations]}


async def _passes(services, questions, modes: list[str], concurrency: int) -> dict:
    rows = {}
    for mode in modes:
        make = baseline_request(mode)
        gate = asyncio.Semaphore(concurrency)

        async def one(question):
            async with gate:
                start = time.perf_counter()
                result = await services.agent.agent.research(make(question))
                return _row(question, result, time.perf_counter() - start)

        start = time.perf_counter()
        results = await asyncio.gather(*(one(q) for q in questions))
        wall = time.perf_counter() - start
        accuracy = sum(r["match"] for r in results) / max(len(results), 1)
        print(f"{mode}: accuracy {accuracy:.3f}, wall {wall:.0f} s", flush=True)
        rows[mode] = {"accuracy": accuracy, "wall_seconds": wall, "questions": results}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="default")
    parser.add_argument("--dataset", default=str(DEVSET))
    parser.add_argument("--split", default="dev")
    parser.add_argument("--modes", nargs="+", default=["react", "mia_g1"], choices=["react", "mia_g1", "mia_g4"])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", type=Path, required=True)
    args, rest = parser.parse_known_args()
    overrides = dotted_overrides([a for a in rest if a != "--"])
    config = load_config(args.config, overrides)
    questions = select_questions(args.dataset, args.split, None)
    with tempfile.TemporaryDirectory(prefix="mia-traces-") as root:
        rows = asyncio.run(with_services(fresh_config(config, Path(root), "traces"),
                                         lambda services: _passes(services, questions, args.modes, args.concurrency)))
    args.out.write_text(json.dumps({"config": args.config, "overrides": overrides, "passes": rows}, indent=1))


if __name__ == "__main__":
    main()
