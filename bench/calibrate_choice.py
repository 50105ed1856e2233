"""Calibrates the closed-book choice (``agent.closed_book_confidence``, ``agent.closed_book_min_logprob``) and
the grounded judge (``agent.min_grounding``) on dev splits only, and prints the config line for RESULTS.

For every dev question it runs, on one set of services (``evaluate.fresh_config``, ``with_services``), the
eval's ``mia_g1`` request (``evaluate.baseline_request``) with ``agent.answer_choice = "own"`` (the rollout's
own evidence answer, nothing replaced) and the closed-book request (``answer_choice.ask_closed_book``, the
loop's and the ``bare`` mode's, with its token log-probs). It records the closed-book answer, its log-probs,
the evidence answer, the passages and whether each answer matches gold (``is_match``), then picks

    the statistic and threshold of the choice      that maximise the accuracy of ``ClosedBookChoice``
    the judge's threshold                          that maximises ``GroundedJudge``'s agreement with gold

(a tie: the middle of the best thresholds). Dev splits by default: ``devset_wiki.jsonl`` split ``dev`` and
every ``*-dev`` split of ``devset_types.jsonl`` (yes/no, comparison, numeric). Held-out splits are never read.

    python bench/calibrate_choice.py --config default --out bench/results/calibrate_choice_dev.json
    python bench/calibrate_choice.py --records bench/results/calibrate_choice_dev.json   # re-pick, no model
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from mia_engine.agent.answer_choice import ClosedBookAnswer, ClosedBookChoice, ask_closed_book  # noqa: E402
from mia_engine.agent.answer_match import is_match  # noqa: E402
from mia_engine.agent.executor_run import evidence_texts  # noqa: E402
from mia_engine.agent.judge import GroundedJudge  # noqa: E402
from mia_engine.base.data import NAMED_DATASETS, named_dataset_path, read_rows  # noqa: E402
from mia_engine.evals.evaluate import baseline_request, fresh_config, select_questions  # noqa: E402

BENCH = Path(__file__).resolve().parent
STATISTICS = ("mean", "min")


def dev_splits(datasets: Sequence[str]) -> list[tuple[str, str]]:
    """(dataset, split) of every split named ``dev`` or ending in ``-dev`` of the datasets that exist."""
    found = []
    for dataset in datasets:
        path = named_dataset_path(dataset) if dataset in NAMED_DATASETS else Path(dataset)
        if not path.exists():
            continue
        splits = sorted({str(r["split"]) for r in read_rows(path) if isinstance(r, dict) and "split" in r})
        found.extend((dataset, s) for s in splits if s == "dev" or s.endswith("-dev"))
    return found


# ---- running the dev questions (the model) ----------------------------------------------------------


async def _record(services, question, split: str, gate: asyncio.Semaphore) -> dict:
    agent = services.config.agent
    async with gate:
        completion = await ask_closed_book(services.roles, agent, question.question)
        result = await services.agent.agent.research(baseline_request("mia_g1")(question))
    closed_book = ClosedBookAnswer.of(completion) if completion is not None else ClosedBookAnswer("", None)
    trajectory = result.rollouts[result.chosen].trajectory
    own = trajectory.final_answer or ""
    return {"id": question.id, "split": split, "question": question.question, "gold": list(question.answers),
            "closed_book": closed_book.text, "logprobs": list(closed_book.logprobs or []),
            "own": own, "evidence": evidence_texts(trajectory.observations),
            "closed_book_match": is_match(closed_book.text, question.answers),
            "own_match": is_match(own, question.answers)}


def run_model(config_name: str, overrides: dict, splits: list[tuple[str, str]], concurrency: int) -> list[dict]:
    from mia_engine.config import load_config
    from mia_engine.services import with_services

    config = load_config(config_name, overrides)
    config = msgspec.structs.replace(config, agent=msgspec.structs.replace(config.agent, answer_choice="own"))
    questions = [(q, split) for dataset, split in splits for q in select_questions(dataset, split, None)]

    async def work(services) -> list[dict]:
        gate = asyncio.Semaphore(concurrency)
        return list(await asyncio.gather(*(_record(services, q, split, gate) for q, split in questions)))

    with tempfile.TemporaryDirectory(prefix="mia-calibrate-") as root:
        return asyncio.run(with_services(fresh_config(config, Path(root), "calibrate"), work))


# ---- picking the thresholds (no model) ---------------------------------------------------------------


def best_threshold(values: Sequence[float], score: Callable[[float], float]) -> tuple[float, float]:
    """(threshold, its score): the candidate thresholds are the midpoints between the sorted distinct
    ``values`` and one beyond each end; of those that score best, the middle one."""
    points = sorted({v for v in values if math.isfinite(v)})
    if not points:
        return 0.0, score(0.0)
    candidates = [points[0] - 1.0, *((a + b) / 2 for a, b in zip(points, points[1:])), points[-1] + 1e-6]
    scored = [(score(t), t) for t in candidates]
    top = max(s for s, _ in scored)
    best = [t for s, t in scored if s == top]
    return best[len(best) // 2], top


def choice_accuracy(records: Sequence[dict], statistic: str, threshold: float) -> float:
    choice = ClosedBookChoice(min(threshold, 0.0), statistic)
    correct = 0
    for r in records:
        answer = choice.choose(r["question"], r["own"], ClosedBookAnswer(r["closed_book"], r["logprobs"]),
                               r["evidence"]).answer
        correct += is_match(answer, r["gold"])
    return correct / max(len(records), 1)


def judge_agreement(records: Sequence[dict], threshold: float) -> dict[str, float]:
    """Agreement, precision and recall of ``GroundedJudge(threshold)`` against gold over both answers."""
    judge = GroundedJudge(max(threshold, 0.0))
    counts = {(v, g): 0 for v in (True, False) for g in (True, False)}
    for r in records:
        for answer, match in ((r["own"], r["own_match"]), (r["closed_book"], r["closed_book_match"])):
            if answer:
                counts[(judge.verdict(r["question"], answer, r["evidence"]).is_correct, match)] += 1
    tp, fp, fn, tn = counts[(True, True)], counts[(True, False)], counts[(False, True)], counts[(False, False)]
    return {"agreement": (tp + tn) / max(tp + fp + fn + tn, 1), "precision": tp / max(tp + fp, 1),
            "recall": tp / max(tp + fn, 1), "num_answers": tp + fp + fn + tn}


def grounding_scores(records: Sequence[dict]) -> list[float]:
    from mia_engine.agent.evidence_support import grounding, passages_of
    return [grounding(r["question"], answer, passages_of(r["evidence"])).score
            for r in records for answer in (r["own"], r["closed_book"]) if answer]


def pick(records: list[dict]) -> dict:
    """The chosen statistic, thresholds and their dev figures (per split too)."""
    choices = {}
    for statistic in STATISTICS:
        confidences = [ClosedBookAnswer(r["closed_book"], r["logprobs"]).confidence(statistic) for r in records]
        choices[statistic] = best_threshold(confidences, lambda t, s=statistic: choice_accuracy(records, s, t))
    statistic = max(STATISTICS, key=lambda s: choices[s][1])
    threshold = round(min(choices[statistic][0], 0.0), 4)
    min_grounding, _ = best_threshold(grounding_scores(records), lambda t: judge_agreement(records, t)["agreement"])
    min_grounding = round(min(max(min_grounding, 0.0), 1.0), 4)
    splits = sorted({r["split"] for r in records})
    by_split = {s: [r for r in records if r["split"] == s] for s in splits}
    return {
        "closed_book_confidence": statistic, "closed_book_min_logprob": threshold, "min_grounding": min_grounding,
        "accuracy": {"chosen": choice_accuracy(records, statistic, threshold),
                     "evidence_only": sum(r["own_match"] for r in records) / max(len(records), 1),
                     "closed_book_only": sum(r["closed_book_match"] for r in records) / max(len(records), 1),
                     **{f"chosen_{s}": choice_accuracy(by_split[s], statistic, threshold) for s in splits}},
        "by_statistic": {s: {"threshold": t, "accuracy": a} for s, (t, a) in choices.items()},
        "judge": judge_agreement(records, min_grounding),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="default")
    parser.add_argument("--datasets", nargs="+",
                        default=[str(BENCH / "devset_wiki.jsonl"), str(BENCH / "devset_types.jsonl")])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", type=Path, help="where the per-question records and the picks are written")
    parser.add_argument("--records", type=Path, help="pick again from a file this script wrote (no model)")
    args, rest = parser.parse_known_args()
    if args.records is not None:
        document = json.loads(args.records.read_text())
        records, config_name, overrides = document["records"], document["config"], document["overrides"]
    else:
        from mia_engine.cli import dotted_overrides
        overrides = dotted_overrides([a for a in rest if a != "--"])
        splits = dev_splits(args.datasets)
        print(f"dev splits: {', '.join(f'{Path(d).name}:{s}' for d, s in splits)}", flush=True)
        records, config_name = run_model(args.config, overrides, splits, args.concurrency), args.config
    picked = pick(records)
    if args.out is not None:
        args.out.write_text(json.dumps({"config": config_name, "overrides": overrides, "picked": picked,
                                        "records": records}, indent=1, ensure_ascii=False))
    print(json.dumps(picked, indent=1))
    print(f"calibrated ({len(records)} dev questions): "
          f"--agent.closed_book_confidence={picked['closed_book_confidence']} "
          f"--agent.closed_book_min_logprob={picked['closed_book_min_logprob']} "
          f"--agent.min_grounding={picked['min_grounding']}")
    print(f"command: python bench/calibrate_choice.py --config {config_name} --out {args.out or '<records.json>'}")


if __name__ == "__main__":
    main()
