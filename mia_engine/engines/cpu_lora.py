"""LoRA matmuls for vLLM's CPU backend: one matmul per adapter in the batch, installed as a vLLM plugin.

vLLM's PyTorch-native punica ops (``vllm.lora.ops.torch_ops``, used by ``PunicaWrapperCPU``) gather a
whole adapter matrix per token (tokens × out × rank) and contract it with ``einsum``. On a small model
that gather costs more than the model itself: on the tiny model it was 60% of the engine's forward
time in the research benchmark (py-spy, bench/RESULTS.md). They also read index -1 ("no adapter") as
the last adapter slot, so a base-model request batched with a full set of adapters picks up the last
one. These replacements group the tokens by adapter and do one matmul per adapter present, and treat
-1 as no adapter.

vLLM loads ``vllm.general_plugins`` entry points in every process it starts (engine core, workers);
``register`` swaps the ops in only when the spawning engine asked for them through ``ENV``, so other
vLLM programs in the same environment are untouched.
"""

from __future__ import annotations

import os

import torch

ENV = "MIA_CPU_LORA_OPS"
"""Set to ``grouped`` in the engine's spawn environment to install these ops."""
GATHER_MAX_TOKENS = 128
"""Up to this many tokens (decode steps) the per-token gather is cheaper than grouping."""


def _lora_delta(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                dtype: torch.dtype) -> torch.Tensor:
    """Per token, ``inputs @ weights[index].T`` (zero where index < 0), in ``dtype``."""
    if weights.dim() == 4:  # (slots, 1, out, in)
        weights = weights.squeeze(1)
    inputs = inputs.to(dtype)
    if inputs.shape[0] <= GATHER_MAX_TOKENS:  # vLLM's gather (cheapest for decode), then -1 rows zeroed
        out = torch.einsum("bi,boi->bo", inputs, weights[indices].to(dtype))
        no_adapter = indices < 0
        if no_adapter.any():
            out.masked_fill_(no_adapter.unsqueeze(1), 0)
        return out
    slots = torch.unique(indices).tolist()
    if len(slots) == 1 and slots[0] >= 0:  # one adapter for the whole batch: a plain matmul
        return inputs @ weights[slots[0]].to(dtype).T
    out = inputs.new_zeros((inputs.shape[0], weights.shape[1]))
    for slot in slots:
        if slot < 0:
            continue
        rows = (indices == slot).nonzero().squeeze(1)
        out[rows] = inputs[rows] @ weights[slot].to(dtype).T
    return out


def bgmv_shrink(inputs: torch.Tensor, lora_a_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, scaling: float = 1.0) -> None:
    out = _lora_delta(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : out.shape[1]] = scaling * out


def bgmv_expand(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, add_inputs: bool = True) -> None:
    out = _lora_delta(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = 1 if out.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    width = min(out.shape[1], output_tensor.shape[1])  # adapter and model may pad differently
    if add_inputs:
        output_tensor[:, :width] += out[:limit, :width]
    else:
        output_tensor[:, :width] = out[:limit, :width]


def bgmv_expand_slice(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                      lora_indices_tensor: torch.Tensor, slice_offset: int, slice_size: int,
                      add_inputs: bool = True) -> None:
    out = _lora_delta(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset: slice_offset + slice_size] += out
    else:
        output_tensor[:, slice_offset: slice_offset + slice_size] = out


def sgmv_shrink(inputs: torch.Tensor, lora_a_weights: torch.Tensor, output_tensor: torch.Tensor,
                b_seq_start_loc: torch.Tensor, seq_len_tensor: torch.Tensor, lora_indices_tensor: torch.Tensor,
                batches: int, max_seq_length: int, token_nums: int, scaling: float) -> None:
    bgmv_shrink(inputs, lora_a_weights, output_tensor,
                torch.repeat_interleave(lora_indices_tensor, seq_len_tensor), scaling)


def sgmv_expand(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                b_seq_start_loc: torch.Tensor, seq_len_tensor: torch.Tensor, lora_indices_tensor: torch.Tensor,
                batches: int, max_seq_length: int, token_nums: int, add_inputs: bool = False) -> None:
    bgmv_expand(inputs, lora_b_weights, output_tensor,
                torch.repeat_interleave(lora_indices_tensor, seq_len_tensor), add_inputs)


def sgmv_expand_slice(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                      b_seq_start_loc: torch.Tensor, seq_len_tensor: torch.Tensor,
                      lora_indices_tensor: torch.Tensor, batches: int, max_seq_length: int, token_nums: int,
                      slice_offset: int, slice_size: int, add_inputs: bool = False) -> None:
    bgmv_expand_slice(inputs, lora_b_weights, output_tensor,
                      torch.repeat_interleave(lora_indices_tensor, seq_len_tensor), slice_offset, slice_size,
                      add_inputs)


OPS = {f.__name__: f for f in (bgmv_shrink, bgmv_expand, bgmv_expand_slice, sgmv_shrink, sgmv_expand,
                               sgmv_expand_slice)}


def register() -> None:
    """The ``vllm.general_plugins`` entry point; a no-op unless the engine's environment asks for it."""
    if os.environ.get(ENV) != "grouped":
        return
    from vllm.lora.punica_wrapper import punica_cpu

    missing = [name for name in OPS if not hasattr(punica_cpu, name)]
    if missing:  # a vLLM whose CPU wrapper no longer uses these names: the engine must not start half-patched
        raise RuntimeError(f"grouped CPU LoRA ops requested but vLLM's punica_cpu has no {missing}; "
                           "set engines.<name>.cpu_lora_ops = \"vllm\" to run vLLM's own ops")
    for name, op in OPS.items():
        setattr(punica_cpu, name, op)
