"""How often the evidence-grounded judge (``agent.unsupervised_judge = "grounded"``) agrees with the gold
answers, replayed on kept traces: every answer of a ``bench/quality_traces.py`` file (the rollout's own, the
closed-book candidate, and the one the closed-book rule returns) judged by ``GroundedJudge.verdict`` against
its rollout's passages, then compared with the string match against gold.

    python bench/judge_agreement.py bench/results/quality_traces_dev_v19_rule1.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from mia_engine.agent.answer_choice import ClosedBookChoice  # noqa: E402
from mia_engine.agent.answer_match import is_match  # noqa: E402
from mia_engine.config.agent import AgentConfig  # noqa: E402
from mia_engine.agent.judge import GroundedJudge  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", type=Path)
    args = parser.parse_args()
    min_support = AgentConfig.for_profile("small_model").min_support
    choice, judge = ClosedBookChoice(min_support), GroundedJudge(min_support)
    counts = {(verdict, gold): 0 for verdict in (True, False) for gold in (True, False)}
    for mode in json.loads(args.traces.read_text())["passes"].values():
        for row in mode["questions"]:
            evidence = [o for o in row["observations"] if o]
            own = row.get("own_answer") or row["answer"]
            answers = [own] if row.get("closed_book") is None else [
                own, row["closed_book"], choice.choose(row["question"], own, row["closed_book"], evidence).answer]
            for answer in answers:
                verdict = judge.verdict(row["question"], answer, evidence).is_correct
                counts[(verdict, is_match(answer, row["gold"]))] += 1
    tp, fp, fn, tn = counts[(True, True)], counts[(True, False)], counts[(False, True)], counts[(False, False)]
    total = tp + fp + fn + tn
    print(f"{total} answers: agreement {(tp + tn) / total:.2f}, precision {tp / max(tp + fp, 1):.2f}, "
          f"recall {tp / max(tp + fn, 1):.2f} (judged correct & gold correct {tp}, judged correct & wrong {fp}, "
          f"judged wrong & correct {fn}, both wrong {tn})")


if __name__ == "__main__":
    main()
