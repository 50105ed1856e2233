"""The PEFT model the learner trains: loaded for training (SDPA attention, dropout off, train mode,
gradient checkpointing of the layers ``recompute.py`` picks, base weights in ``learner.dtype`` and mixed
precision without float32 copies of the projections' inputs), and split into the decoder and the output
embedding so that log-probs are computed a chunk of positions at a time (``grpo.chunked_token_logprobs``)
instead of from the full logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..config.learner import LearnerConfig


class UntrainableBase(ValueError):
    """The base model is one the learner cannot train (the message says why)."""


def check_trainable_base(base_dir: Path, quantization: str | None = None) -> None:
    """Raise ``UntrainableBase`` when the learner cannot train LoRA on this base: it is quantised (the serving
    engine's ``quantization``, or a ``quantization_config`` in its ``config.json``); the learner computes
    gradients through full-precision base weights, and publishes adapters for the base the engine serves."""
    try:
        found = json.loads((base_dir / "config.json").read_text()).get("quantization_config")
    except (OSError, ValueError):
        found = None
    method = quantization or (found.get("quant_method", "yes") if isinstance(found, dict) else found)
    if method:
        raise UntrainableBase(f"{base_dir}: a quantised base ({method}) cannot be trained by the test-time "
                              "learner; serve an unquantised base on the Planner's engine to learn at test time")


def load_peft_model(base_dir: Path, adapter_dir: Path, config: LearnerConfig) -> torch.nn.Module:
    """Base weights (frozen) in the configured dtype on the learner's device, adapter trainable."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, config.dtype)
    # SDPA (flash / memory-efficient kernels on a GPU): named, so a model without it fails here
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=dtype, attn_implementation="sdpa")
    base.to(torch.device(config.device))
    model = PeftModel.from_pretrained(base, adapter_dir, is_trainable=True)
    if dtype != torch.float32:  # every forward runs under ``autocast``, which casts for the matmuls
        _keep_adapter_input_dtype(model)
    if config.gradient_checkpointing:  # which layers: ``recompute.py``
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # Non-reentrant checkpointing reaches the LoRA weights without a gradient on the frozen embeddings'
        # output, which Hugging Face turns on for reentrant's sake: it would cost the first layer's
        # q/k/v input gradients, which nothing reads.
        model.disable_input_require_grads()
    _disable_dropout(model)
    # Train mode (Hugging Face checkpoints only when ``training``), with every dropout at 0 so the
    # learner scores tokens with the same policy vLLM sampled from.
    model.train()
    return model


def autocast(config: LearnerConfig) -> torch.autocast:
    """Mixed precision in the base weights' dtype: the float32 LoRA weights (the optimizer's masters) are
    cast for their matmuls, so no float32 copy of an activation is made; off for float32 weights."""
    dtype = getattr(torch, config.dtype)
    return torch.autocast(torch.device(config.device).type, dtype=dtype, enabled=dtype != torch.float32)


def _keep_adapter_input_dtype(model: torch.nn.Module) -> None:
    """Stop PEFT casting each adapted layer's input to the float32 LoRA weights' dtype: a float32 copy of
    every projection's input and output, and float32 matmuls. Under autocast the weights are cast instead."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            module.cast_input_dtype_enabled = False


def decoder_and_head(model: torch.nn.Module, config: LearnerConfig) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The PEFT-wrapped causal LM's decoder (hidden states after the final norm) and output embedding.

    The learner computes logits as ``head(decoder(ids))``, a chunk at a time; a model whose forward does
    more (logit soft-capping, a logit scale) is refused here rather than trained on other log-probs."""
    base = model.get_base_model()
    decoder = getattr(base, getattr(base, "base_model_prefix", ""), None)
    head = base.get_output_embeddings()
    if decoder is None or head is None:
        raise ValueError(f"{type(base).__name__}: no decoder (base_model_prefix) or output embedding found; "
                         "the learner needs a causal LM with an lm_head")
    embeddings = base.get_input_embeddings()
    ids = torch.arange(4, device=embeddings.weight.device).remainder(embeddings.num_embeddings)[None]  # (1, 4)
    with torch.no_grad(), autocast(config):
        want = model(input_ids=ids, use_cache=False).logits.float()  # (1, 4, V)
        got = head(decoder(input_ids=ids, use_cache=False).last_hidden_state).float()
    if not torch.allclose(got, want, rtol=1e-2, atol=1e-2):
        raise ValueError(f"{type(base).__name__}: its logits are not lm_head(decoder(ids)) (soft-capping or a "
                         "logit scale?); the learner's chunked log-probs would differ from the model's")
    return decoder, head


def _disable_dropout(model: torch.nn.Module) -> None:
    """Dropout off for good, whatever mode the model is put in (LoRA dropout, attention dropout)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
