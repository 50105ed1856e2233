"""The GRPO objective against an independent float64 computation (Python loops, analytic gradient)."""

from __future__ import annotations

import math

import msgspec
import pytest
import torch

from mia_engine.config.learner import LearnerConfig
from mia_engine.learner.grpo import grpo_loss, sequence_token_logprobs

TEMPERATURE = 0.7
CLIP_EPS = 0.2
# ratio = exp(delta) per next-token position: 1.65 and 1.57 exceed 1 + ε, 0.55 and 0.61 fall below 1 − ε.
DELTAS = [[0.5, -0.5, 0.05], [0.3, 0.4, -0.6], [-0.3, 0.1, 0.45]]
ADVANTAGES = [1.0, -0.8, 0.6]
MASK = [[1, 1, 1], [0, 1, 1], [1, 0, 1]]
REF_OFFSETS = [[0.2, -0.1, 0.3], [0.0, 0.25, -0.15], [-0.2, 0.0, 0.1]]


def _case() -> dict:
    """B=3 sequences, T=4 tokens, V=5 entries; old/ref log-probs placed relative to the model's own."""
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(3, 4, 5, generator=gen)
    input_ids = torch.randint(0, 5, (3, 4), generator=gen)
    logp = sequence_token_logprobs(logits, input_ids, TEMPERATURE)  # (3, 3)
    mask = torch.tensor(MASK, dtype=torch.float32)
    old_logp = logp - torch.tensor(DELTAS)
    old_logp[mask == 0] = math.inf  # garbage at inactive positions must not leak into the loss
    ref_logp = logp + torch.tensor(REF_OFFSETS)
    ref_logp[mask == 0] = -math.inf
    return {"logits": logits, "input_ids": input_ids, "old_logp": old_logp.detach(),
            "ref_logp": ref_logp.detach(), "mask": mask, "advantages": torch.tensor(ADVANTAGES)}


def _reference(case: dict, aggregation: str, eps_high: float, beta: float) -> tuple[float, list]:
    """Loss and d loss / d logits, token by token in float64, with the gradient derived by hand."""
    logits, ids = case["logits"].double().tolist(), case["input_ids"].tolist()
    old, ref, mask = case["old_logp"].tolist(), case["ref_logp"].tolist(), case["mask"].tolist()
    num_b, num_t, num_v = len(logits), len(logits[0]), len(logits[0][0])
    num_active = sum(sum(row) for row in mask)
    loss, grad = 0.0, [[[0.0] * num_v for _ in range(num_t)] for _ in range(num_b)]
    for b in range(num_b):
        for t in range(num_t - 1):
            if not mask[b][t]:
                continue
            x = [v / TEMPERATURE for v in logits[b][t]]
            lse = math.log(sum(math.exp(v) for v in x))
            tok = ids[b][t + 1]
            lp = x[tok] - lse
            r, adv = math.exp(lp - old[b][t]), ADVANTAGES[b]
            unclipped, clipped = r * adv, min(max(r, 1 - CLIP_EPS), 1 + eps_high) * adv
            token_loss, dloss_dlp = (-unclipped, -adv * r) if unclipped <= clipped else (-clipped, 0.0)
            if beta:
                d = ref[b][t] - lp
                token_loss += beta * (math.exp(d) - d - 1)
                dloss_dlp += beta * (1 - math.exp(d))
            weight = 1 / (num_b * sum(mask[b])) if aggregation == "grpo" else 1 / num_active
            loss += weight * token_loss
            for v in range(num_v):
                softmax_v = math.exp(x[v] - lse)
                grad[b][t][v] += weight * dloss_dlp * ((v == tok) - softmax_v) / TEMPERATURE
    return loss, grad


def _torch_loss(case: dict, aggregation: str, eps_high: float | None, beta: float, **kwargs):
    logits = case["logits"].clone().requires_grad_(True)
    logp = sequence_token_logprobs(logits, case["input_ids"], TEMPERATURE)
    loss, stats = grpo_loss(logp, case["old_logp"], case["advantages"], case["mask"], clip_eps=CLIP_EPS,
                            clip_eps_high=eps_high, aggregation=aggregation, ref_logp=case["ref_logp"],
                            kl_beta=beta, **kwargs)
    (grad,) = torch.autograd.grad(loss, logits)
    return loss, grad, stats


