"""``serve --dry-run``: shapes from config.json, the per-GPU budget of configs/8xgpu.toml against figures
worked out by hand below, and one-line refusals that name the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mia_engine.config import ConfigError, load_config
from mia_engine.deploy.budget import GIB, plan
from mia_engine.deploy.shapes import decoder_shape

FIXTURES = Path(__file__).parent / "fixtures"
CONFIG = str(Path(__file__).parents[2] / "configs" / "8xgpu.toml")  # this checkout's, not the installed one
MODELS = {"engines.qwen3-8b.model": str(FIXTURES / "qwen3-8b"),
          "engines.qwen2_5-vl-7b.model": str(FIXTURES / "qwen2_5-vl-7b"),
          "engines.qwen3-32b.model": str(FIXTURES / "qwen3-32b")}

# Qwen3-8B by hand: per layer q 4096·4096 + k, v 2·4096·1024 + o 4096·4096 + q/k norms 2·128
# + MLP 3·4096·12288 + 2 norms 2·4096 = 192,946,432; x 36 layers + embeddings and head 2·151936·4096
# + final norm 4096.
QWEN3_8B_PARAMS = 36 * 192_946_432 + 2 * 151_936 * 4096 + 4096  # 8,190,735,360
# Qwen2.5-VL-7B text: per layer q 3584² + 3584, k, v 2·(3584·512 + 512), o 3584², MLP 3·3584·18944,
# norms 2·3584 = 233,057,792; x 28 + 2·152064·3584 + 3584. Vision: patch conv 3·2·14·14·1280; per block
# norms 2·1280 + qkv 1280·3840 + 3840 + proj 1280² + 1280 + gate, up 2·(1280·3420 + 3420)
# + down 3420·1280 + 1280 = 19,702,200, x 32; merger norm 1280 + 5120² + 5120 + 5120·3584 + 3584.
QWEN25_VL_TEXT = 28 * 233_057_792 + 2 * 152_064 * 3584 + 3584  # 7,615,616,512
QWEN25_VL_VISION = 3 * 2 * 14 * 14 * 1280 + 32 * 19_702_200 + 1280 + 5120 * 5120 + 5120 + 5120 * 3584 + 3584
# LoRA r64 on q, k, v, o, gate, up, down of Qwen3-8B, per layer: 64 x (in dims 6·4096 + 12288
# + out dims 4096 + 1024 + 1024 + 4096 + 2·12288 + 4096) = 4,849,664.
QWEN3_8B_LORA_R64 = 36 * 64 * (6 * 4096 + 12288 + 4096 + 1024 + 1024 + 4096 + 2 * 12288 + 4096)


def _config(**overrides: object):
    return load_config(CONFIG, {**MODELS, **overrides})


def _plan(**overrides: object):
    return plan(_config(**overrides), Path)


def _items(budget, owner_prefix: str) -> dict[str, int]:
    claim = next(c for c in budget.claims if c.owner.startswith(owner_prefix))
    return {item.what: item.num_bytes for item in claim.items}


def test_shapes_match_hand_counts() -> None:
    qwen3 = decoder_shape(json.loads((FIXTURES / "qwen3-8b" / "config.json").read_text()))
    assert QWEN3_8B_PARAMS == 8_190_735_360 and qwen3.num_params == QWEN3_8B_PARAMS
    vl = decoder_shape(json.loads((FIXTURES / "qwen2_5-vl-7b" / "config.json").read_text()))
    assert (vl.num_text_params, vl.num_vision_params) == (QWEN25_VL_TEXT, QWEN25_VL_VISION)
    assert vl.num_params == 8_292_166_656  # the model card's "8.29B"
    assert qwen3.kv_bytes_per_token(2) == 2 * 36 * 8 * 128 * 2


@pytest.mark.parametrize("name, cls", [("qwen3-8b", "Qwen3ForCausalLM"),
                                       ("qwen2_5-vl-7b", "Qwen2_5_VLForConditionalGeneration")])
def test_shapes_match_transformers_on_the_meta_device(name: str, cls: str) -> None:
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(FIXTURES / name)
    with torch.device("meta"):  # shapes only: no memory, no weights
        model = getattr(transformers, cls)._from_config(config)
    expected = sum(p.numel() for p in model.parameters())
    assert decoder_shape(json.loads((FIXTURES / name / "config.json").read_text())).num_params == expected


def test_8xgpu_planner_gpu_budget_by_hand() -> None:
    result = _plan()
    assert [g.gpu for g in result.gpus] == [str(i) for i in range(8)]
    gpu0 = _items(result.gpus[0], "engine qwen3-8b replica 1/3")
    weights = QWEN3_8B_PARAMS * 2  # bf16
    lora = 4 * QWEN3_8B_LORA_R64 * 2  # max_loras slots, bf16
    activations = 8192 * (4 * 4096 + 2 * 12288) * 2 + 256 * 151_936 * 4
    context = int(0.75 * GIB)
    share = int(0.90 * 79.2 * GIB)
    kv = share - weights - lora - activations - context
    kv_tokens = kv // (2 * 36 * 8 * 128 * 2)
    assert gpu0 == {"weights": weights, "LoRA slots (4 x r64)": lora, "activations (profile)": activations,
                    "CUDA context": context, f"KV cache ({kv_tokens} tokens)": kv}
    assert 380_000 < kv_tokens < 390_000  # about 11.8 full 32k contexts per replica
    assert result.gpus[0].used_bytes == share


def test_8xgpu_learner_gpu_budget_by_hand() -> None:
    gpu7 = _plan().gpus[7]
    items = _items(gpu7, "serving process")
    assert items["learner weights"] == QWEN3_8B_PARAMS * 2
    # weight, grad, two AdamW moments, and the rollback snapshot of weight + moments, all fp32
    assert items["learner LoRA r64 + grads + AdamW + rollback snapshot (fp32)"] == QWEN3_8B_LORA_R64 * (16 + 12)
    tokens = 1 * 16384  # micro_batch_size x max_seq_len
    # per logit: bf16 logits (2) + fp32 scaled logits (4) + the log-softmax backward's fp32 temporaries (9)
    assert items["learner activations (checkpointed)"] == (
        tokens * (36 * 4096 + 8 * 4096 + 4 * 12288) * 2 + tokens * 151_936 * (2 + 4 + 9))
    # the store's hard capacities (memory.max_num_stored), memories and Meta Plan pairs alike
    assert items["FAISS index (100000 memories, 100000 Meta Plan pairs)"] == (2 + 2) * 100_000 * 384 * 4
    assert items["score key matrices"] == 2 * 100_000 * 384 * 4
    assert gpu7.used_bytes < gpu7.capacity_bytes
    assert 60 * GIB < gpu7.used_bytes < 67 * GIB


def test_8xgpu_vl_gpu_counts_the_vision_profile_by_hand() -> None:
    """vLLM profiles the vision tower at start with the largest image: Qwen2.5-VL's default max_pixels
    12,845,056 = 16,384 merged tokens of 2 x 2 patches; the tower's peak per patch is 4 rows of 1280 +
    2 of 3420, bf16; the encoder budget max(8192 batched tokens, 16,384) holds one such image, and its
    16,384 embeddings of the decoder's width 3584 stay in the encoder cache."""
    result = _plan()
    vl = _items(result.gpus[3], "engine qwen2_5-vl-7b replica 1/2")
    expected = 16_384 * 4 * (4 * 1280 + 2 * 3420) * 2 + 16_384 * 3584 * 2
    assert vl["vision tower activations + encoder cache (profile)"] == expected
    assert 1.5 * GIB < expected < 1.7 * GIB
    text_only = _items(_plan(**{"engines.qwen2_5-vl-7b.language_model_only": True}).gpus[3], "engine qwen2_5-vl-7b")
    assert "vision tower activations + encoder cache (profile)" not in text_only


