"""The tiny test model: a 2-layer Qwen3 built deterministically, with a trained BPE tokenizer.

It produces nonsense text, but it exercises every real mechanism (vLLM engine start, multi-LoRA,
structured outputs, log-probs, GRPO) in seconds. Every byte is a function of the constants below:
numpy's PCG64 generator for the weights (stable across platforms), ``tokenizers``' deterministic BPE
trainer on text generated here, and JSON written with sorted keys. A test checks the content hash.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from .lora import write_lora_adapter

SEED = 20260422
VOCAB_SIZE = 2048
CONTEXT = 4096
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PROTOCOL_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                   "</tool_response>", "<answer>", "</answer>"]
ADAPTER_ROLES = {"planner": 1, "executor": 2}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

WORDS = """the a an of to in on for with by from at as is was are were be been has have had do does did
not and or but if then so because which who whom whose what when where why how this that these those it
its he she they them his her their we you i me my our your plan search step answer question memory
find first second third next last final check verify compare city country river mountain year born died
capital population president author book film song team war century king queen language university
company founded largest smallest oldest highest longest name date number place person event result
evidence source page title summary article wikipedia query tool call response reason think guide
reflect replan correct incorrect yes no true false unknown none more less most least many few all some
each every between after before during over under about into through against among within without
new old great small large long short early late high low good bad same different other such only also
very well just still even again never always often state world history science art music sport game
water land sea ocean island north south east west central united kingdom empire republic party army
""".split()


def _corpus(num_lines: int = 4000) -> list[str]:
    """Deterministic training text: word salad, numbers, JSON tool calls and the agent's turn tags."""
    rng = np.random.default_rng(SEED)
    lines = []
    for i in range(num_lines):
        words = [WORDS[j] for j in rng.integers(0, len(WORDS), size=int(rng.integers(4, 16)))]
        text = " ".join(words).capitalize()
        kind = i % 4
        if kind == 0:
            lines.append(f"{text}. In {int(rng.integers(1000, 2030))} there were {int(rng.integers(0, 10**6))}.")
        elif kind == 1:
            call = {"name": "search", "arguments": {"query_list": [" ".join(words[:3])]}}
            lines.append(f"<think>{text}</think>\n<tool_call>{json.dumps(call)}</tool_call>")
        elif kind == 2:
            lines.append(f"<think>{text}?</think>\n<answer>{' '.join(words[-2:])}</answer>")
        else:
            lines.append(f'{{"score": {int(rng.integers(1, 11))}, "reason": "{text}", "verdict": "A"}}')
    return lines


def build_tokenizer(out: Path, extra_tokens: list[str] | tuple[str, ...] = (), chat_template: str = CHAT_TEMPLATE) -> int:
    """Train a byte-level BPE tokenizer and write the files ``AutoTokenizer`` and vLLM load;
    ``extra_tokens`` (e.g. a vision model's placeholders) are added after the protocol tags."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(PROTOCOL_TOKENS),  # the same merges whatever ``extra_tokens`` adds
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_tokens(PROTOCOL_TOKENS)
    if extra_tokens:
        tok.add_special_tokens(list(extra_tokens))
    tok.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": chat_template,
        "model_max_length": CONTEXT,
        "clean_up_tokenization_spaces": False,
    }
    write_json(out / "tokenizer_config.json", tokenizer_config)
    return tok.get_vocab_size()


def _model_config(vocab_size: int, eos_id: int, pad_id: int) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
    }


def _weights(config: dict) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(SEED + 1)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config["head_dim"]
    q_out = config["num_attention_heads"] * head_dim
    kv_out = config["num_key_value_heads"] * head_dim

    def normal(*shape: int, std: float = 0.05) -> torch.Tensor:
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * std).to(torch.bfloat16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    # Untied, small-std embeddings: a tied random model mostly repeats its last token, and a peaked one
    # repeats a single token; this gives varied text that still differs visibly under each adapter.
    tensors = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden, std=0.1),
               "lm_head.weight": normal(config["vocab_size"], hidden, std=0.1),
               "model.norm.weight": ones(hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": ones(hidden),
            p + "post_attention_layernorm.weight": ones(hidden),
            p + "self_attn.q_proj.weight": normal(q_out, hidden),
            p + "self_attn.k_proj.weight": normal(kv_out, hidden),
            p + "self_attn.v_proj.weight": normal(kv_out, hidden),
            p + "self_attn.o_proj.weight": normal(hidden, q_out),
            p + "self_attn.q_norm.weight": ones(head_dim),
            p + "self_attn.k_norm.weight": ones(head_dim),
            p + "mlp.gate_proj.weight": normal(inter, hidden),
            p + "mlp.up_proj.weight": normal(inter, hidden),
            p + "mlp.down_proj.weight": normal(hidden, inter),
        }
    return tensors


def write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def build_tiny(out: Path) -> None:
    """Build the tiny model into ``out``: ``base/`` (HF folder) and ``adapters/<role>/`` (PEFT)."""
    base = out / "base"
    base.mkdir(parents=True)
    vocab_size = build_tokenizer(base)
    vocab = json.loads((base / "tokenizer.json").read_text())["added_tokens"]
    ids = {t["content"]: t["id"] for t in vocab}
    config = _model_config(vocab_size, ids["<|im_end|>"], ids["<|endoftext|>"])
    write_json(base / "config.json", config)
    write_json(base / "generation_config.json", {"eos_token_id": ids["<|im_end|>"]})
    save_file(_weights(config), str(base / "model.safetensors"), metadata={"format": "pt"})
    for role, offset in ADAPTER_ROLES.items():
        write_lora_adapter(out / "adapters" / role, config, rank=8, alpha=16, target_modules=LORA_TARGETS,
                           seed=SEED + 10 * offset, b_std=0.05, base_model_name="mia-tiny")
