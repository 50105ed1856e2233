"""LoRA matmuls for vLLM's CPU backend: one matmul per adapter in the batch.

vLLM's PyTorch-native punica ops (``vllm.lora.ops.torch_ops``, used by ``PunicaWrapperCPU``) gather a
whole adapter matrix per token (tokens × out × rank) and contract it with ``einsum``; on a small model
that gather costs more than the model itself. They also read index -1 ("no adapter") as the last
adapter slot, so a base-model request batched with a full set of adapters picks up the last one. These
replacements group the tokens by adapter and do one matmul per adapter present, and treat -1 as no
adapter (the fix ``upstream/vllm-torch-ops-no-adapter.patch`` proposes to vLLM; its regression test
here is ``tests/engines/test_cpu_lora.py::test_no_adapter_means_no_adapter_even_when_the_last_slot_is_loaded``).
A linear layer's LoRA (``lora_linear``) goes further: all its slices (q, k, v) and, in small steps, all
adapters of the step in one shrink and one expand, on the adapters stacked once per load, the tokens
grouped once per step.

How they reach vLLM, through its extension points and nothing else: the ``vllm.platform_plugins``
entry point (``engines/platforms.py: platform_plugin``) makes a CPU build of vLLM use ``platform.py``,
vLLM's CPU platform whose Punica wrapper follows each engine's own config (``additional_config``, key
``options.LORA_OPS_KEY``, set from ``engines.<name>.cpu.lora_ops``); the grouped wrapper
(``punica.py``) runs vLLM's own CPU wrapper code on these ops. vLLM's modules are never modified, so
engines and other vLLM programs in this environment that do not ask for the ops keep vLLM's.
"""

from __future__ import annotations

import torch

GATHER_MAX_ELEMENTS = 196_608
"""Up to this many gathered weight elements (tokens × out × in) the per-token gather is cheaper than
grouping (one einsum instead of a loop over adapters). A size, not a token count, because the gather
copies a whole adapter matrix per token; measured with ``bench/bench_cpu_lora.py``, the two cross at
about this size on both models served here. A single token always goes the grouped way: it has one
adapter, so that is one plain matmul."""


def gathers(tokens: int, out: int, inputs: int) -> bool:
    """Whether a step of ``tokens`` on (out × in) adapter matrices takes the per-token gather."""
    return 1 < tokens and tokens * out * inputs <= GATHER_MAX_ELEMENTS


