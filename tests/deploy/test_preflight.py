"""What ``serve`` and ``--dry-run`` check before any engine starts: every role's adapter (``init-adapter``
creates the Planner's), the per-GPU budget, and ``cuda``/``auto`` devices resolved to the GPU it counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mia_engine.cli import parse_config
from mia_engine.config import ConfigError, load_config
from mia_engine.deploy.adapters import check_adapter_files, check_role_adapters
from mia_engine.deploy.budget import OverCommitted, plan
from mia_engine.devices import resolved_devices
from mia_engine.models.lora import init_adapter
from mia_engine.models.tiny import build_tiny

FIXTURES = Path(__file__).parent / "fixtures"
CONFIG = str(Path(__file__).parents[2] / "configs" / "8xgpu.toml")
MODELS = {"engines.qwen3-8b.model": str(FIXTURES / "qwen3-8b"),
          "engines.qwen2_5-vl-7b.model": str(FIXTURES / "qwen2_5-vl-7b"),
          "engines.qwen3-32b.model": str(FIXTURES / "qwen3-32b")}


@pytest.fixture(scope="module")
def planner_adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_adapter(FIXTURES / "qwen3-8b", tmp_path_factory.mktemp("adapter") / "planner", rank=8)


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "tiny"
    build_tiny(out)
    return out / "base"


def _check(adapter: Path, **overrides: object) -> list[str]:
    config = load_config(CONFIG, {**MODELS, "roles.planner.adapter": str(adapter), **overrides})
    return check_role_adapters(config, Path, lambda spec, base: Path(spec))


def test_init_adapter_starts_from_the_base_model(tiny_base: Path, tmp_path: Path) -> None:
    """The command's adapter loads in PEFT with every B zero, so the adapted model is the base model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "adapter"
    done = subprocess.run([sys.executable, "-m", "mia_engine", "init-adapter", "--base", str(tiny_base),
                           "--rank", "8", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["lora_alpha"] == 16
    assert sorted(config["target_modules"]) == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                       "up_proj", "down_proj"])
    base = AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32)
    ids = torch.tensor([[1, 5, 9, 12, 40]])
    with torch.no_grad():
        expected = base(ids).logits
        model = PeftModel.from_pretrained(base, out)
        weights = {name: p for name, p in model.named_parameters() if "lora_" in name}
        assert weights and all(not p.any() for name, p in weights.items() if "lora_B" in name)
        assert all(p.abs().sum() > 0 for name, p in weights.items() if "lora_A" in name)
        assert torch.equal(model(ids).logits, expected)
    assert check_adapter_files(out, 8, tiny_base).startswith(f"{out} (rank 8, 7 target modules")


def test_init_adapter_refuses_what_vllm_would_not_serve(tiny_base: Path, tmp_path: Path) -> None:
    def init(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "mia_engine", "init-adapter", "--base", str(tiny_base),
                               "--out", str(tmp_path / "a"), *flags], capture_output=True, text=True, timeout=120)

    assert "rank 12 is not one vLLM serves" in init("--rank", "12").stderr
    assert "got ['lm_head']" in init("--rank", "8", "--targets", "q_proj,lm_head").stderr
    assert init("--rank", "8").returncode == 0
    existing = init("--rank", "8")
    assert existing.returncode == 2 and "exists" in existing.stderr


def test_the_dry_run_checks_every_adapter(planner_adapter: Path, tiny_base: Path, tmp_path: Path) -> None:
    assert _check(planner_adapter) == [f"roles.planner.adapter: {planner_adapter} (rank 8, 7 target modules, "
                                       "504 matrices)"]
    with pytest.raises(ConfigError, match=r"^roles.planner.adapter: /nowhere does not exist; create .* "
                                          r"`python -m mia_engine init-adapter --base .*qwen3-8b --rank 64 "
                                          r"--out /nowhere`$"):
        _check(Path("/nowhere"))
    with pytest.raises(ConfigError, match=r"^roles.planner.adapter: .* rank 8 is not in 1..1"):
        _check(planner_adapter, **{"engines.qwen3-8b.max_lora_rank": 1})  # vLLM takes 1, 8, 16, ...: the one below 8
    other_base = init_adapter(tiny_base, tmp_path / "tiny-adapter", rank=8)  # made for another model
    with pytest.raises(ConfigError, match=r"^roles.planner.adapter: .*layers.0.mlp.down_proj.lora_A.weight has "
                                          r"shape \(8, 256\), the base model needs \(8, 12288\) \(rank 8\)$"):
        _check(other_base)
    config_file = tmp_path / "tiny-adapter" / "adapter_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()),
                                       "target_modules": ["q_proj", "lm_head"]}))
    with pytest.raises(ConfigError, match=r"^roles.planner.adapter: .* targets lm_head, which vLLM and the "
                                          r"learner do not adapt"):
        _check(other_base)