def test_32b_manager_split_over_two_gpus() -> None:
    result = _plan()
    for gpu, rank in ((5, 1), (6, 2)):
        owner = result.gpus[gpu].claims[0].owner
        assert owner == f"engine qwen3-32b replica 1/1 rank {rank}/2"
        assert _items(result.gpus[gpu], owner)["weights"] == 32_762_123_264 * 2 // 2


@pytest.mark.parametrize("overrides, message", [
    ({"learner.device": "cuda:0"}, "learner.device: GPU 0 is over-committed"),
    ({"learner.max_seq_len": 65536}, "learner.device: GPU 7 is over-committed"),
    ({"engines.qwen3-8b.gpu_memory_utilization": 0.2}, "engines.qwen3-8b.gpu_memory_utilization:"),
    ({"engines.qwen3-32b.devices": [5, 9]}, "engines.qwen3-32b.devices: GPU 9 does not exist"),
    ({"engines.qwen3-32b.executor_backend": "ray", "engines.qwen3-32b.devices": [],
      "engines.qwen3-32b.tensor_parallel_size": 16}, "engines.qwen3-32b.tensor_parallel_size:"),
])
def test_impossible_configs_are_refused_naming_the_field(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _plan(**overrides)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("overrides, field", [
    ({"engines.qwen3-8b.devices": [0, 1]}, "engines.qwen3-8b.devices"),  # TP x DP = 3 GPUs
    ({"engines.qwen3-32b.executor_backend": "uni"}, "engines.qwen3-32b.executor_backend"),  # TP 2
])
def test_structural_refusals_come_from_the_config_check(overrides: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=f"^{field}:"):
        _config(**overrides)


def test_ray_engine_budgeted_per_ray_gpu() -> None:
    result = _plan(**{"engines.qwen3-32b.executor_backend": "ray", "engines.qwen3-32b.devices": [],
                      "engines.qwen3-32b.tensor_parallel_size": 8, "engines.qwen3-32b.pipeline_parallel_size": 2})
    ray = next(g for g in result.gpus if g.gpu == "ray:qwen3-32b")
    assert _items(ray, "engine qwen3-32b")["weights"] == 32_762_123_264 * 2 // 16
    assert any("16 GPUs on >= 2 node(s)" in note for note in result.notes)
    assert not result.gpus[5].claims  # the local GPUs it used to hold are free


def test_cli_dry_run_prints_and_refuses(tmp_path: Path) -> None:
    flags = [f"--{k}={v}" for k, v in MODELS.items()]
    command = [sys.executable, "-m", "mia_engine", "serve", "--config", CONFIG, "--dry-run", *flags]
    ok = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "GPU 7" in ok.stdout and "learner weights" in ok.stdout and "KV cache" in ok.stdout
    bad = subprocess.run([*command, "--learner.device=cuda:3"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [bad.stderr.strip()]
    assert "learner.device: GPU 3 is over-committed" in bad.stderr


def test_an_idefics3_vision_tower_is_counted_exactly(tmp_path: Path) -> None:
    """SmolVLM's layout (the CPU VL configs): the dry run's count equals transformers' own, on the tiny
    VL test model."""
    import torch
    from transformers import AutoModelForImageTextToText

    from mia_engine.models.tiny_vl import build_tiny_vl

    build_tiny_vl(tmp_path)
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "base", dtype=torch.float32)
    counted = sum(p.numel() for name, p in model.named_parameters() if "vision_model" in name or "connector" in name)
    shape = decoder_shape(json.loads((tmp_path / "base" / "config.json").read_text()))
    assert shape.num_vision_params == counted