@pytest.mark.parametrize("aggregation", ["grpo", "dapo"])
@pytest.mark.parametrize("eps_high", [None, 0.6])
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_loss_and_gradient_match_independent_computation(aggregation: str, eps_high: float | None,
                                                         beta: float) -> None:
    case = _case()
    loss, grad, stats = _torch_loss(case, aggregation, eps_high, beta)
    ref_loss, ref_grad = _reference(case, aggregation, CLIP_EPS if eps_high is None else eps_high, beta)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-5, abs=1e-7)
    torch.testing.assert_close(grad, torch.tensor(ref_grad, dtype=torch.float32), rtol=1e-4, atol=1e-6)
    # 7 active tokens; clipped: (0,0) r=1.65 A>0, (1,2) r=0.55 A<0, and (2,2) r=1.57 A>0 unless ε_high=0.6.
    assert stats["clip_fraction"] == pytest.approx((3 if eps_high is None else 2) / 7)
    assert math.isfinite(stats["ratio_mean"]) and stats["kl"] > 0


def test_clipping_is_active_in_the_case() -> None:
    """Guard the test data: some clipped tokens carry no gradient at all."""
    case = _case()
    _, grad, _ = _torch_loss(case, "grpo", None, 0.0)
    assert grad[0, 0].abs().max() == 0 and grad[1, 2].abs().max() == 0 and grad[2, 2].abs().max() == 0
    assert grad[0, 1].abs().max() > 0 and grad[1, 1].abs().max() > 0


@pytest.mark.parametrize("aggregation", ["grpo", "dapo"])
def test_split_batch_with_full_normalizer_sums_to_full_loss(aggregation: str) -> None:
    """What micro-batch accumulation relies on: per-part losses with the full denominator add up."""
    case = _case()
    full, full_grad, _ = _torch_loss(case, aggregation, None, 0.1)
    normalizer = 3.0 if aggregation == "grpo" else float(case["mask"].sum())
    total, total_grad = 0.0, torch.zeros_like(full_grad)
    for rows in (slice(0, 1), slice(1, 3)):
        part = {k: v[rows] for k, v in case.items()}
        loss, grad, _ = _torch_loss(part, aggregation, None, 0.1, normalizer=normalizer)
        total += loss.item()
        total_grad[rows] = grad
    assert total == pytest.approx(full.item(), rel=1e-6)
    torch.testing.assert_close(total_grad, full_grad)


def test_sequence_token_logprobs_is_shifted_log_softmax() -> None:
    gen = torch.Generator().manual_seed(1)
    logits, ids = torch.randn(2, 6, 11, generator=gen), torch.randint(0, 11, (2, 6), generator=gen)
    got = sequence_token_logprobs(logits, ids, 2.0)
    expected = torch.log_softmax(logits[:, :-1] / 2.0, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert got.shape == (2, 5)
    torch.testing.assert_close(got, expected)


def test_inactive_tokens_may_hold_infinities() -> None:
    logp = torch.zeros(1, 3, requires_grad=True)
    old = torch.tensor([[0.0, math.inf, -math.inf]])
    mask = torch.tensor([[1.0, 0.0, 0.0]])
    loss, stats = grpo_loss(logp, old, torch.tensor([1.0]), mask, clip_eps=0.2, clip_eps_high=None,
                            aggregation="dapo", ref_logp=old, kl_beta=0.5)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert stats == {"clip_fraction": 0.0, "ratio_mean": 1.0, "kl": 0.0}


def test_config_defaults_are_the_papers_with_a_lora_learning_rate() -> None:
    config = LearnerConfig()
    assert (config.kl_beta, config.num_epochs, config.aggregation) == (0.0, 1, "grpo")
    assert config.lr == 1e-4  # a LoRA's rate (bench/bench_lr_curve.py), not the reference's full fine-tuning 1e-6
    assert config.clip_high == 0.2 and LearnerConfig(clip_eps_high=0.28).clip_high == 0.28


@pytest.mark.parametrize("field, value", [
    ("lr", 0.0), ("lr", math.nan), ("clip_eps", 1.0), ("clip_eps_high", 0.0), ("kl_beta", -0.1),
    ("temperature", 0.0), ("max_grad_norm", -1.0), ("micro_batch_size", 0), ("num_epochs", 0),
    ("advantage_eps", 0.0), ("num_checkpoints_kept", 0), ("num_reports_kept", 0), ("weight_decay", -1.0), ("device", " "),
])
def test_config_rejects_out_of_range(field: str, value: object) -> None:
    with pytest.raises(msgspec.ValidationError, match=field):
        msgspec.convert({field: value}, LearnerConfig)


def test_config_rejects_unknown_fields_and_aggregations() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"learning_rate": 1e-5}, LearnerConfig)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"aggregation": "mean"}, LearnerConfig)
