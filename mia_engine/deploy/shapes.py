"""Model shapes and parameter counts from a Hugging Face ``config.json`` alone (no weights).

Covered: Llama/Qwen2/Qwen3-style decoders (optionally with q/k/v biases and per-head q/k norms), the
Qwen2-VL / Qwen2.5-VL vision tower, and BERT encoders (the sentence encoder). Counts are exact for these
layouts; anything else is refused with the key that is missing rather than guessed.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "half": 2, "float": 4}
_QK_NORM_TYPES = ("qwen3",)
_QKV_BIAS_TYPES = ("qwen2", "qwen2_vl", "qwen2_5_vl")


class DecoderShape(msgspec.Struct, frozen=True):
    """What the budget needs of a causal LM (the text part of a VL model)."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    has_qkv_bias: bool
    has_qk_norm: bool
    num_vision_params: int
    """Parameters of the vision tower (0 for a text-only model)."""
    torch_dtype: str
    max_image_tokens: int = 0
    """Decoder-side tokens of the largest image the processor makes by default (what vLLM profiles)."""
    vision_rows_per_image_token: int = 0
    """Live activation elements of the vision tower per decoder-side image token at its peak: the
    patches merged into that token x (4 hidden-wide rows + 2 MLP-wide rows), as for the decoder."""

    @property
    def num_layer_params(self) -> int:
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.has_qkv_bias else 0)
        attention += 2 * self.head_dim if self.has_qk_norm else 0
        return attention + 3 * h * self.intermediate_size + 2 * h  # gate/up/down; two RMSNorms

    @property
    def num_text_params(self) -> int:
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * self.num_layer_params + embeddings + self.hidden_size  # + final norm

    @property
    def num_params(self) -> int:
        return self.num_text_params + self.num_vision_params

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token over all layers, whole model."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def lora_params_per_layer(self, rank: int) -> int:
        """A (r x in) + B (out x r) for q, k, v, o, gate, up, down of one layer."""
        h, q, kv, i = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, \
            self.intermediate_size
        ins = h + h + h + q + h + h + i
        outs = q + kv + kv + h + i + i + h
        return rank * (ins + outs)


def read_config(model_dir: str | Path) -> dict:
    path = Path(model_dir).expanduser() / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file (the dry run reads only config.json)") from None


def decoder_shape(config: dict) -> DecoderShape:
    """The decoder of a config.json (for VL models the text part is top-level or ``text_config``)."""
    text = {**config.get("text_config", {}), **{k: v for k, v in config.items() if k != "text_config"}}
    model_type = str(config.get("model_type", ""))
    hidden = _get(text, "hidden_size")
    num_heads = _get(text, "num_attention_heads")
    return DecoderShape(
        model_type=model_type,
        num_layers=_get(text, "num_hidden_layers"),
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=text.get("num_key_value_heads") or num_heads,
        head_dim=text.get("head_dim") or hidden // num_heads,
        intermediate_size=_get(text, "intermediate_size"),
        vocab_size=_get(text, "vocab_size"),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
        has_qkv_bias=bool(text.get("attention_bias", False)) or model_type in _QKV_BIAS_TYPES,
        has_qk_norm=model_type in _QK_NORM_TYPES,
        num_vision_params=vision_params(config, hidden) if "vision_config" in config else 0,
        torch_dtype=str(text.get("torch_dtype") or text.get("dtype") or "bfloat16"),
        **(vision_profile(config) if "vision_config" in config else {}),
    )


QWEN_VL_MAX_PIXELS = 12845056
"""Qwen2/2.5-VL's image processor default ``max_pixels`` (16384 merged tokens of 28 x 28 pixels)."""
IDEFICS3_MAX_CROPS = 17
"""Idefics3/SmolVLM's processor splits an image of ``longest_edge`` = 4 x ``image_size`` into 4 x 4 crops
plus the downscaled whole image."""


