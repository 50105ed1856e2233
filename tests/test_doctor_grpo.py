"""The doctor's GRPO-step figures that need no GPU: the step's tokens at each length, its FLOPs under the
three counts of ``doctor/flops.py`` (by hand for a small shape, and the issue's Qwen3-8B figures), the
share of a GPU's bf16 peak from the table keyed by device name, and the MFU floor (a pure verdict, and
the check itself run at CPU size against a stand-in peak)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mia_engine.config.learner import LearnerConfig
from mia_engine.deploy.shapes import decoder_shape
from mia_engine.doctor import QWEN3_8B, bf16_peak_tflops, check_grpo_step, utilization_report
from mia_engine.doctor.flops import StepFlops, floor_failure, step_flops, utilization
from mia_engine.doctor.random_stack import grpo_samples

QWEN3_8B_CONFIG = Path(__file__).parent / "deploy" / "fixtures" / "qwen3-8b" / "config.json"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("seq_len, num_groups, group_size", [(4096, 2, 4), (8192, 2, 2), (16384, 1, 2), (64, 2, 4)])
def test_the_step_keeps_about_32k_tokens_in_groups_with_a_reward_spread(seq_len: int, num_groups: int,
                                                                          group_size: int) -> None:
    samples = grpo_samples(QWEN3_8B["vocab_size"], seq_len)
    groups = {s.group_id: [t.reward for t in samples if t.group_id == s.group_id] for s in samples}
    assert len(groups) == num_groups and all(len(r) == group_size and len(set(r)) == 2 for r in groups.values())
    assert all(len(s.prompt_ids) + len(s.completion_ids) == seq_len for s in samples)


def test_step_flops_by_hand() -> None:
    """H 8, 2 query heads and 1 KV head of 4, I 16, V 32, 2 layers, LoRA r 2; 3 sequences of 5 tokens
    (15), 3 scored each, 1 layer recomputed. A layer's projections: q 64 + k, v 64 + o 64 + MLP 384 =
    576 multiply-adds a token; its LoRA 2 x (64 in + 64 out) = 256; attention 2·T·d = 80; head 256.
    6N: 6·(2·576 + 256)·15 + 3·80·2·15 = 133,920. Required: forward (2·576 + 2·256 + 80)·2·15 = 52,320;
    backward (2·576 + 4·256 + 2·80)·2·15 − 2·(128 + 3·2·8)·15 (the first layer's q, k, v and their A's
    need no input gradient) = 64,800; head 4·256·3·3 = 9,216; 126,336 in all. Recompute: one layer's
    forward but down's LoRA B product (2·2·8): (2·576 + 2·256 − 32 + 80)·15 = 25,680."""
    shape = decoder_shape({"model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2,
                           "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 16, "vocab_size": 32})
    flops = step_flops(shape, 2, 3, 5, 3, 1)
    assert flops == StepFlops(six_n=133_920.0, required=126_336.0, recompute=25_680.0)
    assert flops.hardware == 152_016.0


def test_qwen3_8b_figures_are_the_issues_and_attention_grows_at_16k() -> None:
    """The 36-layer step with every layer recomputed took 5.33 s at 8 x 4096 and 5.66 s at 2 x 16384 on an
    H100 SXM: 30.5 % of its peak by the 6N convention, but 21.3 % (4k) and 26.4 % (16k) model-FLOPs
    utilisation, the recompute 31 % of what the GPU computed. At 16k, causal attention per token is four
    times that at 4k."""
    shape = decoder_shape(json.loads(QWEN3_8B_CONFIG.read_text()))
    short, long = step_flops(shape, 64, 8, 4096, 3072, 36), step_flops(shape, 64, 2, 16384, 12288, 36)
    peak = bf16_peak_tflops(H100)
    assert round(100 * utilization(short.six_n, 5.33, peak), 1) == 30.5
    assert round(100 * utilization(short.required, 5.33, peak), 1) == 21.3
    assert round(100 * utilization(long.required, 5.66, peak), 1) == 26.4
    assert round(short.recompute / short.hardware, 2) == 0.31
    attention = 6 * 36 * 4096 * 32 * 128 * 32768  # 12·L·T·d·tokens / 2
    assert long.six_n - short.six_n == 3 * attention


def test_the_report_gives_mfu_beside_the_6n_and_hardware_shares() -> None:
    flops = StepFlops(six_n=1.5e15, required=1.0e15, recompute=0.5e15)
    line, failure = utilization_report(flops, 5.0, 1000.0, H100, 0.0)
    assert line == ("MFU 20.0 % (200 TFLOP/s of the 1.000 PFLOP a LoRA step requires), 30.0 % by the 6N convention "
                    "(1.500 PFLOP, a full fine-tuning step's), hardware 30.0 % (recompute 33.3 % of the hardware "
                    f"FLOPs) of the {H100} bf16 dense peak (1000 TFLOP/s)")
    assert failure == ""
    assert utilization_report(flops, 5.0, 1000.0, H100, 0.25)[1] == (
        "MFU 20.0 % is under learner.min_model_flops_utilization (25.0 %)")


@pytest.mark.parametrize("name, peak", [("NVIDIA H100 PCIe", 756), ("NVIDIA H100 NVL", 835), ("NVIDIA H200", 989),
                                        ("NVIDIA H200 NVL", 835), ("NVIDIA A100-SXM4-80GB", 312), (H100, 989)])
def test_the_peak_comes_from_the_table_by_device_name(name: str, peak: int) -> None:
    assert round(bf16_peak_tflops(name)) == peak


def test_an_unknown_gpu_gives_the_rate_and_fails_a_floor() -> None:
    flops = StepFlops(six_n=1.5e15, required=1.0e15, recompute=0.0)
    line, failure = utilization_report(flops, 1.0, bf16_peak_tflops("NVIDIA GeForce RTX 4090"), "RTX 4090", 0.0)
    assert line.endswith("RTX 4090: bf16 peak unknown") and line.startswith("1000 TFLOP/s required") and not failure
    assert "bf16 peak is unknown" in utilization_report(flops, 1.0, None, "RTX 4090", 0.3)[1]


@pytest.mark.parametrize("mfu, floor, fails", [(0.21, 0.0, False), (0.21, 0.4, True), (0.41, 0.4, False),
                                               (0.4, 0.4, False), (None, 0.0, False), (None, 0.4, True)])
def test_the_floor_verdict(mfu: float | None, floor: float, fails: bool) -> None:
    assert bool(floor_failure(mfu, floor)) == fails


def test_the_check_fails_under_the_floor_and_compares_a_step_with_every_layer_recomputed() -> None:
    """The CPU-size step against a stand-in peak of 10^6 TFLOP/s, which puts any CPU far under a 1 % floor
    (passing over a floor is the verdict's, above; without a stand-in a CPU run measures no share). With
    no layer recomputed, the check also times a step with every layer recomputed."""
    config = LearnerConfig(min_model_flops_utilization=0.01, checkpoint_layers=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads on a shared 2-core machine wait on each other
    try:
        check = check_grpo_step("cpu", True, 2, 64, config, peak_tflops=1e6)
    finally:
        torch.set_num_threads(threads)
    assert check.status == "FAIL" and check.detail.endswith("is under learner.min_model_flops_utilization (1.0 %)")
    assert "MFU 0.0 %" in check.detail and "by the 6N convention" in check.detail, check.detail
    assert "(recompute 0.0 % of the hardware FLOPs)" in check.detail and "; 0 of 2 layers recomputed" in check.detail
    assert "; every layer recomputed: " in check.detail and " s a step, MFU 0.0 %" in check.detail, check.detail
