"""The tiny vision-language test model: an Idefics3 (SmolVLM's architecture) with a 1-layer SigLIP-style
vision tower and a 2-layer Llama text model.

Like ``tiny.py`` it writes nonsense, but every mechanism of an image question runs for real: vLLM's
Idefics3 processor turns a Pillow image into pixels, the vision tower and connector encode them, the
image's placeholder is expanded in the prompt, and planner/executor LoRA adapters (on the language
model, as vLLM applies them) change the output. Why not a Qwen2.5-VL-style model, as the paper's
Executor is: vLLM's Qwen2-VL/Qwen2.5-VL modules (and LLaVA's, via Pixtral) import ``transformers``'
torchvision image processors when they load, and no torchvision build matches this machine's CPU
torch (PyPI's fails with "operator torchvision::nms does not exist"); Idefics3's processor has a
Pillow backend. The GPU config keeps the paper's Qwen2.5-VL-7B Executor (configs/8xgpu.toml), whose
install has torchvision; a CPU user can serve a local SmolVLM folder the same way (configs/vl_local.toml).

Every byte is a function of the constants here and the installed ``transformers`` (which writes the
config and names the tensors): numpy's PCG64 generator fills the weights, the tokenizer is
``tiny.py``'s plus Idefics3's image tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from .lora import write_lora_adapter
from .tiny import ADAPTER_ROLES, CONTEXT, LORA_TARGETS, SEED, build_tokenizer, write_json

IMAGE_TOKEN = "<image>"
IMAGE_TOKENS = [IMAGE_TOKEN, "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"]
IMAGE_SIZE, PATCH, SCALE = 64, 16, 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH) ** 2 // SCALE ** 2
"""4 image tokens per image: 4x4 patches, merged 2x2 by the connector's pixel shuffle."""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ('image', 'image_url') %}{{ '<image>\\n' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""``tiny.py``'s template, plus OpenAI-style content lists: an image part becomes ``<image>``, which the
Idefics3 processor expands."""


def _model_config(vocab_size: int, ids: dict[str, int]) -> dict:
    from transformers import Idefics3Config

    text = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=vocab_size, hidden_size=128,
                intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=CONTEXT, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                bos_token_id=ids["<|im_end|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    vision = dict(model_type="idefics3_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, image_size=IMAGE_SIZE, patch_size=PATCH)
    config = Idefics3Config(text_config=text, vision_config=vision, image_token_id=ids[IMAGE_TOKEN],
                            scale_factor=SCALE, tie_word_embeddings=False, pad_token_id=ids["<|endoftext|>"],
                            architectures=["Idefics3ForConditionalGeneration"], torch_dtype="bfloat16")
    document = config.to_dict()
    document.pop("transformers_version", None)
    return document


def _weights(config: dict) -> dict[str, torch.Tensor]:
    """Seeded weights under the names ``transformers`` gives the architecture (read from a meta-device
    instance): ones for norm scales, zeros for biases, small normals elsewhere."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in
                  Idefics3ForConditionalGeneration(Idefics3Config.from_dict(config)).state_dict().items()}
    rng = np.random.default_rng(SEED + 2)
    tensors = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith(".bias"):
            value = np.zeros(shape, dtype=np.float32)
        elif len(shape) == 1:  # norm scales, the class embedding
            value = np.ones(shape, dtype=np.float32)
        else:
            std = 0.1 if "embed_tokens" in name or name == "lm_head.weight" else 0.05
            value = rng.standard_normal(shape, dtype=np.float32) * std
        tensors[name] = torch.from_numpy(value).to(torch.bfloat16)
    return tensors


def _preprocessor_config() -> dict:
    return {
        "image_processor_type": "Idefics3ImageProcessor", "processor_class": "Idefics3Processor",
        "do_convert_rgb": True, "do_resize": True, "resample": 1, "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "do_pad": True, "do_image_splitting": False,
        "size": {"longest_edge": IMAGE_SIZE}, "max_image_size": {"longest_edge": IMAGE_SIZE},
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    }


def _processor_config() -> dict:
    return {"processor_class": "Idefics3Processor", "image_seq_len": IMAGE_SEQ_LEN}


def build_tiny_vl(out: Path) -> None:
    """Build the tiny VL model into ``out``: ``base/`` (HF folder) and ``adapters/<role>/`` (PEFT)."""
    base = out / "base"
    base.mkdir(parents=True)
    vocab_size = build_tokenizer(base, extra_tokens=IMAGE_TOKENS, chat_template=CHAT_TEMPLATE)
    ids = {t["content"]: t["id"] for t in json.loads((base / "tokenizer.json").read_text())["added_tokens"]}
    config = _model_config(vocab_size, ids)
    write_json(base / "config.json", config)
    write_json(base / "generation_config.json", {"eos_token_id": ids["<|im_end|>"]})
    write_json(base / "preprocessor_config.json", _preprocessor_config())
    write_json(base / "processor_config.json", _processor_config())
    save_file(_weights(config), str(base / "model.safetensors"), metadata={"format": "pt"})
    for role, offset in ADAPTER_ROLES.items():
        write_lora_adapter(out / "adapters" / role, config["text_config"], rank=8, alpha=16,
                           target_modules=LORA_TARGETS, seed=SEED + 10 * offset, b_std=0.05,
                           base_model_name="mia-tiny-vl", module_prefix="model.text_model")
