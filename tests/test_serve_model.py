"""``python -m mia_engine serve MODEL``, as ``vllm serve MODEL``: a local folder or a Hugging Face id (offline,
from a Hugging Face cache laid out as huggingface_hub lays it out) serves every role on one engine; the Planner
learns on a zero-B adapter created in the data dir at the first start and kept at the next; vLLM's engine flags
in vLLM's spelling, down to the engine arguments vLLM gets."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from mia_engine.cli import main, parse_args, parse_config
from mia_engine.config import ConfigError
from mia_engine.config.flags import engine_flags
from mia_engine.config.served_model import ModelFacts, engine_name, with_model
from mia_engine.config.vllm_args import ENGINE_ARGS
from mia_engine.models.embedded import embedded_root
from mia_engine.models.lora import initial_adapter
from tests import conftest
from tests.conftest import _openai, start_server, stop_server, wait_ready_beside_next
from tests.test_hf_cache_model import REPO_ID, REVISION, hf_cache_with

TINY_SERVING = ("--tools.max_passages=300", "--tools.embedder.dtype=float32", "--memory.embedder.dtype=float32",
                "--learner.batch_size=2")
"""What configs/tiny.toml sets for its tools, memory and learner (the tiny model cannot run the default corpus
in seconds); the engine itself is configured by ``serve MODEL`` alone, plus vLLM flags."""
PROMPT = [{"role": "user", "content": "Write a plan to find the year the oldest university was founded."}]

ISSUE_FLAGS = ("--tensor-parallel-size", "--data-parallel-size", "--max-model-len", "--gpu-memory-utilization",
               "--dtype", "--quantization", "--kv-cache-dtype", "--enable-prefix-caching", "--max-lora-rank",
               "--max-loras", "--enforce-eager", "--chat-template", "--reasoning-parser", "--tool-call-parser",
               "--enable-auto-tool-choice", "--served-model-name")
"""The flags a `vllm serve` user's command line carries that the issue names."""


def _sample(field: str, spec: dict) -> tuple[list[str], object]:
    """Command-line words that set ``field`` to a value other than its default, and that value (or None where
    no such value can be written on a command line without knowing the field)."""
    kind, choices, default = spec["type"].rstrip("?"), spec["choices"], spec["default"]
    flag = spec["flag"]
    if kind == "bool":
        return ([flag], True) if default is not True else ([f"--no-{flag[2:]}"], False)
    if kind == "literal":
        value = next(c for c in choices if c != default and c is not None)
        return [flag, str(value)], value
    if kind == "int":
        return [flag, "7"], 7
    if kind == "float":
        return [flag, "0.25"], 0.25
    if kind == "str":
        return [flag, "x-y"], "x-y"
    if kind == "list[int]":
        return [flag, "1", "2"], [1, 2]
    if kind in ("list[str]", "list[str] | str"):
        return [flag, "a", "b"], ["a", "b"]
    if kind == "table":
        return [flag, "{}"], {}
    return [], None


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return embedded_root("embedded:tiny", tmp_path_factory.mktemp("flags_home")) / "base"


@pytest.mark.parametrize("field", sorted(ENGINE_ARGS))
def test_every_vllm_engine_flag_lands_in_every_engines_engine_args(field: str, tiny_base: Path) -> None:
    """Derived from vLLM's own EngineArgs (vllm_engine_args.json): a flag vLLM adds is covered here unedited.
    The flag sets the field on each of 8xgpu's three engines, and reaches the ``AsyncEngineArgs`` an engine
    hands vLLM."""
    from mia_engine.engines.vllm_engine import VLLMEngine

    words, value = _sample(field, ENGINE_ARGS[field])
    if value is None:
        pytest.skip(f"{ENGINE_ARGS[field]['type']}: no generic sample value")
    if ENGINE_ARGS[field]["flag"] in OURS:
        pytest.skip(f"{ENGINE_ARGS[field]['flag']} is serve's own flag ({OURS[ENGINE_ARGS[field]['flag']]})")
    args, overrides = parse_args(["serve", "--config", "8xgpu", *words])
    assert overrides[f"engines.*.{field}"] == value
    if field != "served_model_name":  # one id names one engine: the config refuses it on three (test below)
        try:
            config = parse_config(["serve", "--config", "8xgpu", "--dry-run", *words])[1]
        except ConfigError as err:  # a value a field's own rules refuse names that field
            assert field in str(err) or "devices" in str(err), err
            return
        assert [getattr(engine, field) for engine in config.engines.values()] == [value] * 3
    config = parse_config(["serve", "--config", "tiny", "--dry-run", *words])[1]
    engine = VLLMEngine("tiny", config.engines["tiny"], tiny_base)
    if field in SET_HERE:
        return
    assert engine.engine_kwargs()[field] == value
    if ENGINE_ARGS[field]["type"].rstrip("?") != "table":  # vLLM checks a table only as one of its configs
        assert getattr(engine._engine_args(), field) == value


