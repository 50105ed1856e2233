"""The Planner learner on the tiny model, and the adapter checkpoints it publishes through."""

from __future__ import annotations

import math
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mia_engine.learner.batching import GRPOSample
from mia_engine.learner.checkpoints import AdapterCheckpoints, prune_published, publish_dir, publish_path
from mia_engine.config.learner import LearnerConfig
from mia_engine.learner.learner import PlannerLearner

CHOSEN = 777  # the token the synthetic reward pays for
VOCAB = 2048


def make_learner(tiny: Path, **overrides: object) -> PlannerLearner:
    return PlannerLearner(tiny / "base", tiny / "adapters" / "planner", LearnerConfig(**overrides))


def rollouts(seed: int = 0, num_groups: int = 2, group_size: int = 4) -> list[GRPOSample]:
    """Reward 1 for completions that contain CHOSEN, 0 otherwise; half of each group contains it."""
    rng = random.Random(seed)
    samples = []
    for g in range(num_groups):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(4, 9))]
        for i in range(group_size):
            completion = [rng.choice([t for t in range(VOCAB) if t != CHOSEN]) for _ in range(10)]
            if i % 2 == 0:
                for pos in rng.sample(range(10), 3):
                    completion[pos] = CHOSEN
            samples.append(GRPOSample(prompt_ids=prompt, completion_ids=completion,
                                      reward=float(CHOSEN in completion), group_id=f"q{g}"))
    return samples


def own_logprobs(learner: PlannerLearner, sample: GRPOSample) -> torch.Tensor:
    """(C, V) log-probs at the completion positions of one unpadded sequence, computed directly."""
    ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
    with torch.no_grad():
        logits = learner.model(input_ids=ids).logits[0].float()  # (n, V)
    return torch.log_softmax(logits, -1)[len(sample.prompt_ids) - 1:ids.shape[1] - 1]  # (C, V)


def chosen_logprob(learner: PlannerLearner, samples: list[GRPOSample]) -> float:
    return torch.cat([own_logprobs(learner, s)[:, CHOSEN] for s in samples]).mean().item()


def base_state(learner: PlannerLearner) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in learner.model.named_parameters() if not p.requires_grad}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "weights changed"


# ----- the step -----------------------------------------------------------------------------------


def test_step_learns_the_rewarded_token(tiny: Path) -> None:
    learner = make_learner(tiny, lr=1e-2)
    samples = rollouts()
    lora_before, base_before = learner.lora_state(), base_state(learner)
    logprob_before = chosen_logprob(learner, samples)
    result = learner.step(samples)
    assert result.is_accepted, result.reason
    assert (result.version, result.num_sequences, result.num_tokens) == (1, 8, 80)
    assert (result.reward_mean, result.reward_std) == (0.5, 0.5)
    assert result.ratio_mean == pytest.approx(1.0) and result.clip_fraction == 0.0
    assert math.isfinite(result.loss) and result.grad_norm > 0
    lora_after = learner.lora_state()
    assert all(not torch.equal(lora_before[k], lora_after[k]) for k in lora_before if k.endswith("lora_B.weight"))
    assert_same(base_before, base_state(learner))
    assert chosen_logprob(learner, samples) > logprob_before + 0.05


def test_groups_without_reward_spread_are_skipped(tiny: Path) -> None:
    learner = make_learner(tiny, lr=1e-2)
    flat = [GRPOSample(prompt_ids=[1, 2], completion_ids=[3, 4], reward=1.0, group_id="same") for _ in range(4)]
    before = learner.lora_state()
    result = learner.step(flat)
    assert not result.is_accepted and "no learning signal" in result.reason and result.num_skipped_groups == 1
    assert_same(before, learner.lora_state())
    result = learner.step(flat + rollouts(num_groups=1))
    assert result.is_accepted and result.num_skipped_groups == 1 and result.num_sequences == 4


