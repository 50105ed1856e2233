"""``--lora-modules`` values (vLLM's ``name=path`` and JSON forms) as dotted role overrides, and the roles they
make loaded into a real config: an extra model id per adapter, beside the agent's roles."""

from __future__ import annotations

import json

import pytest

from mia_engine.config import ConfigError, load_config
from mia_engine.config.lora_modules import default_lora_engine, lora_module_overrides

ENGINES = ["tiny", "big"]


def test_name_equals_path_goes_on_the_default_engine() -> None:
    assert lora_module_overrides(["sql-lora=/adapters/sql"], ["tiny"], "tiny") == {
        "roles.sql-lora.engine": "tiny", "roles.sql-lora.adapter": "/adapters/sql"}


def test_the_json_form_names_its_base_model() -> None:
    values = [json.dumps({"name": "sql", "path": "/a/sql", "base_model_name": "big"}),
              json.dumps({"name": "chat", "path": "/a/chat"}), ""]
    assert lora_module_overrides(values, ENGINES, "tiny") == {
        "roles.sql.engine": "big", "roles.sql.adapter": "/a/sql",
        "roles.chat.engine": "tiny", "roles.chat.adapter": "/a/chat"}


def test_a_json_list_and_a_served_model_name() -> None:
    """``base_model_name`` may be one of an engine's ``served_model_name`` ids (engines given as a mapping)."""
    value = json.dumps([{"name": "a", "path": "/a", "base_model_name": "Qwen/Qwen3-8B"}, {"name": "b", "path": "/b"}])
    overrides = lora_module_overrides([value], {"main": ["Qwen/Qwen3-8B"], "small": []}, "small")
    assert overrides == {"roles.a.engine": "main", "roles.a.adapter": "/a",
                         "roles.b.engine": "small", "roles.b.adapter": "/b"}


@pytest.mark.parametrize("values, message", [
    (["sql=/a", "sql=/b"], "'sql' is given twice"),
    (["mia=/a"], "reserved model id"),
    (["embedding=/a"], "reserved model id"),
    (["tiny=/a"], "model id of engine 'tiny'"),
    (["=/a"], "is empty"),
    (["sql="], "the path is empty"),
    (["a.b=/a"], "contains '.'"),
    (["a b=/a"], "whitespace"),
    (["{not json"], "neither name=path nor JSON"),
    (["sql"], "neither name=path nor JSON"),
    (['{"name": "sql"}'], "name and path must be strings"),
    (['{"name": "sql", "path": "/a", "rank": 8}'], "unknown field 'rank'"),
    (['{"name": "sql", "path": "/a", "is_3d_lora_weight": true}'], "3D (MoE)"),
    (['{"name": "sql", "path": "/a", "base_model_name": "gpt-9"}'], "base_model_name 'gpt-9' is not a base model"),
    (['[1]'], "expected a JSON object"),
])
def test_malformed_values_are_one_config_error_line(values: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        lora_module_overrides(values, ENGINES, "tiny")
    assert message in str(err.value) and str(err.value).startswith("--lora-modules: ")
    assert "\n" not in str(err.value)


def test_without_a_default_engine_the_base_model_must_be_named() -> None:
    with pytest.raises(ConfigError, match="base_model_name"):
        lora_module_overrides(["sql=/a"], ENGINES, "")


def test_the_overrides_load_as_an_extra_role_the_agent_does_not_use(tmp_path) -> None:
    """What the flag produces is a valid config: the extra role on the engine, the agent's roles unchanged."""
    config = load_config("tiny")
    engine = default_lora_engine(config)
    assert engine == "tiny"
    overrides = lora_module_overrides([f"sql-lora={tmp_path}"], list(config.engines), engine)
    loaded = load_config("tiny", overrides)
    assert (loaded.roles["sql-lora"].engine, loaded.roles["sql-lora"].adapter) == ("tiny", str(tmp_path))
    assert loaded.agent.roles == config.agent.roles


def test_the_default_engine_is_the_planners_among_several() -> None:
    config = load_config("8xgpu_cpu")
    planner_engine = config.roles[config.agent.roles.planner].engine
    assert len(config.engines) > 1 and default_lora_engine(config) == planner_engine