def test_cuda_and_auto_devices_are_the_gpu_the_budget_counts(planner_adapter: Path) -> None:
    config = load_config(CONFIG, {**MODELS, "memory.score_device": "auto", "learner.device": "cuda"})
    with pytest.raises(OverCommitted, match=r"^learner.device: GPU 0 is over-committed") as refused:
        plan(config, Path)
    gpu0 = refused.value.plan.gpus[0]
    assert [c.owner for c in gpu0.claims] == ["engine qwen3-8b replica 1/3", "serving process (learner, score)"]
    assert "score key matrices" in [item.what for item in gpu0.claims[1].items]
    resolved = resolved_devices(config, has_gpu=True)
    assert (resolved.memory.score_device, resolved.learner.device) == ("cuda:0", "cuda:0")
    cpu_only = resolved_devices(config, has_gpu=False)
    assert (cpu_only.memory.score_device, cpu_only.learner.device) == ("cpu", "cuda:0")
    _, served = parse_config(["serve", "--config", "tiny", "--memory.score_device=auto",
                              "--memory.embedder.device=cuda", "--learner.device=cuda"], environ={})
    has_gpu = torch.cuda.is_available()
    assert served.memory.score_device == ("cuda:0" if has_gpu else "cpu")
    assert (served.memory.embedder.device, served.learner.device) == ("cuda:0", "cuda:0")


def test_serve_refuses_an_over_committed_config_before_starting(planner_adapter: Path, tmp_path: Path) -> None:
    """What the dry run refuses, ``serve`` refuses too, with the same table, before any engine starts."""
    flags = [f"--{k}={v}" for k, v in MODELS.items()] + [f"--roles.planner.adapter={planner_adapter}"]
    env = {**os.environ, "MIA_API_KEY": "api-key-of-16-chars", "MIA_HOME": str(tmp_path / "home")}
    started = time.monotonic()
    bad = subprocess.run([sys.executable, "-m", "mia_engine", "serve", "--config", CONFIG, *flags,
                          "--learner.device=cuda:3", f"--data-dir={tmp_path / 'data'}"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert time.monotonic() - started < 60
    *table, error = bad.stderr.strip().splitlines()
    assert error.startswith("python -m mia_engine: error: learner.device: GPU 3 is over-committed")
    assert "Memory per GPU (GiB)" in table and "  GPU 3: " in "\n".join(table)
    missing = subprocess.run([sys.executable, "-m", "mia_engine", "serve", "--config", "tiny",
                              "--roles.planner.adapter=/nowhere", f"--data-dir={tmp_path / 'data'}"],
                             capture_output=True, text=True, timeout=120, env=env)
    assert missing.returncode == 2
    assert missing.stderr.strip().startswith("python -m mia_engine: error: roles.planner.adapter: /nowhere does "
                                             "not exist")


def test_a_separate_search_encoder_on_a_gpu_is_counted() -> None:
    """``tools.embedder`` different from the memory's is a second encoder in the serving process."""
    def serving(**overrides: object) -> dict[str, int]:
        gpu7 = plan(load_config(CONFIG, {**MODELS, **overrides}), Path).gpus[7]
        claim = next(c for c in gpu7.claims if c.owner.startswith("serving process"))
        return {"owner": claim.owner, **{item.what: item.num_bytes for item in claim.items}}

    shared = serving(**{"tools.embedder.device": "cuda:7", "tools.embedder.dtype": "auto"})
    assert "search encoder weights + activations" not in shared  # the same encoder serves both
    separate = serving(**{"tools.embedder.device": "cuda:7", "tools.embedder.batch_size": 32})
    assert separate["owner"] == "serving process (embedder, learner, score, search encoder)"
    assert 0 < separate["search encoder weights + activations"] < separate["encoder weights + activations"]
