"""The doctor's GRPO-step figures that need no GPU: the step's tokens at each length, its model FLOPs,
and its share of a GPU's bf16 peak from the table keyed by device name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mia_engine.deploy.shapes import decoder_shape
from mia_engine.doctor import QWEN3_8B, peak_share, step_flops
from mia_engine.doctor.random_stack import grpo_samples

QWEN3_8B_CONFIG = Path(__file__).parent / "deploy" / "fixtures" / "qwen3-8b" / "config.json"


@pytest.mark.parametrize("seq_len, num_groups, group_size", [(4096, 2, 4), (8192, 2, 2), (16384, 1, 2), (64, 2, 4)])
def test_the_step_keeps_about_32k_tokens_in_groups_with_a_reward_spread(seq_len: int, num_groups: int,
                                                                          group_size: int) -> None:
    samples = grpo_samples(QWEN3_8B["vocab_size"], seq_len)
    groups = {s.group_id: [t.reward for t in samples if t.group_id == s.group_id] for s in samples}
    assert len(groups) == num_groups and all(len(r) == group_size and len(set(r)) == 2 for r in groups.values())
    assert all(len(s.prompt_ids) + len(s.completion_ids) == seq_len for s in samples)


def test_model_flops_reproduce_the_issues_figure_and_grow_with_attention_at_16k() -> None:
    """36 layers, 8 x 4096 tokens: 6·N·tokens = 1.61 PFLOP; at 7.5 s on an H100 SXM that is 21.7 % of
    its 989.4 TFLOP/s. At 16k, causal attention adds four times as much per token as at 4k."""
    shape = decoder_shape(json.loads(QWEN3_8B_CONFIG.read_text()))
    linear, attention = step_flops(shape, 8, 4096)
    assert linear == 6 * 8_190_735_360 * 32768
    assert attention == 8 * 36 * 4096**2 * 32 * 128 * 8
    line = peak_share((linear, attention), 7.5, "NVIDIA H100 80GB HBM3")
    assert line.startswith("215 TFLOP/s = 21.7 % of the NVIDIA H100 80GB HBM3 bf16 dense peak (989) by 6*N*tokens")
    assert line.endswith("23.8 % with attention")
    long_linear, long_attention = step_flops(shape, 2, 16384)
    assert long_linear == linear and long_attention == 4 * attention


@pytest.mark.parametrize("name, peak", [("NVIDIA H100 PCIe", 756), ("NVIDIA H100 NVL", 835), ("NVIDIA H200", 989),
                                        ("NVIDIA H200 NVL", 835), ("NVIDIA A100-SXM4-80GB", 312)])
def test_the_peak_comes_from_the_table_by_device_name(name: str, peak: int) -> None:
    assert f"bf16 dense peak ({peak}) by" in peak_share((1e15, 0.0), 1.0, name)


def test_an_unknown_gpu_says_peak_unknown() -> None:
    assert peak_share((1e15, 0.0), 1.0, "NVIDIA GeForce RTX 4090") == (
        "1000 TFLOP/s by 6*N*tokens, NVIDIA GeForce RTX 4090: bf16 peak unknown")
