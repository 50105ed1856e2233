"""The test-time learner on the tiny model: train mode with gradient checkpointing, adapters in the
engine's dtype, rollback to the served version when a publish fails, numbering that continues after a
restart, pruning that spares live and draining versions, and operator adapters as starting points.

The engine side is the real ``AdapterRegistry`` over ``RecordingHost``, a stand-in for vLLM's
``add_lora``/``remove_lora`` that records calls (and can refuse): the learner and its files are real.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mia_engine.config import LearnerConfig
from mia_engine.engines.adapters import AdapterError, AdapterRegistry
from mia_engine.learner.checkpoints import AdapterCheckpoints, prune_published, publish_path
from mia_engine.learner.learner import ADAPTER_WEIGHTS, PlannerLearner
from mia_engine.learner.ttl import TestTimeLearner
from mia_engine.models.lora import write_lora_adapter

from .test_learner import make_learner, rollouts


class RecordingHost:
    """What the registry needs of an engine: records adapter loads, refuses them when told to."""

    max_lora_rank = 8

    def __init__(self) -> None:
        self.loaded: list[str] = []
        self.is_refusing = False

    async def add_lora(self, request) -> bool:
        if self.is_refusing:
            raise RuntimeError("engine refused the adapter")
        self.loaded.append(request.lora_path)
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        return True


def _served_weights(registry: AdapterRegistry) -> dict[str, torch.Tensor]:
    return load_file(str(registry.current("planner").path / ADAPTER_WEIGHTS))


def _assert_learner_matches(ttl: TestTimeLearner, weights: dict[str, torch.Tensor]) -> None:
    state = ttl._learner.lora_state()
    assert state.keys() == weights.keys()
    for key, value in weights.items():
        torch.testing.assert_close(state[key].to(value.dtype), value, rtol=0, atol=0)


async def _started(tiny: Path, root: Path, served: Path | None = None, **config: object):
    registry, host = AdapterRegistry(), RecordingHost()
    await registry.register("planner", host, served or tiny / "adapters" / "planner")
    learner_config = LearnerConfig(lr=0.02, batch_size=1, publish_dir=str(root / "pub"), **config)
    ttl = TestTimeLearner(learner_config, registry, root / "data" / "adapters" / "planner")
    await ttl.start(tiny / "base")
    return ttl, registry, host


def test_learner_trains_in_train_mode_with_checkpointing(tiny: Path) -> None:
    learner = make_learner(tiny, micro_batch_size=8)
    assert learner.model.training
    assert learner.model.base_model.model.is_gradient_checkpointing
    assert all(m.p == 0 for m in learner.model.modules() if isinstance(m, torch.nn.Dropout))
    layer = learner.model.base_model.model.model.layers[0]
    calls = []
    layer.register_forward_pre_hook(lambda *args: calls.append(1))  # pre: recompute stops early
    assert learner.step(rollouts(seed=3)).is_accepted
    assert len(calls) == 2  # one micro-batch: the forward pass, then the recompute in backward
    plain = make_learner(tiny, micro_batch_size=8, gradient_checkpointing=False)
    plain_calls = []
    plain.model.base_model.model.model.layers[0].register_forward_pre_hook(lambda *args: plain_calls.append(1))
    plain.step(rollouts(seed=3))
    assert len(plain_calls) == 1
    for key, value in plain.lora_state().items():  # checkpointing changes memory, not the update
        torch.testing.assert_close(learner.lora_state()[key], value)


def test_adapters_are_published_in_the_engines_dtype(tiny: Path, tmp_path: Path) -> None:
    learner = PlannerLearner(tiny / "base", tiny / "adapters" / "planner", LearnerConfig(), torch.bfloat16)
    saved = load_file(str(learner.save_adapter(tmp_path / "v1") / ADAPTER_WEIGHTS))
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}
    assert learner.adapter_num_bytes == sum(t.numel() * 2 for t in saved.values())


@pytest.mark.parametrize("failure", ["save", "engine"])
async def test_failed_publish_rolls_the_learner_back_to_the_served_version(
        tiny: Path, tmp_path: Path, failure: str) -> None:
    ttl, registry, host = await _started(tiny, tmp_path)
    try:
        served_before = registry.current("planner")
        if failure == "save":  # a file where the role's publish folder goes: the save raises OSError
            (tmp_path / "pub" / "planner").write_text("in the way")
        else:
            host.is_refusing = True
        report = await ttl.update(rollouts(seed=1))
        assert report.step.is_accepted and not report.is_published
        assert "publishing failed" in report.reason and "back on the served version" in report.reason
        assert registry.current("planner") is served_before
        _assert_learner_matches(ttl, _served_weights(registry))  # not the rejected step's weights
        if failure == "save":
            (tmp_path / "pub" / "planner").unlink()
        host.is_refusing = False
        again = await ttl.update(rollouts(seed=1))
        assert again.is_published and registry.current("planner").version == served_before.version + 1
        _assert_learner_matches(ttl, _served_weights(registry))
    finally:
        ttl.close()


async def test_numbering_continues_after_a_restart(tiny: Path, tmp_path: Path) -> None:
    ttl, _, _ = await _started(tiny, tmp_path)
    for seed in (1, 2):
        assert (await ttl.update(rollouts(seed=seed))).is_published
    ttl.close()
    ckpt = ttl.checkpoints
    assert ckpt.versions() == [0, 1, 2] and ckpt.latest_version() == 2
    before = {v: (ckpt.path(v) / ADAPTER_WEIGHTS).read_bytes() for v in ckpt.versions()}
    restarted, registry, _ = await _started(tiny, tmp_path, served=ttl.resume_path())
    try:
        assert restarted._learner.version == 2
        _assert_learner_matches(restarted, _served_weights(registry))
        report = await restarted.update(rollouts(seed=3))
        assert report.is_published and report.step.version == 3
        assert ckpt.versions() == [1, 2, 3]  # pruned to 3; nothing re-saved over an old number
        assert all((ckpt.path(v) / ADAPTER_WEIGHTS).read_bytes() == before[v] for v in (1, 2))
    finally:
        restarted.close()
    with pytest.raises(FileExistsError):
        ckpt.save(3, ckpt.path(2))


async def test_draining_version_is_never_pruned(tiny: Path, tmp_path: Path) -> None:
    ttl, registry, _ = await _started(tiny, tmp_path, num_checkpoints_kept=1, num_reports_kept=2)
    try:
        assert (await ttl.update(rollouts(seed=1))).is_published
        async with registry.acquire("planner"):  # a request still running on v2 ...
            held = registry.current("planner").path
            for seed in (2, 3, 4):  # ... while three newer versions are published and pruned
                assert (await ttl.update(rollouts(seed=seed))).is_published
            assert held.is_dir() and any(v.path == held for v in registry.versions())
        published = sorted((tmp_path / "pub" / "planner").iterdir())
        assert len(published) == 3  # keep + 1, plus the one that was draining
        assert (await ttl.update(rollouts(seed=5))).is_published
        assert not held.exists()  # drained: now it may go
        assert [r.adapter_version for r in ttl.reports] == [5, 6]  # only the latest reports are kept
    finally:
        ttl.close()


def test_prune_spares_protected_folders(tmp_path: Path) -> None:
    paths = []
    for version in range(1, 6):
        path = publish_path(tmp_path, "planner", version)
        path.mkdir()
        paths.append(path)
    removed = prune_published(tmp_path / "planner", keep=2, protected={paths[0]})
    assert set(removed) == {paths[1], paths[2]} and paths[0].is_dir()
    ckpt = AdapterCheckpoints(tmp_path / "ckpt", keep=1)
    first = ckpt.save(0, paths[3])
    ckpt.save(1, paths[4], protected={first})
    assert ckpt.versions() == [0, 1]


def _operator_adapter(tiny: Path, out: Path, poison: bool = False) -> Path:
    shutil.copytree(tiny / "adapters" / "planner", out)
    weights = load_file(str(out / ADAPTER_WEIGHTS))
    weights = {k: v + 0.01 if "lora_B" in k else v for k, v in weights.items()}
    if poison:
        key = next(iter(weights))
        weights[key][0, 0] = float("nan")
    save_file(weights, str(out / ADAPTER_WEIGHTS))
    return out


async def test_operator_adapter_is_validated_and_becomes_the_starting_point(tiny: Path, tmp_path: Path) -> None:
    ttl, registry, _ = await _started(tiny, tmp_path)
    try:
        with pytest.raises(AdapterError, match="non-finite"):
            await registry.publish("planner", _operator_adapter(tiny, tmp_path / "nan", poison=True))
        config = json.loads((tiny / "base" / "config.json").read_text())
        write_lora_adapter(tmp_path / "r16", config, rank=16, alpha=16, target_modules=["q_proj", "v_proj"],
                           seed=0, b_std=0.0, base_model_name="tiny")
        with pytest.raises(AdapterError, match="max_lora_rank"):
            await registry.publish("planner", tmp_path / "r16")
        operator = _operator_adapter(tiny, tmp_path / "operator")
        await registry.publish("planner", operator)
        await asyncio.gather(*ttl._tasks)  # adoption runs beside the publish request
        _assert_learner_matches(ttl, load_file(str(operator / ADAPTER_WEIGHTS)))
        assert ttl.checkpoints.latest_version() == 1
        assert load_file(str(ttl.checkpoints.latest() / ADAPTER_WEIGHTS)).keys() == ttl._learner.lora_state().keys()
        report = await ttl.update(rollouts(seed=1))
        assert report.is_published and report.step.version == 2
    finally:
        ttl.close()


async def test_the_update_backlog_is_bounded(tmp_path: Path) -> None:
    """Learning requests that fill batches faster than updates finish wait for the learner (the
    reference's batch t+1 waits for t) instead of queueing an unbounded number of updates."""
    config = LearnerConfig(batch_size=1, max_queued_updates=2)
    ttl = TestTimeLearner(config, AdapterRegistry(), tmp_path / "checkpoints")
    release = asyncio.Event()
    started: list[int] = []

    async def slow_update(samples):  # stands in for the GRPO step; pure scheduling logic here
        started.append(len(samples))
        await release.wait()

    ttl.update = slow_update
    await ttl.submit(["a"])
    await ttl.submit(["b"])
    third = asyncio.ensure_future(ttl.submit(["c"]))
    await asyncio.sleep(0.05)
    assert len(ttl._tasks) == 2 and not third.done()  # the third batch waits: two updates are queued
    release.set()
    await asyncio.wait_for(third, timeout=5)
    await ttl.flush()
    assert started == [1, 1, 1] and not ttl._tasks  # nothing was dropped
    ttl.close()
