"""One GRPO step of the Planner's learner (``PlannerLearner.step``) on the tiny model the project builds:
2 groups × G = 4 sequences of 32 + 16 tokens, micro-batch 4, float32, one torch thread
(``learner.num_threads``' default), after a warm-up step."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from bench.bench_grpo_step import make_samples


@pytest.fixture(scope="module")
def learner_and_samples(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    from mia_engine.config.learner import LearnerConfig
    from mia_engine.learner.learner import PlannerLearner
    from mia_engine.models.tiny import build_tiny

    out = Path(tmp_path_factory.mktemp("tiny"))
    build_tiny(out)
    vocab_size = json.loads((out / "base" / "config.json").read_text())["vocab_size"]
    learner = PlannerLearner(out / "base", out / "adapters" / "planner",
                             LearnerConfig(device="cpu", dtype="float32", micro_batch_size=4))
    shape = argparse.Namespace(num_groups=2, group_size=4, prompt_len=32, completion_len=16)
    samples = make_samples(shape, vocab_size)
    torch.set_num_threads(1)
    learner.step(samples)  # warm-up
    return learner, samples


def test_learner_step(benchmark, learner_and_samples) -> None:  # noqa: ANN001
    learner, samples = learner_and_samples
    result = benchmark.pedantic(lambda: learner.step(samples), rounds=5, iterations=1)
    assert result.is_accepted, result.reason
