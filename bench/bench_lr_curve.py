"""The Planner's LoRA learning rate from a measured curve: short test-time learning on the dev split at a few
learning rates, recording per GRPO update how far the policy moved and the reward it was trained on.

    python bench/bench_lr_curve.py --lrs 1e-6,1e-5,1e-4,1e-3 --questions 64 --epochs 2 \\
        --out bench/results/lr_curve.json
    python bench/bench_lr_curve.py --config tiny --set agent.profile=small_model --lrs 1e-3,2e-2 \\
        --questions 4 --batch-size 2 --rollouts 4 --out /tmp/lr_curve_tiny.json     # a smoke run

Each learning rate starts from the same adapter in a fresh data dir (its own memory and checkpoints) and
runs ``--epochs`` passes of test-time learning over the first ``--questions`` questions of the split, G =
``--rollouts`` rollouts each, ``--batch-size`` questions per update, as ``ttl`` does (supervised by the gold
answers, or ``--judge unsupervised``). Per update it records, as one run of the result file:

- ``kl``: the k3 estimate of KL(π_before ‖ π_after) on the update's own Planner tokens (sampled by the
  version before it; a regex-written token under its grammar mask), mean over tokens: whether the policy
  moved (0 = the update changed nothing measurable);
- ``reward_mean``: the mean reward of the rollouts the update trained on (sampled by the version before
  it): rising across updates = learning;
- the step's loss, gradient norm, clip fraction, ratio mean, sampler gap (learner vs engine log-probs
  before the update) and whether it was published.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from bench.results_io import Result  # noqa: E402
from mia_engine.agent.loop import ResearchRequest  # noqa: E402
from mia_engine.config import load_config  # noqa: E402
from mia_engine.services import Services, with_services  # noqa: E402
from mia_engine.tools.corpus import index_root  # noqa: E402

DEVSET = Path(__file__).resolve().parent / "devset_wiki.jsonl"


def override_value(text: str) -> Any:
    """A ``--set`` value read as TOML (``8``, ``true``, ``1e-5``), else the string itself."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def kl_k3(before: list, after: list, samples: list) -> tuple[float, int]:
    """(mean k3 KL over the samples' Planner tokens, their number): k3 = r − 1 − log r, r = π_after/π_before,
    an unbiased estimate of KL(π_before ‖ π_after) on tokens sampled from π_before."""
    total, count = 0.0, 0
    for b, a, sample in zip(before, after, samples):
        mask = [1] * len(sample.completion_ids) if sample.completion_mask is None else sample.completion_mask
        for lb, la, m in zip(b.tolist(), a.tolist(), mask):
            if m and math.isfinite(lb) and math.isfinite(la):
                log_ratio = la - lb
                total += math.exp(log_ratio) - 1.0 - log_ratio
                count += 1
    return (total / count if count else math.nan), count


def watch_updates(services: Services, rows: list[dict[str, Any]]) -> None:
    """Every update of the learner adds a row to ``rows``: the step's numbers and the KL between the
    versions before and after it, on the update's own samples (scored in the learner's thread)."""
    learner = services.learner.planner_learner
    assert learner is not None, "the test-time learner did not start (does the Planner role have an adapter?)"
    step = learner.step

    def measured_step(samples: list, *args: Any) -> Any:
        before = learner.token_logprobs(samples)
        result = step(samples, *args)
        kl, num_tokens = kl_k3(before, learner.token_logprobs(samples), samples) if result.is_accepted else (0.0, 0)
        rows.append({"update_index": len(rows), "kl": kl, "kl_tokens": num_tokens, "is_accepted": result.is_accepted,
                     "reward_mean": result.reward_mean, "reward_std": result.reward_std, "loss": result.loss,
                     "grad_norm": result.grad_norm, "clip_fraction": result.clip_fraction,
                     "ratio_mean": result.ratio_mean, "sampler_gap_mean": result.sampler_gap_mean,
                     "num_tokens": result.num_tokens, "num_sequences": result.num_sequences,
                     "num_skipped_groups": result.num_skipped_groups, "num_skipped_stale": result.num_skipped_stale,
                     "reason": result.reason, "version": result.version})
        return result

    learner.step = measured_step