def vision_profile(config: dict) -> dict[str, int]:
    """What vLLM's start-up profile runs through the vision tower: the largest image's decoder tokens and
    the tower's activation rows per such token (``DecoderShape.max_image_tokens`` and
    ``vision_rows_per_image_token``)."""
    vision = config["vision_config"]
    h, inter = _get(vision, "hidden_size"), _get(vision, "intermediate_size")
    if vision.get("model_type") in ("idefics3_vision", "siglip_vision_model"):
        merge = config.get("scale_factor", 2) ** 2
        per_crop = (_get(vision, "image_size") // _get(vision, "patch_size")) ** 2 // merge
        max_tokens = per_crop * IDEFICS3_MAX_CROPS
    else:
        merge = vision.get("spatial_merge_size", 2) ** 2
        max_tokens = QWEN_VL_MAX_PIXELS // (_get(vision, "patch_size") ** 2 * merge)
    return {"max_image_tokens": max_tokens, "vision_rows_per_image_token": merge * (4 * h + 2 * inter)}


def vision_params(config: dict, text_hidden: int) -> int:
    """The vision tower (and connector) of a VL config.json: Qwen2/2.5-VL's, or Idefics3's (SmolVLM)."""
    vision = config["vision_config"]
    if vision.get("model_type") in ("idefics3_vision", "siglip_vision_model"):
        connector = _get(vision, "hidden_size") * config.get("scale_factor", 2) ** 2 * text_hidden
        return siglip_vision_params(vision) + (connector if config.get("model_type") == "idefics3" else 0)
    return qwen_vision_params(vision)


def siglip_vision_params(vision: dict) -> int:
    """A SigLIP-style ViT: conv patch embedding with bias, learned positions, ``num_hidden_layers`` blocks
    (two LayerNorms, q/k/v/o with biases, a GELU MLP with biases) and a final LayerNorm."""
    h, inter, layers = _get(vision, "hidden_size"), _get(vision, "intermediate_size"), _get(vision, "num_hidden_layers")
    patch = _get(vision, "patch_size")
    positions = (_get(vision, "image_size") // patch) ** 2
    embed = vision.get("num_channels", 3) * patch * patch * h + h + positions * h
    block = 2 * 2 * h + 4 * (h * h + h) + (h * inter + inter) + (inter * h + h)
    return embed + layers * block + 2 * h


def qwen_vision_params(vision: dict) -> int:
    """The Qwen2.5-VL vision tower: conv patch embedding, ``depth`` blocks (RMSNorms, fused qkv with bias,
    SwiGLU MLP with biases), and the patch merger (RMSNorm + two linears over merged patches)."""
    h, inter, depth = _get(vision, "hidden_size"), _get(vision, "intermediate_size"), _get(vision, "depth")
    patch = (vision.get("in_chans") or vision.get("in_channels", 3)) * vision.get("temporal_patch_size", 2) \
        * _get(vision, "patch_size") ** 2 * h
    block = 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * (h * inter + inter) + (inter * h + h)
    merged = h * vision.get("spatial_merge_size", 2) ** 2
    out = _get(vision, "out_hidden_size")
    merger = h + (merged * merged + merged) + (merged * out + out)
    return patch + depth * block + merger


def bert_params(config: dict) -> int:
    """A BERT encoder with its pooler (sentence-transformers checkpoints keep it)."""
    h, inter, layers = _get(config, "hidden_size"), _get(config, "intermediate_size"), _get(config, "num_hidden_layers")
    embeddings = (_get(config, "vocab_size") + _get(config, "max_position_embeddings")
                  + config.get("type_vocab_size", 2)) * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * inter + inter) + (inter * h + h) + 2 * h
    return embeddings + layers * layer + (h * h + h)


def _get(config: dict, key: str) -> int:
    if key not in config:
        raise KeyError(f"config.json has no {key!r}: not a layout the dry run knows")
    return int(config[key])