def _gathered_delta(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """vLLM's gather, then the no-adapter (-1) rows zeroed."""
    out = torch.einsum("bi,boi->bo", inputs, weights[indices].to(inputs.dtype))
    no_adapter = indices < 0
    if no_adapter.any():
        out.masked_fill_(no_adapter.unsqueeze(1), 0)
    return out


def token_groups(indices: torch.Tensor) -> list[tuple[int, torch.Tensor | None]]:
    """The step's tokens by adapter slot: ``(slot, rows)``, rows None when one slot has every token;
    tokens without an adapter (-1) are in no group. The wrapper computes it once per step
    (``update_metadata``) for every LoRA layer of that step; a single grouped op computes its own."""
    slots = torch.unique(indices).tolist()
    if len(slots) == 1:
        return [] if slots[0] < 0 else [(slots[0], None)]
    return [(slot, (indices == slot).nonzero().squeeze(1)) for slot in slots if slot >= 0]


def _grouped_delta(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """One matmul per adapter present in the batch (a plain matmul when one adapter has all tokens)."""
    dtype = inputs.dtype
    groups = token_groups(indices)
    if len(groups) == 1 and groups[0][1] is None:
        return inputs @ weights[groups[0][0]].to(dtype).T
    out = inputs.new_zeros((inputs.shape[0], weights.shape[1]))
    for slot, rows in groups:
        out[rows] = inputs[rows] @ weights[slot].to(dtype).T
    return out


def _lora_delta(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                dtype: torch.dtype) -> torch.Tensor:
    """Per token, ``inputs @ weights[index].T`` (zero where index < 0), in ``dtype``."""
    if weights.dim() == 4:  # (slots, 1, out, in)
        weights = weights.squeeze(1)
    inputs = inputs.to(dtype)
    if gathers(inputs.shape[0], weights.shape[1], weights.shape[2]):
        return _gathered_delta(inputs, weights, indices)
    return _grouped_delta(inputs, weights, indices)


class StackedLayer:
    """A LoRA linear layer's adapters, every slot and slice, as one shrink and one expand matrix.

    vLLM keeps one ``(slots, 1, rank, in)`` A and one ``(slots, 1, out, rank)`` B per slice and writes a
    slot in place when it loads an adapter. Rebuilding the stacked layout per layer and step is a
    sizeable part of ``lora_linear``'s time, so it is kept and rebuilt only when one of vLLM's tensors was
    written since (their version counters, which every in-place write bumps). Columns are slot-major:
    slot ``s``'s slice ``i`` is rank block ``s * slices + i``, so a run of slots is a contiguous view.

    Float32 for the shrink and for small expands: a bf16 matmul on CPU goes through oneDNN, which
    builds a primitive per input shape, and the step's token count changes every step; with a new token
    count per call (one thread, as vLLM's CPU worker runs) float32 measured several times faster. Large
    expands (``NATIVE_EXPAND_MIN_ELEMENTS``) write so much that the layer's own dtype wins despite that,
    so B is also kept in it (``b_native``, built on first use)."""

    def __init__(self, lora_a: tuple[torch.Tensor, ...], lora_b: tuple[torch.Tensor, ...]) -> None:
        self.sources = lora_a + lora_b
        self.versions = self._versions(self.sources)
        slots, rank = lora_a[0].shape[0], lora_a[0].shape[-2]
        self.block = len(lora_a) * rank  # one slot's columns
        self.a = torch.stack([w.reshape(slots, rank, w.shape[-1]) for w in lora_a], 1).reshape(
            slots * self.block, -1).float()
        b = [w.reshape(slots, w.shape[-2], rank) for w in lora_b]
        self.b = torch.zeros(sum(w.shape[1] for w in b), slots * self.block)
        row = 0
        for i, w in enumerate(b):
            for slot in range(slots):
                column = slot * self.block + i * rank
                self.b[row: row + w.shape[1], column: column + rank] = w[slot]
            row += w.shape[1]
        self._native: torch.Tensor | None = None
        self._native_dtype = lora_b[0].dtype

    @property
    def b_native(self) -> torch.Tensor:
        """B in the adapters' own dtype, for large expands."""
        if self._native is None:
            self._native = self.b.to(self._native_dtype)
        return self._native

    @staticmethod
    def _versions(tensors: tuple[torch.Tensor, ...]) -> tuple[int, ...]:
        return tuple(t._version for t in tensors)

    def current(self, lora_a: tuple[torch.Tensor, ...], lora_b: tuple[torch.Tensor, ...]) -> bool:
        """Whether this was built from these very tensors, unwritten since."""
        sources = lora_a + lora_b
        return (len(sources) == len(self.sources) and all(s is t for s, t in zip(sources, self.sources))
                and self._versions(sources) == self.versions)


class ZeroWeights:
    """Whether a weight tensor vLLM keeps for every adapter slot holds only zeros, looked at again only
    after vLLM wrote it (its version counter, as ``StackedLayer``).

    vLLM wraps the embedding and the LM head in LoRA layers whether or not an adapter targets them, and
    runs their shrink and expand every step on zero weights, a visible share of a small model's worker
    when no adapter targets them. Adding a product of zeros changes nothing, so a layer whose B is all
    zeros can skip it."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[torch.Tensor, int, bool]] = {}

    def all_zero(self, weights: torch.Tensor) -> bool:
        seen = self._seen.get(id(weights))
        if seen is None or seen[0] is not weights or seen[1] != weights._version:
            seen = self._seen[id(weights)] = (weights, weights._version, not bool(weights.any()))
        return seen[2]


class StepTokens:
    """One step's tokens by adapter slot, computed once per step for every LoRA layer of that step:
    the groups (``token_groups``), the run of slots present, and per slot width the 0/1 mask that
    keeps each token's own slot's columns."""

    def __init__(self, indices: torch.Tensor) -> None:
        self.indices = indices
        self.groups = token_groups(indices)
        present = [slot for slot, _ in self.groups]
        self.first, self.last = (min(present), max(present)) if present else (0, -1)
        self._masks: dict[int, torch.Tensor] = {}

    def mask(self, block: int) -> torch.Tensor:
        """(tokens, slots first..last × block): 1 in the token's own slot's columns, 0 elsewhere."""
        if block not in self._masks:
            onehot = torch.zeros(self.indices.shape[0], self.last - self.first + 1)
            for slot, rows in self.groups:
                onehot[slice(None) if rows is None else rows, slot - self.first] = 1
            self._masks[block] = onehot.repeat_interleave(block, dim=1)
        return self._masks[block]


MASKED_MAX_MACS = 1 << 22
"""Up to this many multiply-adds (tokens × the slot run's columns × (in + out)), one masked shrink and
expand over the run of slots present beats one per adapter: fewer ops, though each token also goes
through the other slots' columns. Where the two cross, measured on both models' layers with
``bench/bench_cpu_lora.py --layers``."""


NATIVE_EXPAND_MIN_ELEMENTS = 300_000
"""From this many output elements (tokens × the layer's output width) an expand runs in the layer's
dtype (bf16 through oneDNN), below it in float32, which builds no oneDNN primitive per token count and
measured faster there (``bench/bench_cpu_lora.py --layers --vary``)."""


def lora_linear(y: torch.Tensor, x: torch.Tensor, layer: StackedLayer, scale: float, step: StepTokens) -> None:
    """``y += x @ A_s.T @ B_s.T * scale`` per token (s its slot), every output slice of a layer at once.

    vLLM's wrapper runs one shrink and one expand per slice (q, k, v: six ops, each grouping the tokens
    again). Here the layer's slots are stacked (``StackedLayer``), and a step costs one shrink and one
    expand over the run of slots present, each token's other slots masked out, or, in large steps
    with several adapters, one shrink and one expand per adapter. Rounding as vLLM's: the shrink in
    float32 (its buffer), read in the layer's dtype; the expand accumulated in float32, rounded to that
    dtype, then added to ``y``."""
    if not step.groups:
        return
    out = y[:, : layer.b.shape[0]]
    columns = slice(step.first * layer.block, (step.last + 1) * layer.block)
    whole = len(step.groups) == 1 and step.groups[0][1] is None
    if whole or x.shape[0] * (columns.stop - columns.start) * (x.shape[1] + out.shape[1]) <= MASKED_MAX_MACS:
        shrunk = x.float() @ layer.a[columns].T
        if not whole:
            shrunk.mul_(step.mask(layer.block))
        _add_expanded(out, None, shrunk, layer, columns, scale)
        return
    for slot, rows in step.groups:
        block = slice(slot * layer.block, (slot + 1) * layer.block)
        shrunk = (x if rows is None else x[rows]).float() @ layer.a[block].T
        _add_expanded(out, rows, shrunk, layer, block, scale)


def _add_expanded(out: torch.Tensor, rows: torch.Tensor | None, shrunk: torch.Tensor, layer: StackedLayer,
                  columns: slice, scale: float) -> None:
    """``out[rows] += shrunk * scale @ B[:, columns].T``, the float32 shrink read in ``out``'s dtype as
    vLLM's buffer is, the product rounded to that dtype before the add as vLLM's is."""
    if scale != 1.0:
        shrunk.mul_(scale)
    dtype = out.dtype
    if dtype != torch.float32 and shrunk.shape[0] * out.shape[1] >= NATIVE_EXPAND_MIN_ELEMENTS:
        delta = shrunk.to(dtype) @ layer.b_native[:, columns].T
    else:
        if dtype != torch.float32:
            shrunk = shrunk.to(dtype).float()
        delta = (shrunk @ layer.b[:, columns].T).to(dtype)
    if rows is None:
        out.add_(delta)
    else:
        out.index_add_(0, rows, delta)


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

