"""Selective recompute (``learner/recompute.py``) on the tiny model: the layers it picks are the ones
recomputed (counted matmul FLOPs equal ``doctor/flops.py``'s formula exactly), the loss and gradients do
not change, the memory-based choice, and the per-token bytes a kept layer holds."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import flop_registry

from mia_engine.config.learner import LearnerConfig
from mia_engine.deploy.shapes import decoder_shape
from mia_engine.doctor.flops import step_flops
from mia_engine.doctor.random_stack import grpo_samples
from mia_engine.learner.learner import PlannerLearner
from mia_engine.learner.recompute import kept_bytes_per_token, num_recomputed_layers

SEQ_LEN = 32  # grpo_samples: 8 sequences of 32 tokens, a quarter of them prompt
TINY_RANK = 8


class MatmulFlops(TorchDispatchMode):
    """Counts the FLOPs of every op in torch's FLOP table (mm, addmm, bmm: the projections, LoRA and the
    head); the CPU attention kernel is not in the table and is noted by name instead."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func: Callable, types: tuple, args: tuple = (), kwargs: dict | None = None) -> object:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        self.ops.add(str(packet))
        if packet in flop_registry:
            shape = lambda t: t.shape if isinstance(t, torch.Tensor) else t  # noqa: E731
            self.flops += flop_registry[packet](*tree_map(shape, args), **tree_map(shape, kwargs),
                                                out_val=tree_map(shape, out))
        return out


def make_learner(tiny: Path, **overrides: object) -> PlannerLearner:
    return PlannerLearner(tiny / "base", tiny / "adapters" / "planner", LearnerConfig(micro_batch_size=1, **overrides))


@pytest.mark.parametrize("is_checkpointing, checkpoint_layers, num_recomputed",
                         [(False, -1, 0), (True, 0, 0), (True, 1, 1), (True, -1, 2)])
