"""FLOPs of one GRPO step of a LoRA on a decoder stack, and the utilisation figures the doctor prints.

Matmul FLOPs only (2 per multiply-add); norms, activations, the softmax and the input embedding's lookup
are left out. Per token, with L layers, T tokens a sequence, N_l a layer's projection weights
(q, k, v, o, gate, up, down), P_l its LoRA weights (A: r x in, B: out x r, on all seven), d = query
heads x head_dim, H x V the LM head:

- **model FLOPs, 6N convention** (``StepFlops.six_n``): 6·(L·N_l + H·V) + 6·L·T·d. The 6N term is the
  forward (2N) and backward (4N) of every weight a token passes through, the input embedding excluded
  (PaLM, Chowdhery et al. 2022, appendix B; Megatron-LM, Narayanan et al. 2021, section 5.1);
  attention's 12·L·T·d (PaLM's 12·L·H·Q·T: QKᵀ and AV forward, twice that backward) is halved for
  the causal mask, as FlashAttention counts it. It describes a full fine-tuning step, with a weight
  gradient for every weight, which a LoRA step does not compute: it overstates a LoRA step's work.
- **required FLOPs** (``StepFlops.required``), what this LoRA step must compute without recompute:
  forward 2·N_l and input gradient 2·N_l per layer (no weight gradient for the frozen base), LoRA
  forward, input gradient and weight gradient 6·P_l, attention 6·T·d (forward 2·T·d, backward twice
  that), and the LM head 4·H·V (its logits and their gradient rows) at the positions whose log-prob
  is scored only. The first layer's q, k, v and their LoRA A matrices need no input gradient (the
  input embedding is frozen). **Model-FLOPs utilisation (MFU) is this count** over the step's time and
  the GPU's peak: it is what the doctor's floor (``learner.min_model_flops_utilization``) checks.
- **hardware FLOPs** (``StepFlops.hardware``): required + the recompute, one more forward of each
  layer gradient checkpointing recomputes (its projections, LoRA and attention, up to the down
  projection's LoRA B, whose product the backward does not read). FlashAttention's
  backward also recomputes the attention scores inside its kernel; that is not counted, as in both
  papers.
"""

from __future__ import annotations

import msgspec

from ..deploy.shapes import DecoderShape


class StepFlops(msgspec.Struct, frozen=True):
    """One step's FLOPs under the three counts of the module docstring."""

    six_n: float
    """6·N·tokens + causal attention: the usual MFU numerator, for a full fine-tuning step."""
    required: float
    """What the LoRA step computes without recompute: the MFU numerator used here."""
    recompute: float
    """The forward again of the checkpointed layers."""

    @property
    def hardware(self) -> float:
        return self.required + self.recompute


def step_flops(shape: DecoderShape, lora_rank: int, num_sequences: int, seq_len: int, num_scored: int,
               num_recomputed: float) -> StepFlops:
    """FLOPs of a step over ``num_sequences`` sequences of ``seq_len`` tokens with ``num_scored`` scored
    positions each (completion tokens), ``num_recomputed`` of the layers recomputed (an average over the
    tokens where micro-batches differ), a rank-``lora_rank`` LoRA on all seven projections. See the
    module docstring for the formulas."""
    h, q, kv, i = shape.hidden_size, shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim, \
        shape.intermediate_size
    num_layers, tokens = shape.num_layers, num_sequences * seq_len
    qkv = h * q + 2 * h * kv
    layer = qkv + q * h + 3 * h * i  # (per token: multiply-adds of the projections)
    lora = shape.lora_params_per_layer(lora_rank)
    attention = 2 * seq_len * q  # a token's causal QKᵀ and AV forward: 4·T·d / 2
    head = h * shape.vocab_size
    six_n = 6 * (num_layers * layer + head) * tokens + 3 * attention * num_layers * tokens
    forward = (2 * layer + 2 * lora + attention) * num_layers * tokens
    backward = (2 * layer + 4 * lora + 2 * attention) * num_layers * tokens \
        - 2 * (qkv + 3 * lora_rank * h) * tokens  # the first layer's q, k, v (and their A's) input gradients
    scored = 4 * head * num_scored * num_sequences
    # torch's non-reentrant checkpoint stops recomputing at the last tensor the backward needs: the down
    # projection's LoRA B input, so that B's product (r x h) is not made again
    recompute = (2 * layer + 2 * lora - 2 * lora_rank * h + attention) * num_recomputed * tokens
    return StepFlops(float(six_n), float(forward + backward + scored), float(recompute))


def utilization(flops: float, seconds: float, peak_tflops: float) -> float:
    """The share of ``peak_tflops`` that ``flops`` in ``seconds`` reach (a fraction)."""
    return flops / seconds / (peak_tflops * 1e12)


def floor_failure(mfu: float | None, floor: float) -> str:
    """Why a step at model-FLOPs utilisation ``mfu`` (None: the GPU's peak is unknown) fails the floor
    ``floor`` (0 = none), or "" when it does not."""
    if floor <= 0:
        return ""
    if mfu is None:
        return (f"learner.min_model_flops_utilization is {100 * floor:.1f} % but this GPU's bf16 peak is "
                "unknown (doctor.BF16_DENSE_TFLOPS)")
    if mfu < floor:
        return f"MFU {100 * mfu:.1f} % is under learner.min_model_flops_utilization ({100 * floor:.1f} %)"
    return ""
