"""Writing LoRA adapters in PEFT format, the layout vLLM's ``add_lora`` and ``peft`` both read."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from ..base.files import atomic_dir

log = logging.getLogger(__name__)


DECODER_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers of a Llama/Qwen-style decoder layer that an adapter may target: the ones vLLM's
LoRA layers, PEFT and the learner all handle (the paper's Planner adapter targets all seven)."""
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM's ``max_lora_rank`` accepts; an adapter of rank r is served by an engine whose
``max_lora_rank`` >= r."""


def lora_shapes(config: dict, target_modules: list[str], prefix: str = "model") -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of every targeted linear layer of a Llama/Qwen-style decoder whose
    layers live under ``prefix`` (``model.language_model`` in a vision-language checkpoint)."""
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q_out = config["num_attention_heads"] * head_dim
    kv_out = config["num_key_value_heads"] * head_dim
    inter = config["intermediate_size"]
    per_layer = {
        "self_attn.q_proj": (q_out, hidden),
        "self_attn.k_proj": (kv_out, hidden),
        "self_attn.v_proj": (kv_out, hidden),
        "self_attn.o_proj": (hidden, q_out),
        "mlp.gate_proj": (inter, hidden),
        "mlp.up_proj": (inter, hidden),
        "mlp.down_proj": (hidden, inter),
    }
    shapes = {}
    for layer in range(config["num_hidden_layers"]):
        for name, shape in per_layer.items():
            if name.split(".")[-1] in target_modules:
                shapes[f"{prefix}.layers.{layer}.{name}"] = shape
    return shapes


def write_lora_adapter(
    out_dir: Path,
    config: dict,
    *,
    rank: int,
    alpha: int,
    target_modules: list[str],
    seed: int,
    b_std: float,
    base_model_name: str,
    dtype: torch.dtype = torch.float32,
    module_prefix: str = "model",
) -> None:
    """Write a PEFT LoRA adapter with seeded A (Kaiming-like) and B ~ N(0, b_std).

    ``b_std = 0`` gives PEFT's default initialisation: the adapter leaves the base model unchanged
    until it is trained, yet it is a real adapter that vLLM loads and serves from the first request.
    """
    rng = np.random.default_rng(seed)
    tensors = {}
    for module, (out_f, in_f) in lora_shapes(config, target_modules, module_prefix).items():
        prefix = f"base_model.model.{module}"
        a = rng.standard_normal((rank, in_f), dtype=np.float32) / np.sqrt(in_f)
        b = rng.standard_normal((out_f, rank), dtype=np.float32) * b_std
        tensors[f"{prefix}.lora_A.weight"] = torch.from_numpy(a).to(dtype)
        tensors[f"{prefix}.lora_B.weight"] = torch.from_numpy(b).to(dtype)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    adapter_config = {
        "base_model_name_or_path": base_model_name,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": rank,
        "target_modules": sorted(target_modules),
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": False,
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")


def init_adapter(base_dir: Path, out_dir: Path, *, rank: int, alpha: int | None = None,
                 target_modules: tuple[str, ...] = DECODER_LORA_TARGETS, seed: int = 0) -> Path:
    """A zero-initialised adapter for a text decoder (B = 0: it serves the base model unchanged until
    trained, the paper's starting point), in the base model's dtype, written to a new folder."""
    config = json.loads((base_dir / "config.json").read_text())
    if "vision_config" in config:
        raise ValueError(f"{base_dir}: a vision-language model; init-adapter writes adapters for text decoders")
    unknown = sorted(set(target_modules) - set(DECODER_LORA_TARGETS))
    if unknown or not target_modules:
        raise ValueError(f"target modules must be some of {', '.join(DECODER_LORA_TARGETS)}, got {unknown or 'none'}")
    if rank not in VLLM_LORA_RANKS:
        raise ValueError(f"rank {rank} is not one vLLM serves ({', '.join(map(str, VLLM_LORA_RANKS))})")
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists; give a new folder")
    dtype = getattr(torch, str(config.get("torch_dtype") or config.get("dtype") or "float32"), torch.float32)
    write_lora_adapter(out_dir, config, rank=rank, alpha=alpha or 2 * rank, target_modules=list(target_modules),
                       seed=seed, b_std=0.0, base_model_name=str(base_dir), dtype=dtype)
    return out_dir


def initial_adapter(base_dir: Path, root: Path, role: str, rank: int) -> Path:
    """The zero-B adapter of ``role`` on the model in ``base_dir`` at ``rank`` (a role's ``adapter = "init"``),
    under ``root`` (the data dir's ``adapters/init``): created at the first start, reused after. Its folder
    is named by a digest of the base's ``config.json`` and the rank, so another model or rank gets its own."""
    digest = hashlib.sha256((base_dir / "config.json").read_bytes() + f"rank={rank}".encode()).hexdigest()[:12]
    out = root / f"{role}-{digest}"
    if (out / "adapter_config.json").is_file():
        log.info("roles.%s.adapter: reusing the zero-initialised adapter %s", role, out)
        return out
    with atomic_dir(out, keep_existing=True) as tmp:
        init_adapter(base_dir, tmp / "adapter", rank=rank)
        for path in (tmp / "adapter").iterdir():
            path.rename(tmp / path.name)
        (tmp / "adapter").rmdir()
    log.info("roles.%s.adapter: created a zero-initialised adapter (rank %d) in %s", role, rank, out)
    return out
