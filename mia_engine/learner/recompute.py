"""Which decoder layers gradient checkpointing recomputes (``learner.checkpoint_layers``).

Recomputing a layer costs a second forward of it in the backward pass; keeping its activations costs
memory. The learner recomputes the *first* n layers and keeps the rest: the backward reaches the kept
layers first and frees their activations before it recomputes any layer, so the recompute's own
activations never add to the kept ones. With ``checkpoint_layers = -1`` n is chosen per micro-batch on
a GPU: the fewest that let the kept layers' activations fit the device's free memory, from a per-token
figure measured once at load (``kept_bytes_per_token``), so short micro-batches recompute nothing and
only long ones pay for the memory they need.

Hugging Face's checkpointing is per layer: a ``GradientCheckpointingLayer`` checkpoints its call when
its ``gradient_checkpointing`` flag is set (what ``gradient_checkpointing_enable(every_n_layers=...)``
sets); ``Recompute.prepare`` sets those flags before each micro-batch's forward.
"""

from __future__ import annotations

import torch

from ..config.learner import LearnerConfig

GIB = 2**30
PROBE_LENGTHS = (64, 192)
"""Tokens of the two probe forwards whose difference gives a kept layer's bytes per token (what does not
grow with the tokens, such as the autocast copies of the LoRA weights, cancels out)."""
LOGIT_CHUNK_BYTES = 16
"""Bytes per logit of the learner's log-prob chunk at its peak (its logits in the model's dtype and
float32 copies of them), counted beside the layers' activations."""
FINAL_ROWS = 8
"""Hidden-size-wide rows a token holds beside the layers, in the model's dtype: the final norm's float32
input (two rows' worth), the final hidden states, their scored copy and their gradient rows, with room."""


def decoder_layers(decoder: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder's layers that Hugging Face can checkpoint one by one, in order (empty: none)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    text = getattr(decoder, "language_model", decoder)  # a VL model's text decoder
    layers = list(getattr(text, "layers", []))
    return layers if layers and all(isinstance(m, GradientCheckpointingLayer) for m in layers) else []


def num_recomputed_layers(num_layers: int, num_tokens: int, kept_bytes: int, input_bytes: int,
                          room_bytes: int) -> int:
    """The fewest of ``num_layers`` to recompute so that the others keep their activations within
    ``room_bytes``: a kept layer holds ``kept_bytes`` a token, a recomputed one only its input
    (``input_bytes`` a token), for ``num_tokens`` tokens."""
    extra = (kept_bytes - input_bytes) * num_tokens
    room = room_bytes - num_layers * input_bytes * num_tokens
    if extra <= 0:
        return 0
    return num_layers - max(0, min(num_layers, room // extra))


def kept_bytes_per_token(decoder: torch.nn.Module, layers: list[torch.nn.Module], config: LearnerConfig) -> int:
    """Bytes autograd keeps per token for one layer that is not recomputed: the storages its forward saves
    for the backward (saved-tensor hooks), at two lengths; the second layer's, as the first one's input
    needs no gradient. Run with every layer kept (their flags are restored), under the learner's autocast."""
    layer = layers[min(1, len(layers) - 1)]
    flags = [m.gradient_checkpointing for m in layers]
    for m in layers:
        m.gradient_checkpointing = False
    try:
        short, long = (_saved_bytes(decoder, layer, config, length) for length in PROBE_LENGTHS)
    finally:
        for m, flag in zip(layers, flags):
            m.gradient_checkpointing = flag
    return max(0, (long - short) // (PROBE_LENGTHS[1] - PROBE_LENGTHS[0]))


def _saved_bytes(decoder: torch.nn.Module, layer: torch.nn.Module, config: LearnerConfig, length: int) -> int:
    """Bytes of the storages ``layer`` saves for the backward in a forward of ``length`` tokens."""
    from .model import autocast

    storages: dict[int, int] = {}
    inside = [False]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if inside[0]:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    hooks = [layer.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True)),
             layer.register_forward_hook(lambda *_: inside.__setitem__(0, False))]
    embeddings = decoder.get_input_embeddings()
    ids = torch.arange(length, device=embeddings.weight.device).remainder(embeddings.num_embeddings)[None]  # (1, T)
    try:
        with torch.enable_grad(), autocast(config), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            decoder(input_ids=ids, use_cache=False)  # the graph, and what it saved, live until this returns
    finally:
        for hook in hooks:
            hook.remove()
    return sum(storages.values())


def free_device_bytes(device: torch.device) -> int:
    """What the learner can still allocate on a GPU: the driver's free memory plus what torch's cache
    holds unallocated."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


class Recompute:
    """Sets, before each micro-batch's forward, which layers gradient checkpointing recomputes."""

    def __init__(self, decoder: torch.nn.Module, config: LearnerConfig, head_width: int,
                 num_lora_params: int) -> None:
        self.layers = decoder_layers(decoder) if config.gradient_checkpointing else []
        self.num_recomputed = len(self.layers)
        """Layers the last micro-batch recomputed (the first ones)."""
        self.num_recomputed_layer_tokens = 0
        """Recomputed layers x tokens over every micro-batch prepared so far (the doctor's FLOP count)."""
        self.pinned: int | None = None
        """A number of layers to recompute whatever the config says (the doctor compares settings)."""
        self._config = config
        self._is_auto = config.checkpoint_layers < 0 and torch.device(config.device).type == "cuda"
        hidden_bytes = decoder.get_input_embeddings().embedding_dim * getattr(torch, config.dtype).itemsize
        self._input_bytes = hidden_bytes
        """What a recomputed layer keeps a token: its input."""
        self._other_bytes_per_token = FINAL_ROWS * hidden_bytes
        self._other_bytes = config.logit_chunk_size * head_width * LOGIT_CHUNK_BYTES + 4 * num_lora_params
        """The step's peak beside the layers: one log-prob chunk's logits and the LoRA weights' fp32 grads."""
        self._kept_bytes = 0
        if self.layers and self._is_auto:
            self._kept_bytes = kept_bytes_per_token(decoder, self.layers, config)
        self.prepare(0)

    def prepare(self, num_tokens: int) -> None:
        """Choose and set the recomputed layers for a micro-batch of ``num_tokens`` (batch x length)."""
        if not self.layers:
            return
        self._set(self._choose(num_tokens))
        self.num_recomputed_layer_tokens += self.num_recomputed * num_tokens

    def _choose(self, num_tokens: int) -> int:
        num_layers = len(self.layers)
        if self.pinned is not None:
            return min(self.pinned, num_layers)
        if not self._is_auto:
            return num_layers if self._config.checkpoint_layers < 0 else min(self._config.checkpoint_layers, num_layers)
        if num_tokens == 0:
            return num_layers
        device = torch.device(self._config.device)
        # beside the layers: the log-prob chunk, the LoRA grads, the final rows, and one layer's worth more
        # for the backward's working set (a layer's activation gradients, the attention kernel's buffers)
        room = free_device_bytes(device) - int(self._config.checkpoint_headroom_gib * GIB) - self._other_bytes \
            - (self._other_bytes_per_token + self._kept_bytes) * num_tokens
        return num_recomputed_layers(num_layers, num_tokens, self._kept_bytes, self._input_bytes, room)

    def _set(self, num_recomputed: int) -> None:
        for i, layer in enumerate(self.layers):
            layer.gradient_checkpointing = i < num_recomputed
        self.num_recomputed = num_recomputed