async def learn(services: Services, questions: list[dict[str, Any]], args: argparse.Namespace,
                rows: list[dict[str, Any]]) -> list[float]:
    """``args.epochs`` passes of test-time learning; the judge accuracy of each epoch."""
    watch_updates(services, rows)
    gate = asyncio.Semaphore(args.concurrency)
    accuracy = []

    async def one(row: dict[str, Any]) -> bool:
        async with gate:
            gold = list(row["answer"]) if args.judge == "supervised" else None
            request = ResearchRequest(row["question"], gold, args.rollouts, True, row["id"])
            result = await services.agent.agent.research(request)
        chosen = result.rollouts[result.chosen]
        return bool(chosen.verdict and chosen.verdict.is_correct)

    for _ in range(args.epochs):
        correct = await asyncio.gather(*(one(q) for q in questions))
        await services.learner.flush()
        accuracy.append(sum(correct) / len(correct))
    return accuracy


def run_lr(lr: float, args: argparse.Namespace, questions: list[dict[str, Any]], root: Path) -> dict[str, Any]:
    overrides = {**{k: override_value(v) for k, v in (s.split("=", 1) for s in args.set)},
                 "learner.lr": lr, "learner.batch_size": args.batch_size}
    # a fresh data dir per lr (memory and adapters start empty), the corpus index shared with the config's
    index_dir = index_root(load_config(args.config, overrides))
    config = load_config(args.config, {**overrides, "data_dir": str(root / f"lr-{lr:g}"),
                                       "tools.index_dir": str(index_dir)})
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    accuracy = asyncio.run(with_services(config, lambda services: learn(services, questions, args, rows)))
    return {"lr": lr, "updates": rows, "epoch_accuracy": accuracy, "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="default", help="config name or path (default: the embedded default)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override, as on the command line (repeatable)")
    parser.add_argument("--lrs", default="1e-6,1e-5,1e-4,1e-3", help="comma-separated learning rates")
    parser.add_argument("--dataset", default=str(DEVSET))
    parser.add_argument("--split", default="dev", help="rows of this split only ('' = all)")
    parser.add_argument("--questions", type=int, default=64, help="first N questions of the split")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rollouts", type=int, default=4, help="G")
    parser.add_argument("--batch-size", type=int, default=8, help="questions per GRPO update")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--judge", choices=["supervised", "unsupervised"], default="supervised",
                        help="rewards from the gold answers (ttl_supervised) or from the unsupervised judge")
    parser.add_argument("--out", type=Path, default=Path("bench/results/lr_curve.json"))
    args = parser.parse_args()
    rows = [json.loads(line) for line in Path(args.dataset).read_text().splitlines() if line.strip()]
    questions = [r for r in rows if not args.split or r.get("split") == args.split][:args.questions]
    result = Result("lr_curve")
    curves = []
    with tempfile.TemporaryDirectory(prefix="mia-lr-curve-") as tmp:
        for lr in (float(x) for x in args.lrs.split(",")):
            curve = run_lr(lr, args, questions, Path(tmp))
            curves.append(curve)
            for update in curve["updates"]:
                result.add_run(lr=str(lr), **update)
    summary = [{"lr": c["lr"], "num_updates": len(c["updates"]),
                "num_published": sum(u["is_accepted"] for u in c["updates"]),
                "kl_mean": _mean(u["kl"] for u in c["updates"] if u["is_accepted"]),
                "reward_first": c["updates"][0]["reward_mean"] if c["updates"] else None,
                "reward_last": c["updates"][-1]["reward_mean"] if c["updates"] else None,
                "epoch_accuracy": c["epoch_accuracy"], "seconds": round(c["seconds"], 1)} for c in curves]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result.write(args.out, summary, args)


def _mean(values: Any) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else None


if __name__ == "__main__":
    main()
