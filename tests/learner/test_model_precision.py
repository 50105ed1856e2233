"""How the learner's model computes (``learner/model.py``), on the tiny model: attention through
``scaled_dot_product_attention`` with the causal flag and no mask where nothing is padded (what lets a
GPU pick its flash kernel), and in bf16 no float32 copy of a base weight or of a projection's input or
output (the LoRA weights alone stay float32: the optimizer's masters)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from mia_engine.config.learner import LearnerConfig
from mia_engine.doctor.random_stack import grpo_samples
from mia_engine.learner.batching import GRPOSample
from mia_engine.learner.learner import PlannerLearner
from mia_engine.learner.model import autocast


class AttentionCalls(TorchFunctionMode):
    """Records how each ``scaled_dot_product_attention`` is called: (has a mask, is causal)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[bool, bool]] = []

    def __torch_function__(self, func: Callable, types: tuple, args: tuple = (), kwargs: dict | None = None) -> object:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            self.calls.append((mask is not None, bool(kwargs.get("is_causal", False))))
        return func(*args, **kwargs)


def make_learner(tiny: Path, **overrides: object) -> PlannerLearner:
    return PlannerLearner(tiny / "base", tiny / "adapters" / "planner", LearnerConfig(**overrides))


def test_unpadded_micro_batches_take_causal_sdpa_without_a_mask(tiny: Path) -> None:
    learner = make_learner(tiny, micro_batch_size=1)
    with AttentionCalls() as attention:
        learner.gradients(grpo_samples(2048, 32))
    assert attention.calls and set(attention.calls) == {(False, True)}, attention.calls


def test_padded_micro_batches_pass_their_mask(tiny: Path) -> None:
    samples = [GRPOSample(prompt_ids=[5, 6, 7], completion_ids=list(range(10, 10 + n)), reward=float(i % 2),
                          group_id="g") for i, n in enumerate((4, 9))]
    learner = make_learner(tiny, micro_batch_size=2)
    with AttentionCalls() as attention:
        learner.gradients(samples)
    assert attention.calls and all(has_mask for has_mask, _ in attention.calls), attention.calls


def test_a_bf16_learner_keeps_float32_only_for_lora_and_the_norms(tiny: Path) -> None:
    """Base weights bf16, LoRA weights float32. Per token, a layer saves for its backward float32 only
    where the model computes in float32: the four RMSNorms' inputs (attention, MLP, q and k heads), their
    reciprocal norms and the attention's log-sum-exp. No op makes a float32 tensor as wide as the MLP
    (256; the norms' are 128 wide at most), as PEFT's cast of each adapted layer's input to the LoRA
    weights' dtype would, for the down projection."""
    learner = make_learner(tiny, dtype="bfloat16")
    for name, param in learner.model.named_parameters():
        assert param.dtype == (torch.float32 if ".lora_" in name else torch.bfloat16), name
    h, q, kv, heads, kv_heads = 128, 128, 64, 4, 2
    norms_and_lse = 4 * (2 * h + q + kv + 2 + heads + kv_heads + heads)
    (short, _), (long, widths) = (_float32_saved_bytes(learner, length) for length in (64, 192))
    assert (long - short) / 128 == norms_and_lse
    assert 256 not in widths, widths


class Float32Widths(TorchDispatchMode):
    """The last dimensions of the float32 tensors that ops make."""

    def __init__(self) -> None:
        super().__init__()
        self.widths: set[int] = set()

    def __torch_dispatch__(self, func: Callable, types: tuple, args: tuple = (), kwargs: dict | None = None) -> object:
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.dim() >= 2:
            self.widths.add(out.shape[-1])
        return out


def _float32_saved_bytes(learner: PlannerLearner, length: int) -> tuple[int, set[int]]:
    """Bytes of the float32 storages the second layer saves for the backward over ``length`` tokens, and
    the widths of the float32 tensors made in the forward (``Float32Widths``)."""
    storages, inside = {}, [False]
    layer = learner.recompute.layers[1]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if inside[0] and tensor.dtype == torch.float32 and not isinstance(tensor, torch.nn.Parameter):
            storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    for m in learner.recompute.layers:
        m.gradient_checkpointing = False
    hooks = [layer.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True)),
             layer.register_forward_hook(lambda *_: inside.__setitem__(0, False))]
    with autocast(learner.config), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            Float32Widths() as made:
        learner._decoder(input_ids=torch.arange(length)[None], use_cache=False)
    for hook in hooks:
        hook.remove()
    return sum(storages.values()), made.widths