SET_HERE = {"served_model_name": "vLLM gets the engine's name (its metrics' label)"}
"""Fields an engine passes to vLLM otherwise, and why."""
OURS = {"--log-level": "the server's and vLLM's processes' log level, server.log_level"}
"""vLLM engine flags that ``serve`` has a flag of the same name for, which keeps its meaning."""


def test_the_flags_a_vllm_serve_command_line_carries_exist() -> None:
    assert set(ISSUE_FLAGS) <= set(engine_flags())
    args, overrides = parse_args(["serve", "-tp", "2", "--max-model-len", "8k", "--no-enable-prefix-caching"])
    assert overrides == {"engines.*.tensor_parallel_size": 2, "engines.*.max_model_len": 8000,
                         "engines.*.enable_prefix_caching": False}


def test_an_unknown_flag_is_one_line_naming_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--tensor-paralel-size", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["python -m mia_engine: error: unrecognized argument: --tensor-paralel-size (did you mean "
                   "--tensor-parallel-size?)"]


def test_served_model_name_on_several_engines_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"served_model_name: 'x' is already the model id of"):
        parse_config(["serve", "--config", "8xgpu", "--dry-run", "--served-model-name", "x"])


def _facts(model: str, num_params: int, *, on_gpu: bool = False, context: int = 32768) -> ModelFacts:
    return ModelFacts(model, num_params, context, on_gpu)


def test_the_profile_follows_the_model_and_a_gpu_takes_vllms_defaults() -> None:
    default = _raw("default")
    small = with_model(None, _facts("HuggingFaceTB/SmolLM2-135M-Instruct", 135_000_000), default)
    large = with_model(None, _facts("Qwen/Qwen3-8B", 8_000_000_000, on_gpu=True), default)
    assert small["agent"]["profile"] == "small_model" and "agent" not in large  # the paper's loop
    assert large["engines"]["qwen3-8b"] == {"model": "Qwen/Qwen3-8B", "served_model_name": ["Qwen/Qwen3-8B"],
                                            "structured_outputs_backend": "xgrammar", "max_model_len": 32768,
                                            "enforce_eager": False}
    assert large["roles"]["planner"] == {"engine": "qwen3-8b", "adapter": "init"}
    cpu = with_model(None, _facts("Qwen/Qwen3-8B", 8_000_000_000), default)
    assert cpu["engines"]["qwen3-8b"]["max_model_len"] == 8192  # the CPU KV space holds one whole sequence
    assert engine_name("Qwen/Qwen2.5-7B-Instruct") == "qwen2-5-7b-instruct"


def test_model_with_a_config_replaces_its_planner_engine_model() -> None:
    raw = with_model(_raw("tiny"), _facts("org/m", 8_000_000_000), _raw("default"), ["m"])
    assert raw["engines"]["tiny"]["model"] == "org/m" and raw["engines"]["tiny"]["served_model_name"] == ["m"]
    assert raw["roles"]["planner"]["adapter"] == "init" and "adapter" not in raw["roles"]["executor"]


def _raw(name: str) -> dict:
    from mia_engine.config import read_toml

    return read_toml(name)


def test_a_gpu_engine_share_is_vllms_default_less_the_serving_process(tmp_path: Path) -> None:
    """The dry run of `serve MODEL` on a GPU plan: the engine's share is computed, not the bundled 0.3."""
    folder = embedded_root("embedded:tiny", tmp_path / "home") / "base"
    args, overrides = parse_args(["serve", str(folder), "--dry-run", "--gpus.num_gpus=1",
                                  "--memory.embedder.device=cuda"])
    from mia_engine.cli import _load

    config = _load(args, overrides)
    share = config.engines["base"].gpu_memory_utilization
    assert 0.8 < share < 0.92, share  # the encoder and a CUDA context on GPU 0 come off vLLM's 0.92
    assert config.engines["base"].enforce_eager is False and config.engines["base"].max_model_len == 4096


