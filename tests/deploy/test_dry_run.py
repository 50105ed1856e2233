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
    # per token, bf16: 36 checkpointed layer inputs, one layer's recompute (8 H + 4 I), the final hidden
    # states, their flattened copy, their gradient rows kept for the backward and the gradient (4 H)
    assert items["learner activations (checkpointed)"] == tokens * (36 * 4096 + 8 * 4096 + 4 * 12288 + 4 * 4096) * 2
    # one chunk of logit_chunk_size = 1024 positions, whatever max_seq_len; per logit: bf16 logits (2)
    # + fp32 scaled logits (4) + the log-softmax backward's fp32 temporaries (9)
    assert items["learner log-probs (1024-position logit chunk)"] == 1024 * 151_936 * (2 + 4 + 9)
    assert not any(what.startswith("FAISS index") for what in items)  # memory.index_device = "cpu"
    # on GPU 7 when asked: the store's hard capacities (memory.max_num_stored), memories and Meta Plan pairs
    on_gpu = _items(_plan(**{"memory.index_device": "cuda:7"}).gpus[7], "serving process")
    assert on_gpu["FAISS index (100000 memories, 100000 Meta Plan pairs, 41 x 1024 removed rows)"] == (
        (2 * 100_000 + 41 * 1024) * (384 + 1) * 4)  # key + norm per row; 41 indexes (see the FAISS test below)
    assert items["score key matrices"] == 2 * 100_000 * 384 * 4
    # the learner in a process of its own (learner.process = "spawn") has a CUDA context of its own
    assert items["learner process CUDA context"] == items["CUDA context"]
    threaded = _items(_plan(**{"learner.process": "thread"}).gpus[7], "serving process")
    assert "learner process CUDA context" not in threaded
    assert gpu7.used_bytes < gpu7.capacity_bytes
    assert 28 * GIB < gpu7.used_bytes < 33 * GIB


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
    ({"learner.micro_batch_size": 8}, "learner.device: GPU 7 is over-committed"),  # 8 x 16k tokens
    ({"engines.qwen3-8b.gpu_memory_utilization": 0.2}, "engines.qwen3-8b.gpu_memory_utilization:"),
    # the learner keeps activations in all but 1 GiB of GPU 7; encoder, score matrices and context need 1.5
    ({"learner.checkpoint_headroom_gib": 1.0}, "learner.checkpoint_headroom_gib: 1 GiB is less than the 1.50 GiB"),
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


@pytest.fixture(scope="module")
def planner_adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Planner's adapter for the Qwen3-8B fixture, as an operator creates it (rank 8: small and fast)."""
    from mia_engine.models.lora import init_adapter

    return init_adapter(FIXTURES / "qwen3-8b", tmp_path_factory.mktemp("adapter") / "planner", rank=8)


def test_cli_dry_run_prints_and_refuses(planner_adapter: Path) -> None:
    flags = [f"--{k}={v}" for k, v in MODELS.items()] + [f"--roles.planner.adapter={planner_adapter}"]
    command = [sys.executable, "-m", "mia_engine", "serve", "--config", CONFIG, "--dry-run", *flags]
    ok = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "GPU 7" in ok.stdout and "learner weights" in ok.stdout and "KV cache" in ok.stdout
    assert f"roles.planner.adapter: {planner_adapter} (rank 8, 7 target modules" in ok.stdout
    bad = subprocess.run([*command, "--learner.device=cuda:3"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    *table, error = bad.stderr.strip().splitlines()  # the per-GPU table, then one line naming the field
    assert error.startswith("python -m mia_engine: error: learner.device: GPU 3 is over-committed")
    assert table[0] == "Memory per GPU (GiB)" and any("learner activations" in line for line in table)


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


@pytest.mark.parametrize("max_seq_len", [4096, 16384, 65536])
def test_learner_log_probs_cost_one_logit_chunk_whatever_the_sequence_length(max_seq_len: int) -> None:
    """The log-probs are made ``logit_chunk_size`` positions at a time: their term stays one chunk's
    logits, and only the per-token activations grow with the sequence."""
    from mia_engine.deploy.budget import learner_items
    from mia_engine.config.learner import LearnerConfig

    shape = decoder_shape(json.loads((FIXTURES / "qwen3-8b" / "config.json").read_text()))
    config = LearnerConfig(dtype="bfloat16", micro_batch_size=1, max_seq_len=max_seq_len, logit_chunk_size=2048)
    items = {i.what: i.num_bytes for i in learner_items(config, shape, 64, 32768)}
    assert items["learner log-probs (2048-position logit chunk)"] == 2048 * 151_936 * (2 + 13)
    assert items["learner activations (checkpointed)"] == max_seq_len * (48 * 4096 + 4 * 12288) * 2
    short = learner_items(LearnerConfig(dtype="bfloat16", micro_batch_size=1, max_seq_len=100), shape, 64, 32768)
    assert short[-1] == type(short[-1])("learner log-probs (100-position logit chunk)", 100 * 151_936 * 15)


def test_faiss_on_a_gpu_counts_its_scratch_once_and_its_growth_copy() -> None:
    """``memory.index_device = "cuda:7"``: the store's one ``StandardGpuResources`` reserves the scratch
    ``memory/index.py`` sets (once, whatever the number of indexes); the flat indexes (2 labels x 2
    modalities x 10 categories + the Meta Plan index = 41) hold a question key and its norm per row, up to
    1024 removed rows each, and the largest is held twice while FAISS reallocates it on an add. On "cpu",
    none of it."""
    from mia_engine.memory.index import GPU_TEMP_MEMORY_BYTES, MAX_NUM_REMOVED_ROWS

    assert (GPU_TEMP_MEMORY_BYTES, MAX_NUM_REMOVED_ROWS) == (64 * 1024**2, 1024)
    serving = next(c for c in _plan(**{"memory.index_device": "cuda:7"}).gpus[7].claims
                   if c.owner.startswith("serving process"))
    faiss_items = {i.what: i.num_bytes for i in serving.items if i.what.startswith("FAISS")}
    row = (384 + 1) * 4
    assert faiss_items == {
        "FAISS index (100000 memories, 100000 Meta Plan pairs, 41 x 1024 removed rows)": (200_000 + 41 * 1024) * row,
        "FAISS growth copy (largest index, on add)": (100_000 + 1024) * row,
        "FAISS scratch (StandardGpuResources temp memory)": 64 * 1024**2,
    }
    assert sum(i.what.startswith("FAISS scratch") for i in serving.items) == 1
    fewer_pairs = _items(_plan(**{"memory.index_device": "cuda:7", "memory.max_num_meta_plans": 500}).gpus[7],
                         "serving process")
    assert fewer_pairs["FAISS index (100000 memories, 500 Meta Plan pairs, 41 x 1024 removed rows)"] == (
        (100_500 + 41 * 1024) * row)
    on_cpu = _items(_plan(**{"memory.index_device": "cpu"}).gpus[7], "serving process")
    assert not any(what.startswith("FAISS") for what in on_cpu)
