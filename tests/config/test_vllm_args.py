"""An engine table's vLLM arguments: vLLM's own (``EngineArgs`` of the installed vLLM), in vLLM's spelling."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from mia_engine.config import ConfigError, EngineConfig, load_config
from mia_engine.config.vllm_args import ENGINE_ARGS, SET_FROM, VLLM_VERSION
from mia_engine.engines.vllm_engine import VLLMEngine

from tests.processes import refused_serve

ROOT = Path(__file__).resolve().parents[2]


def test_the_engine_arguments_file_is_the_installed_vllms() -> None:
    """Moving vLLM without regenerating the file fails here (run scripts/vllm_engine_args.py)."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "vllm_engine_args.py"), "--check"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_vllm_serve_flag_is_an_engine_field_or_set_from_one() -> None:
    """Derived from vLLM: each ``EngineArgs`` field that ``vllm serve`` has a flag for is a field of the engine
    table, or one of the few set from a field of ours; nothing is ours and theirs under two names."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    flagged = set(ENGINE_ARGS) | set(SET_FROM)
    fields = set(EngineConfig.__struct_fields__)
    assert set(ENGINE_ARGS) <= fields
    assert not set(SET_FROM) & fields
    assert flagged <= {field.name for field in dataclasses.fields(AsyncEngineArgs)}
    assert VLLM_VERSION == __import__("vllm").__version__


def test_a_misspelt_key_is_one_line_naming_it_with_vllms_spelling() -> None:
    with pytest.raises(ConfigError) as err:
        load_config("tiny", {"engines.tiny.quantisation": "awq"})
    assert str(err.value) == (f"engines.tiny.quantisation: not an engine field nor an engine argument of vLLM "
                              f"{VLLM_VERSION} (did you mean quantization?)")


def test_a_value_vllm_does_not_take_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^engines\.tiny\.kv_cache_dtype: Invalid enum value 'fp9'$"):
        load_config("tiny", {"engines.tiny.kv_cache_dtype": "fp9"})
    with pytest.raises(ConfigError, match=r"^engines\.tiny\.max_logprobs: Expected `int`, got `str`$"):
        load_config("tiny", {"engines.tiny.max_logprobs": "many"})


def test_good_keys_reach_vllms_engine_args(tmp_path: Path) -> None:
    config = load_config("tiny", {"engines.tiny.max_logprobs": 7, "engines.tiny.kv_cache_dtype": "fp8",
                                  "engines.tiny.enable_chunked_prefill": False,
                                  "engines.tiny.compilation_config": {"mode": 0}})
    args = VLLMEngine("tiny", config.engines["tiny"], tmp_path)._engine_args()
    assert (args.max_logprobs, args.kv_cache_dtype, args.enable_chunked_prefill) == (7, "fp8", False)
    assert args.max_model_len == config.engines["tiny"].max_model_len
    assert args.compilation_config.mode == 0


def test_only_what_differs_from_vllms_defaults_is_passed() -> None:
    engine = EngineConfig(model="m", tensor_parallel_size=1, kv_cache_dtype="auto", max_num_seqs=8)
    assert engine.other_vllm_args() == {}
    assert EngineConfig(model="m", tensor_parallel_size=2).other_vllm_args() == {"tensor_parallel_size": 2}


def test_vllms_arguments_show_only_where_set_and_are_documented_apart() -> None:
    from mia_engine.base.config_docs import render_markdown, render_toml

    shown = render_toml(load_config("tiny", {"engines.tiny.kv_cache_dtype": "fp8"}))
    assert 'kv_cache_dtype = "fp8"' in shown and "quantization" not in shown
    reference = render_markdown(type(load_config("tiny")), "t", "i")
    assert "| `quantization` |" in reference and "(vLLM's `--quantization`)" in reference


def test_serve_refuses_a_bad_key_before_anything_starts(tmp_path: Path) -> None:
    done = refused_serve(tmp_path, "--engines.tiny.quantisation=awq")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(
        f"engines.tiny.quantisation: not an engine field nor an engine argument of vLLM {VLLM_VERSION} "
        "(did you mean quantization?)")


@pytest.mark.parametrize("engine", [EngineConfig(model="m"), *load_config("8xgpu").engines.values()])
def test_every_default_of_vllms_is_a_value_its_field_takes(engine: EngineConfig) -> None:
    """Each field's type and vLLM's default agree: the engine converts back from its own TOML values."""
    assert msgspec.convert(msgspec.to_builtins(engine), EngineConfig) == engine
