"""The ``[engines.<name>.vllm]`` pass-through table, against the installed vLLM's own ``EngineArgs``."""

from __future__ import annotations

from pathlib import Path

import pytest

from mia_engine.config import load_config
from mia_engine.engines.engine_args import check_engine_tables, engine_arg_names, vllm_version
from mia_engine.engines.vllm_engine import VLLMEngine

from tests.processes import refused_serve


def tiny_with(**table: object):
    return load_config("tiny", {f"engines.tiny.vllm.{key}": value for key, value in table.items()})


def test_a_misspelt_key_is_one_line_naming_it_with_vllms_spelling() -> None:
    with pytest.raises(ValueError) as err:
        check_engine_tables(tiny_with(quantisation="awq"))
    assert str(err.value) == (f"engines.tiny.vllm.quantisation: not an engine argument of vLLM {vllm_version()} "
                              "(did you mean quantization?)")


def test_a_key_set_from_our_own_field_names_that_field() -> None:
    with pytest.raises(ValueError, match=r"^engines\.tiny\.vllm\.max_model_len: set by engines\.tiny\.max_model_len"):
        check_engine_tables(tiny_with(max_model_len=512))
    with pytest.raises(ValueError, match=r"^engines\.tiny\.vllm\.device_ids: set by engines\.tiny\.devices"):
        check_engine_tables(tiny_with(device_ids=[0]))


def test_every_key_we_set_is_an_engine_argument_of_vllm() -> None:
    """The refusal list stays in step with vLLM (a rename there would make a key silently ours and theirs)."""
    from mia_engine.engines.engine_args import OWN_KEYS, SET_BY_ENGINE

    assert set(OWN_KEYS) | set(SET_BY_ENGINE) <= engine_arg_names()


def test_good_keys_reach_vllms_engine_args(tmp_path: Path) -> None:
    config = tiny_with(max_logprobs=7, kv_cache_dtype="fp8", enable_chunked_prefill=False)
    check_engine_tables(config)
    args = VLLMEngine("tiny", config.engines["tiny"], tmp_path)._engine_args()
    assert (args.max_logprobs, args.kv_cache_dtype, args.enable_chunked_prefill) == (7, "fp8", False)
    assert args.max_model_len == config.engines["tiny"].max_model_len


def test_an_engine_refuses_a_bad_key_when_it_builds_its_args(tmp_path: Path) -> None:
    engine = VLLMEngine("tiny", tiny_with(enforce_eagre=True).engines["tiny"], tmp_path)
    with pytest.raises(ValueError, match=r"^engines\.tiny\.vllm\.enforce_eagre: .*\(did you mean enforce_eager\?\)$"):
        engine._engine_args()


def test_serve_refuses_a_bad_key_before_anything_starts(tmp_path: Path) -> None:
    done = refused_serve(tmp_path, "--engines.tiny.vllm.quantisation=awq")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(
        "engines.tiny.vllm.quantisation: not an engine argument of vLLM "
        f"{vllm_version()} (did you mean quantization?)")