@pytest.mark.parametrize("aggregation", ["grpo", "dapo"])
def test_micro_batch_accumulation_equals_full_batch(tiny: Path, aggregation: str) -> None:
    samples = rollouts(seed=3)
    samples[1] = GRPOSample(prompt_ids=samples[1].prompt_ids, completion_ids=samples[1].completion_ids[:6],
                            reward=samples[1].reward, group_id=samples[1].group_id)  # uneven lengths
    one = make_learner(tiny, micro_batch_size=1, aggregation=aggregation).gradients(samples)
    full = make_learner(tiny, micro_batch_size=len(samples), aggregation=aggregation).gradients(samples)
    assert any(g.abs().max() > 0 for g in full.values())
    for key in full:
        torch.testing.assert_close(one[key], full[key], rtol=1e-4, atol=1e-7)


def test_own_old_logprobs_give_the_on_policy_gradient(tiny: Path) -> None:
    """old_logprobs are aligned with the completion tokens: the model's own values give ratio 1."""
    learner = make_learner(tiny)
    samples = rollouts(seed=5)
    with_old = [GRPOSample(prompt_ids=s.prompt_ids, completion_ids=s.completion_ids, reward=s.reward,
                           group_id=s.group_id,
                           old_logprobs=own_logprobs(learner, s).gather(
                               1, torch.tensor(s.completion_ids)[:, None]).squeeze(1).tolist())
                for s in samples]
    expected, got = learner.gradients(samples), learner.gradients(with_old)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-3, atol=1e-6)
    shifted = [GRPOSample(prompt_ids=s.prompt_ids, completion_ids=s.completion_ids, reward=s.reward,
                          group_id=s.group_id, old_logprobs=s.old_logprobs[1:] + [0.0]) for s in with_old]
    assert learner.step(shifted).ratio_mean != pytest.approx(1.0, abs=1e-3)


def test_masked_tokens_do_not_count(tiny: Path) -> None:
    """Trailing non-Planner tokens change nothing; a sample with no Planner token is dropped."""
    learner = make_learner(tiny, aggregation="dapo")
    samples = rollouts(seed=7)
    extra = [5, 6, 7, 8]
    masked = [GRPOSample(prompt_ids=s.prompt_ids, completion_ids=s.completion_ids + extra, reward=s.reward,
                         group_id=s.group_id, completion_mask=[1] * len(s.completion_ids) + [0] * len(extra))
              for s in samples]
    expected, got = learner.gradients(samples), learner.gradients(masked)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=1e-7)
    silent = GRPOSample(prompt_ids=[1, 2], completion_ids=[3, 4], completion_mask=[0, 0], reward=1.0, group_id="q0")
    assert learner.step(samples + [silent]).num_sequences == len(samples)


def test_kl_term_uses_the_adapter_free_model(tiny: Path) -> None:
    learner = make_learner(tiny, lr=1e-3, kl_beta=0.1)
    samples = rollouts(seed=11)
    kl_grads, plain_grads = learner.gradients(samples), make_learner(tiny, lr=1e-3).gradients(samples)
    assert any(not torch.allclose(kl_grads[k], plain_grads[k]) for k in kl_grads)
    result = learner.step(samples)
    assert result.is_accepted and result.kl > 0  # the shipped adapter's B is not zero


def test_more_epochs_move_the_ratio_off_one(tiny: Path) -> None:
    result = make_learner(tiny, lr=1e-2, num_epochs=3).step(rollouts(seed=13))
    assert result.is_accepted and result.version == 1


def test_malformed_samples_raise(tiny: Path) -> None:
    learner = make_learner(tiny)
    with pytest.raises(ValueError, match="old_logprobs"):
        learner.step([GRPOSample(prompt_ids=[1], completion_ids=[2, 3], old_logprobs=[0.0], reward=0.0, group_id="a")])
    with pytest.raises(ValueError, match="vocabulary"):
        learner.step([GRPOSample(prompt_ids=[1], completion_ids=[VOCAB], reward=0.0, group_id="a")])
    with pytest.raises(ValueError, match="prompt_ids"):
        learner.step([GRPOSample(prompt_ids=[], completion_ids=[2], reward=0.0, group_id="a")])


# ----- rejected steps -----------------------------------------------------------------------------