def test_the_init_adapter_is_created_once_and_reused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    base = embedded_root("embedded:tiny", tmp_path / "home") / "base"
    first = initial_adapter(base, tmp_path / "init", "planner", 8)
    weights = (first / "adapter_model.safetensors").stat().st_mtime_ns
    with caplog.at_level("INFO"):
        assert initial_adapter(base, tmp_path / "init", "planner", 8) == first
    assert "reusing" in caplog.text and (first / "adapter_model.safetensors").stat().st_mtime_ns == weights
    assert initial_adapter(base, tmp_path / "init", "planner", 16) != first  # another rank, another adapter


@pytest.mark.slow
def test_serve_a_folder_then_its_hub_id_learning_on_the_adapter_made_at_the_first_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = embedded_root("embedded:tiny", tmp_path / "build")
    folder = built / "base"
    extra = (*TINY_SERVING, f"--tools.index_dir={conftest.TINY_INDEX_DIR}", "--max-num-seqs", "16")
    data = tmp_path / "data"
    (tmp_path / "a").mkdir()
    server = start_server(tmp_path / "a", None, str(folder), *extra, data_dir=data)
    try:
        wait_ready_beside_next(server)
        client = _openai(server, 120)
        ids = {m.id for m in client.models.list().data}
        assert {str(folder), "mia", "planner", "executor", "manager"} <= ids, ids
        chat = client.chat.completions.create(model=str(folder), messages=PROMPT, max_tokens=4)
        assert chat.model == str(folder) and chat.choices[0].message.content is not None
        assert client.completions.create(model=str(folder), prompt="The", max_tokens=3).choices[0].text is not None
        answer = client.chat.completions.create(model="mia", messages=PROMPT)
        assert answer.choices[0].message.content
        log = server.log_path.read_text()
        assert "created a zero-initialised adapter" in log, server.log_tail()
    finally:
        stop_server(server)
    init = [p for p in (data / "adapters" / "init").iterdir() if p.name.startswith("planner-")]
    assert len(init) == 1

    hub = tmp_path / "hub"
    hf_cache_with(hub, REPO_ID, folder)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "b").mkdir()
    server = start_server(tmp_path / "b", None, REPO_ID, *extra, "--max-logprobs", "5", data_dir=data)
    try:
        wait_ready_beside_next(server)
        snapshot = hub / "models--mia-test--tiny-qwen3" / "snapshots" / REVISION
        assert f"from {snapshot}" in server.log_path.read_text()
        log = server.log_path.read_text()  # the first start kept the Planner's adapter as its version 1
        assert "created a zero-initialised adapter" not in log and "adapter planner@v1 is live" in log, log
        assert [p.name for p in (data / "adapters" / "init").iterdir()] == [init[0].name]
        client = _openai(server, 120)
        assert REPO_ID in {m.id for m in client.models.list().data}
        assert client.chat.completions.create(model=REPO_ID, messages=PROMPT, max_tokens=2).model == REPO_ID
        client.chat.completions.create(model=REPO_ID, messages=PROMPT, max_tokens=2, logprobs=True, top_logprobs=5)
        with pytest.raises(openai.BadRequestError):  # vLLM's --max-logprobs 5 reached vLLM
            client.chat.completions.create(model=REPO_ID, messages=PROMPT, max_tokens=2, logprobs=True,
                                           top_logprobs=6)
        completions = [{"text": t, "reward": r} for t, r in (("Search the founding year first.", 1.0),
                                                              ("Ask.", 0.0), ("Compare dates.", 0.0))]
        update = server.admin_post("/adapters/planner/grpo", {"groups": [{"messages": PROMPT,
                                                                          "completions": completions}]})
        assert update.status_code == 200 and update.json()["is_published"], update.text
        learned = _openai(server, 300, server.admin_key).chat.completions.create(
            model="mia", messages=PROMPT, extra_body={"rollouts": 2, "learn": True, "ground_truth": ["1088"]})
        assert learned.choices[0].message.content
    finally:
        stop_server(server)


def test_model_given_twice_differently_is_refused() -> None:
    with pytest.raises(ConfigError, match="--model"):
        parse_args(["serve", "a", "--model", "b"])


def test_model_not_found_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["serve", "mia-test/absent", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "HF_HUB_OFFLINE=1 is set" in err[0], err