def test_the_chosen_layers_are_recomputed_and_the_flops_are_the_formulas(
        tiny: Path, is_checkpointing: bool, checkpoint_layers: int, num_recomputed: int) -> None:
    """Every matmul of the step counted: the required FLOPs plus one forward of each recomputed layer, to
    the FLOP (attention aside: the CPU kernel is not in torch's table, so its share is taken out by hand).
    On a CPU, -1 recomputes every layer."""
    samples = grpo_samples(2048, SEQ_LEN)
    learner = make_learner(tiny, gradient_checkpointing=is_checkpointing, checkpoint_layers=checkpoint_layers)
    with MatmulFlops() as counter:
        learner.gradients(samples)
    assert learner.recompute.num_recomputed == num_recomputed or not is_checkpointing
    assert "aten._scaled_dot_product_flash_attention_for_cpu_backward" in counter.ops
    shape = decoder_shape(json.loads((tiny / "base" / "config.json").read_text()))
    flops = step_flops(shape, TINY_RANK, len(samples), SEQ_LEN, SEQ_LEN - SEQ_LEN // 4, num_recomputed)
    q, tokens = shape.num_heads * shape.head_dim, len(samples) * SEQ_LEN
    attention = 2 * SEQ_LEN * q * tokens * (3 * shape.num_layers + num_recomputed)  # causal fwd, 2x bwd, recompute
    assert counter.flops == flops.hardware - attention


@pytest.mark.parametrize("checkpoint_layers", [0, 1, -1])
def test_recompute_leaves_the_loss_and_the_gradients_unchanged(tiny: Path, checkpoint_layers: int) -> None:
    samples = grpo_samples(2048, SEQ_LEN)
    want = make_learner(tiny, gradient_checkpointing=False)
    got = make_learner(tiny, checkpoint_layers=checkpoint_layers)
    want_grads, got_grads = want.gradients(samples), got.gradients(samples)
    assert want_grads.keys() == got_grads.keys()
    for key, grad in want_grads.items():
        torch.testing.assert_close(got_grads[key], grad, rtol=1e-5, atol=1e-7, msg=key)
    want_step, got_step = want.step(samples), got.step(samples)
    assert got_step.is_accepted and got_step.loss == pytest.approx(want_step.loss, rel=1e-6, abs=1e-9)
    for key, weight in want.lora_state().items():
        torch.testing.assert_close(got.lora_state()[key], weight, rtol=1e-5, atol=1e-7, msg=key)


@pytest.mark.parametrize("room_gib, num_tokens, want", [
    (100.0, 4096, 0),    # everything fits: nothing recomputed
    (10.0, 4096, 23),    # 10 GiB: 36 inputs of 32 MiB (1.125 GiB), then 13 kept layers of 688 MiB more each
    (10.0, 16384, 34),   # four times the tokens: 4.5 GiB of inputs, 2 kept layers of 2752 MiB
    (1.0, 4096, 36),     # not even the inputs fit: all recomputed (the step may still fail)
    (-5.0, 4096, 36),    # less than nothing free
])
def test_the_fewest_layers_that_let_the_rest_fit_are_recomputed(room_gib: float, num_tokens: int, want: int) -> None:
    """36 layers, 180 KiB a token kept, 8 KiB (a bf16 row of 4096) recomputed."""
    assert num_recomputed_layers(36, num_tokens, 180 * 1024, 8 * 1024, int(room_gib * 2**30)) == want


def test_a_kept_layer_holds_what_its_backward_reads(tiny: Path) -> None:
    """Measured with the learner's bf16 autocast, against a count by hand of what a Qwen3 layer saves: in
    bf16 the MLP's four I-wide tensors (gate, up, their activation, its product: down's input), the
    attention and MLP norms' outputs, q (twice: before and after the rotary), k and v (and k before the
    rotary), the seven LoRA A outputs and the rotary tables; in float32 the two RMSNorms' and the q/k
    norms' inputs (every RMSNorm computes in float32 and keeps that copy), their reciprocal norms and the
    attention's log-sum-exp per head."""
    learner = make_learner(tiny, dtype="bfloat16")
    layers = learner.recompute.layers
    h, q, kv, i, d, heads, kv_heads = 128, 128, 64, 256, 32, 4, 2
    bf16 = 4 * i + 2 * h + 2 * q + 2 * kv + 7 * TINY_RANK + 2 * d
    fp32 = 2 * h + q + kv + 2 + heads + kv_heads + heads
    measured = kept_bytes_per_token(learner._decoder, layers, learner.config)
    assert measured == pytest.approx(2 * bf16 + 4 * fp32, rel=0.05)


def test_on_a_cpu_every_layer_is_recomputed_by_default(tiny: Path) -> None:
    learner = make_learner(tiny)
    learner.step(grpo_samples(2048, SEQ_LEN))
    assert learner.recompute.num_recomputed == 2
    assert [layer.gradient_checkpointing for layer in learner.recompute.layers] == [True, True]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_layers_are_kept_while_memory_allows(tmp_path: Path) -> None:
    """The tiny model's micro-batches fit any GPU: nothing is recomputed, the gradients are those of no
    checkpointing; a headroom larger than the GPU recomputes every layer."""
    from mia_engine.models.tiny import build_tiny

    build_tiny(tmp_path)
    samples = grpo_samples(2048, SEQ_LEN)
    grads = {}
    for name, overrides in (("none", {"gradient_checkpointing": False}), ("auto", {}),
                            ("all", {"checkpoint_headroom_gib": 1e6})):
        learner = make_learner(tmp_path, device="cuda", dtype="bfloat16", **overrides)
        grads[name] = learner.gradients(samples)
        if name != "none":
            assert learner.recompute.num_recomputed == (0 if name == "auto" else 2), name
    for name in ("auto", "all"):
        for key, grad in grads["none"].items():
            torch.testing.assert_close(grads[name][key], grad, rtol=2e-2, atol=1e-5, msg=f"{name} {key}")
