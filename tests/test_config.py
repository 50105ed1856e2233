"""Config loading, overrides and one-line errors that name the field."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mia_engine.config import ConfigError, load_config


@pytest.mark.parametrize("name", ["default", "tiny", "8xgpu", "tiny_vl", "vl_local"])
def test_bundled_configs_load(name: str) -> None:
    config = load_config(name)
    assert {"planner", "executor", "manager", "judge", "router"} <= set(config.roles)
    for role in config.roles.values():
        assert role.alias_of or role.engine in config.engines


def test_8xgpu_places_every_engine_on_distinct_gpus() -> None:
    config = load_config("8xgpu")
    used = [d for e in config.engines.values() for d in e.devices]
    assert len(used) == len(set(used)) and max(used) <= 7


def test_dotted_overrides_apply() -> None:
    config = load_config("tiny", {"engines.tiny.max_model_len": 512, "server.port": 9001,
                                  "roles.planner.sampling.temperature": 0.5})
    assert config.engines["tiny"].max_model_len == 512
    assert config.server.port == 9001
    assert config.roles["planner"].sampling.temperature == 0.5


@pytest.mark.parametrize("overrides, field", [
    ({"engines.tiny.max_model_len": "long"}, "engines.tiny.max_model_len"),
    ({"engines.tiny.surprise": 1}, "engines.tiny"),
    ({"server.port": 70000}, "server.port"),
    ({"roles.judge.alias_of": "boss"}, "roles.judge.alias_of"),
    ({"roles.planner.engine": "nowhere"}, "roles.planner.engine"),
    ({"engines.tiny.max_cpu_loras": 1}, "engines.tiny.max_cpu_loras"),
    ({"engines.tiny.structured_outputs_backend": "auto"}, "engines.tiny.compact_json"),
    ({"engines.tiny.executor_backend": "slurm"}, "engines.tiny.executor_backend"),
    ({"engines.tiny.block_size": -16}, "engines.tiny.block_size"),
    ({"cpu.onednn_cache_capacity": -1}, "cpu.onednn_cache_capacity"),
    ({"engines.tiny.executor_backend": "uni", "engines.tiny.tensor_parallel_size": 2},
     "engines.tiny.executor_backend"),
    ({"engines.tiny.executor_backend": "ray", "engines.tiny.devices": [0]}, "engines.tiny.devices"),
    ({"engines.tiny.tensor_parallel_size": 2, "engines.tiny.devices": [0, 1, 2]}, "engines.tiny.devices"),
    ({"engines.tiny.devices": [3, 3], "engines.tiny.data_parallel_size": 2}, "engines.tiny.devices"),
    ({"memory.index_device": "gpu0"}, "memory"),
    ({"roles.mia.engine": "tiny"}, "mia"),
    ({"memory.embedder.batch_size": 0}, "memory.embedder"),
    ({"agent.roles.captioner": "painter"}, "agent.roles.captioner"),
])
def test_invalid_values_name_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("tiny", overrides)
    assert str(info.value).startswith(field), str(info.value)
    assert "\n" not in str(info.value)


def test_the_onednn_bound_is_one_for_the_process_and_its_engines() -> None:
    """One bound for the engines and the serving process: ``[cpu]``'s; an engine's own ``cpu`` table does not
    take it, and the old top-level key is unknown like any other (no shim for where it used to be)."""
    with pytest.raises(ConfigError, match=r"^engines\.tiny\.cpu: Object contains unknown field `onednn_cache_capacity`$"):
        load_config("tiny", {"engines.tiny.cpu.onednn_cache_capacity": 64})
    with pytest.raises(ConfigError, match=r"^Object contains unknown field `cpu_onednn_cache_capacity`$"):
        load_config("tiny", {"cpu_onednn_cache_capacity": 64})
    assert load_config("tiny", {"cpu.onednn_cache_capacity": 64}).cpu.onednn_cache_capacity == 64


@pytest.mark.parametrize("args, expected", [
    (["--engines.tiny.max_model_len=abc"], "engines.tiny.max_model_len"),
    (["--no-such-flag"], "unrecognized argument: --no-such-flag"),
    (["--config", "missing-config"], "--config"),
])
def test_cli_errors_are_one_line(args: list[str], expected: str) -> None:
    result = subprocess.run([sys.executable, "-m", "mia_engine", "serve", "--config", "tiny", *args],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m mia_engine: error:") and expected in lines[0]


def test_the_learner_scores_tokens_at_the_temperature_they_were_sampled_at() -> None:
    with pytest.raises(ConfigError, match="learner.temperature: 0.7 must equal agent.planner_rollout_temperature"):
        load_config("tiny", {"learner.temperature": 0.7})
    assert load_config("tiny", {"learner.temperature": 0.7, "agent.planner_rollout_temperature": 0.7})
