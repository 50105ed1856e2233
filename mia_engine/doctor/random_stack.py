"""The model and batch the doctor's ``grpo`` and ``contention`` checks step: a Qwen3-shaped stack with
random weights and a rank-64 LoRA adapter, saved as a model folder, and a GRPO batch of random tokens."""

from __future__ import annotations

from pathlib import Path

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA_RANK = 64
TOKENS_PER_STEP = 32768
"""Tokens in one GRPO step's batch, cut into sequences of ``seq_len`` (8 x 4096, 2 x 16384): steps at
different lengths take about the same time, and their per-token times compare."""


def random_stack(folder: Path, shape: dict, device: str) -> tuple[Path, Path]:
    """A random-weight Qwen3 stack of ``shape`` saved as a model folder, and a rank-64 adapter for it.

    Initialised on ``device``: on a GPU, filling the 36-layer stack's 8 B random weights on the CPU
    would take longer than the step it is built for."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from ..models.lora import write_lora_adapter

    config = Qwen3Config(**{k: v for k, v in shape.items() if k not in ("model_type", "torch_dtype")})
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM._from_config(config, dtype=torch.bfloat16)  # never a float32 copy
    model.save_pretrained(folder / "base")
    del model
    write_lora_adapter(folder / "adapter", shape, rank=LORA_RANK, alpha=2 * LORA_RANK, target_modules=LORA_TARGETS,
                       seed=0, b_std=0.0, base_model_name=str(folder / "base"))
    return folder / "base", folder / "adapter"


def grpo_samples(vocab_size: int, seq_len: int) -> list:
    """About ``TOKENS_PER_STEP`` tokens in sequences of ``seq_len`` (2 to 8 of them, in two groups when there
    are 4 or more), a quarter prompt; rewards alternate 0, 1 within each group."""
    import random

    from ..learner.batching import GRPOSample

    rng = random.Random(0)
    prompt_len = seq_len // 4
    num_sequences = min(8, max(2, TOKENS_PER_STEP // seq_len))
    num_groups = 2 if num_sequences >= 4 else 1
    samples = []
    for group in range(num_groups):
        prompt = [rng.randrange(vocab_size) for _ in range(prompt_len)]
        for i in range(num_sequences // num_groups):
            samples.append(GRPOSample(prompt_ids=prompt, reward=float(i % 2), group_id=f"g{group}",
                                      completion_ids=[rng.randrange(vocab_size) for _ in range(seq_len - prompt_len)]))
    return samples