def assert_rejected_untouched(learner: PlannerLearner, samples: list[GRPOSample]) -> None:
    lora, base, version = learner.lora_state(), base_state(learner), learner.version
    result = learner.step(samples)
    assert not result.is_accepted and "non-finite" in result.reason, result.reason
    assert result.version == version and learner.version == version
    assert_same(lora, learner.lora_state())
    assert_same(base, base_state(learner))


def test_nan_reward_is_rejected(tiny: Path) -> None:
    samples = rollouts()
    samples[2] = GRPOSample(prompt_ids=samples[2].prompt_ids, completion_ids=samples[2].completion_ids,
                            reward=math.nan, group_id=samples[2].group_id)
    assert_rejected_untouched(make_learner(tiny, lr=1e-2), samples)


def test_nan_gradient_is_rejected(tiny: Path) -> None:
    learner = make_learner(tiny, lr=1e-2)
    param = next(p for p in learner.model.parameters() if p.requires_grad)
    handle = param.register_hook(lambda grad: grad * math.nan)
    try:
        assert_rejected_untouched(learner, rollouts())
    finally:
        handle.remove()
    assert learner.step(rollouts()).is_accepted  # the learner is still usable


def test_non_finite_weights_after_the_update_are_rolled_back(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    learner = make_learner(tiny, lr=1e-2)
    assert learner.step(rollouts(seed=1)).is_accepted  # optimizer state exists now and must be restored
    state_before = {k: v.clone() for k, v in learner._optimizer.state_dict()["state"][0].items()}
    original_step = torch.optim.AdamW.step

    def poisoned_step(self: torch.optim.Optimizer, *args: object, **kwargs: object) -> object:
        out = original_step(self, *args, **kwargs)
        with torch.no_grad():
            self.param_groups[0]["params"][0].fill_(math.inf)
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", poisoned_step)
    assert_rejected_untouched(learner, rollouts(seed=2))
    state_after = learner._optimizer.state_dict()["state"][0]
    assert all(torch.equal(state_before[k], state_after[k]) for k in state_before)


# ----- saving and loading -------------------------------------------------------------------------


def test_saved_adapter_loads_in_peft_with_identical_logits(tiny: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    learner = make_learner(tiny, lr=1e-2)
    assert learner.step(rollouts()).is_accepted
    out = learner.save_adapter(tmp_path / "pub" / "v1")
    assert sorted(p.name for p in (tmp_path / "pub").iterdir()) == ["v1"]  # no temp folder left behind
    shipped = load_file(str(tiny / "adapters" / "planner" / "adapter_model.safetensors"))
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert sorted(saved) == sorted(shipped)
    assert all(k.startswith("base_model.model.model.layers.") for k in saved)
    base = AutoModelForCausalLM.from_pretrained(tiny / "base", dtype=torch.float32)
    reloaded = PeftModel.from_pretrained(base, out).eval()
    ids = torch.tensor([rollouts()[0].prompt_ids + rollouts()[0].completion_ids])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, learner.model(input_ids=ids).logits,
                                   rtol=0, atol=0)
    with pytest.raises(FileExistsError):
        learner.save_adapter(out)


def test_load_adapter_weights_restores_a_version_exactly(tiny: Path, tmp_path: Path) -> None:
    learner = make_learner(tiny, lr=1e-2)
    shipped = learner.lora_state()
    assert learner.step(rollouts(seed=1)).is_accepted
    v1 = learner.lora_state()
    learner.save_adapter(tmp_path / "v1")
    assert learner.step(rollouts(seed=2)).is_accepted
    learner.load_adapter_weights(tmp_path / "v1")
    assert_same(v1, learner.lora_state())
    assert learner._optimizer.state_dict()["state"] == {}  # rollback forgets the moments
    assert learner.version == 2  # monotonic: the next accepted step is version 3
    learner.load_adapter_weights(tiny / "adapters" / "planner")
    assert_same(shipped, learner.lora_state())


def test_load_adapter_weights_rejects_foreign_keys(tiny: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    (tmp_path / "bad").mkdir()
    save_file({"base_model.model.other.lora_A.weight": torch.zeros(8, 4)},
              str(tmp_path / "bad" / "adapter_model.safetensors"))
    with pytest.raises(ValueError, match="keys differ"):
        make_learner(tiny).load_adapter_weights(tmp_path / "bad")


# ----- checkpoints and publish paths --------------------------------------------------------------


def fake_adapter(folder: Path, tag: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    (folder / "adapter_model.safetensors").write_text(tag)
    return folder


def test_checkpoints_keep_last_n_and_point_at_latest(tmp_path: Path) -> None:
    ckpt = AdapterCheckpoints(tmp_path / "ckpt", keep=3)
    assert ckpt.latest() is None and ckpt.versions() == []
    for version in range(1, 6):
        path = ckpt.save(version, fake_adapter(tmp_path / f"pub{version}", f"w{version}"))
        assert path == tmp_path / "ckpt" / f"v{version:06d}"
    assert ckpt.versions() == [3, 4, 5]
    assert (tmp_path / "ckpt" / "LATEST").read_text().strip() == "5"
    assert ckpt.latest() == ckpt.path(5)
    assert (ckpt.latest() / "adapter_model.safetensors").read_text() == "w5"
    assert ckpt.previous(5) == ckpt.path(4) and ckpt.previous(3) is None
    ckpt.mark_good(4)
    assert ckpt.latest_version() == 4
    with pytest.raises(FileNotFoundError):
        ckpt.mark_good(1)
    assert not any(p.name.startswith(".") for p in (tmp_path / "ckpt").iterdir())


def test_latest_good_version_is_never_pruned(tmp_path: Path) -> None:
    ckpt = AdapterCheckpoints(tmp_path / "ckpt", keep=2)
    for version in (5, 6, 7):
        ckpt.save(version, fake_adapter(tmp_path / f"pub{version}", str(version)))
    ckpt.save(2, fake_adapter(tmp_path / "pub2", "2"))  # e.g. re-saved after a restart
    assert ckpt.versions() == [2, 6, 7] and ckpt.latest_version() == 2


def test_checkpoints_clean_up_after_a_crash(tmp_path: Path) -> None:
    (tmp_path / "ckpt" / ".tmp-deadbeef").mkdir(parents=True)
    ckpt = AdapterCheckpoints(tmp_path / "ckpt", keep=2)
    assert list(ckpt.root.iterdir()) == []
    (ckpt.root / "LATEST").write_text("9\n")  # names a version that is gone
    assert ckpt.latest() is None


def test_publish_paths_are_new_for_every_version(tmp_path: Path) -> None:
    root = publish_dir(LearnerConfig(publish_dir=str(tmp_path / "shm")), tmp_path / "data")
    assert root == tmp_path / "shm" and root.is_dir()
    first, again = publish_path(root, "planner", 3), publish_path(root, "planner", 3)
    assert first != again and first.parent == root / "planner" and first.name.startswith("v3-")
    for version in range(1, 5):
        fake_adapter(publish_path(root, "planner", version), str(version))
    removed = prune_published(root / "planner", keep=2)
    assert len(removed) == 2 and sorted(p.name.split("-")[0] for p in (root / "planner").iterdir()) == ["v3", "v4"]
    with pytest.raises(ValueError):
        publish_path(root, "../etc", 1)


def test_publish_dir_is_the_data_dir_unless_a_private_tmpfs_has_room(tmp_path: Path) -> None:
    data = tmp_path / "data" / "adapters" / "published"
    assert publish_dir(LearnerConfig(), data) == data  # default: under the data dir, not a shared /dev/shm
    shm = tmp_path / "shm"
    shm.mkdir()
    config = LearnerConfig(publish_tmpfs=str(shm))
    private = publish_dir(config, data, adapter_bytes=1024)
    assert private.parent == shm and private.name.startswith("mia_engine-") and private.stat().st_mode & 0o777 == 0o700
    assert publish_dir(config, tmp_path / "other-instance", 1024) != private  # one folder per instance
    too_big = shutil.disk_usage(shm).free  # x (kept + 2) versions cannot fit
    assert publish_dir(config, data, adapter_bytes=too_big) == data
