"""Ours alone, two source trees alternated: does a change to the engine or the loop make the research
loop faster? (``bench_research.py`` compares systems; this compares versions of ours.)

    git worktree add /tmp/old HEAD~1
    python bench/bench_ab.py /tmp/old . --starts 4 --passes 3 --set=--engines.tiny.executor_backend=uni

Each start runs one tree in a fresh process (its own engines, the tree first on ``sys.path``, so the
spawned engine core imports that tree too): ``Services`` on configs/tiny.toml, one warm-up pass, then
``--passes`` passes of ``--questions`` concurrent questions at G = ``--rollouts``, learning off. The
trees alternate A B B A A B B A ..., so a drift of the shared machine falls on both. Reported: q/s
per pass, the median per tree, and B over A.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PREFIX = "PASSES_QPS "


def order(starts: int) -> list[int]:
    """Which tree (0: A, 1: B) each start runs: A B B A A B B A ..."""
    return [(0, 1, 1, 0)[i % 4] for i in range(starts)]


async def one_start(args: argparse.Namespace) -> list[float]:
    sys.path.insert(0, str(args.tree))  # this tree's package and benchmarks, here and in spawned engines
    import mia_engine
    from bench.bench_research import run_questions
    from mia_engine.cli import dotted_overrides
    from mia_engine.config import load_config
    from mia_engine.services import Services

    if not Path(mia_engine.__file__).resolve().is_relative_to(args.tree.resolve()):
        raise SystemExit(f"mia_engine came from {mia_engine.__file__}, not from {args.tree}")
    tmp = Path(tempfile.mkdtemp(prefix="mia-ab-"))
    config = load_config("tiny", {"data_dir": str(tmp / "ours"), **dotted_overrides(args.set)})
    ours = Services(config)
    await ours.start()
    # bench_research.py's questions, written out: a helper added there would be missing from older trees
    questions = [f"Question {i}: which river flows through the capital city number {i}?"
                 for i in range(args.questions)]
    try:
        await run_questions(ours.agent.agent, questions, learn=False, concurrent=True, rollouts=args.rollouts)
        rates = []
        for _ in range(args.passes):
            wall, _ = await run_questions(ours.agent.agent, questions, learn=False, concurrent=True,
                                          rollouts=args.rollouts)
            rates.append(len(questions) / wall)
        return rates
    finally:
        await ours.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs=2, type=Path, help="tree A (the baseline) and tree B")
    parser.add_argument("--starts", type=int, default=4, help="processes started, alternated")
    parser.add_argument("--passes", type=int, default=3, help="timed passes per start")
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--set", action="append", default=[], metavar="--KEY=VALUE", help="config override")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one-start", type=Path, dest="tree", help=argparse.SUPPRESS)  # the child's mode
    args = parser.parse_args()
    if args.tree is not None:
        print(PREFIX + json.dumps(asyncio.run(one_start(args))), flush=True)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this tree's bench/, for the result file
    from bench.results_io import Result

    result = Result("ab")
    rates: dict[str, list[float]] = {"A": [], "B": []}
    for start_index, which in enumerate(order(args.starts)):
        tree = args.trees[which].resolve()
        child = [sys.executable, str(Path(__file__).resolve()), *map(str, args.trees), "--one-start", str(tree),
                 "--passes", str(args.passes), "--questions", str(args.questions), "--rollouts", str(args.rollouts),
                 *(f"--set={item}" for item in args.set)]
        done = subprocess.run(child, cwd=tree, capture_output=True, text=True, check=False)
        line = next((line for line in done.stdout.splitlines() if line.startswith(PREFIX)), None)
        if done.returncode != 0 or line is None:
            raise SystemExit(f"the start on {tree} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        got = json.loads(line.removeprefix(PREFIX))
        rates["AB"[which]] += got
        for pass_index, rate in enumerate(got):
            result.add_run(tree="AB"[which], start=start_index, pass_index=pass_index, questions_per_s=rate)
        print(f"{'AB'[which]} ({tree}): {', '.join(f'{r:.2f}' for r in got)} q/s", flush=True)
    summary = {"q_per_s": rates, "median_A": statistics.median(rates["A"]), "median_B": statistics.median(rates["B"])}
    summary["B_over_A"] = summary["median_B"] / summary["median_A"]
    result.write(args.out, summary, args, trees={"A": str(args.trees[0].resolve()), "B": str(args.trees[1].resolve())})


if __name__ == "__main__":
    main()
