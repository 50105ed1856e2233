"""bench/bench_lr_curve.py's measure of an update: the KL between the versions before and after it on its
own samples (k3, on the tiny model's learner, no engine), zero where nothing moved."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.bench_lr_curve import kl_k3, watch_updates
from mia_engine.config.learner import LearnerConfig
from mia_engine.learner.learner import PlannerLearner
from tests.learner.test_learner import rollouts


def test_each_update_records_the_kl_between_consecutive_versions(tiny: Path) -> None:
    learner = PlannerLearner(tiny / "base", tiny / "adapters" / "planner", LearnerConfig(lr=1e-3))
    rows: list[dict] = []
    watch_updates(SimpleNamespace(learner=SimpleNamespace(planner_learner=learner)), rows)
    samples = rollouts(seed=3)
    assert learner.step(samples).is_accepted
    assert learner.step(samples[:4] + [samples[4]] * 4).num_sequences == 4  # a group with no reward spread
    first, second = rows
    assert first["is_accepted"] and first["kl"] > 0 and first["kl_tokens"] == 80
    assert first["reward_mean"] == pytest.approx(0.5) and first["update_index"] == 0
    assert second["update_index"] == 1 and second["num_skipped_groups"] == 1
    same = learner.token_logprobs(samples)
    assert kl_k3(same, same, samples) == (0.0, 80)
