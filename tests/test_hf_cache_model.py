"""An engine whose ``model`` is a Hugging Face id, resolved offline from the local Hugging Face cache."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mia_engine.models.embedded import embedded_root, model_dir
from tests.conftest import ServerHandle, _openai, server_fixture, start_server

REPO_ID = "mia-test/tiny-qwen3"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def hf_cache_with(hub: Path, repo_id: str, folder: Path) -> Path:
    """``folder`` placed in a Hugging Face cache at ``hub`` as huggingface_hub lays a download out:
    ``models--org--name/snapshots/<commit>/`` plus ``refs/main`` naming the commit."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    shutil.copytree(folder, repo / "snapshots" / REVISION)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return repo / "snapshots" / REVISION


def test_an_id_resolves_from_the_cache_and_a_missing_one_says_how_to_get_it(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    built = embedded_root("embedded:tiny", tmp_path / "home")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = hf_cache_with(tmp_path / "hub", REPO_ID, built / "base")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # read at its import
    assert model_dir(REPO_ID, tmp_path / "home") == snapshot
    with pytest.raises(FileNotFoundError, match=r"run `hf download mia-test/absent` first$"):
        model_dir("mia-test/absent", tmp_path / "home")


def _launch_hf_server(tmp_path_factory: pytest.TempPathFactory) -> ServerHandle:
    """The tiny config with its engine's model given as a Hugging Face id (the adapters as folders), and
    a vLLM engine argument in vLLM's spelling, served with the Hub offline."""
    tmp = tmp_path_factory.mktemp("hf_server")
    built = embedded_root("embedded:tiny", tmp / "build")
    hf_cache_with(tmp / "hub", REPO_ID, built / "base")
    toml = (Path(__file__).parents[1] / "configs" / "tiny.toml").read_text()
    toml = toml.replace('model = "embedded:tiny"', f'model = "{REPO_ID}"\nmax_logprobs = 5')
    for role in ("planner", "executor"):
        toml = toml.replace(f'adapter = "embedded:{role}"', f'adapter = "{built / "adapters" / role}"')
    config = tmp / "hf.toml"
    config.write_text(toml)
    with pytest.MonkeyPatch.context() as patch:  # the server inherits the environment at its start
        patch.setenv("HF_HUB_CACHE", str(tmp / "hub"))
        patch.setenv("HF_HUB_OFFLINE", "1")
        return start_server(tmp, str(config))


hf_server = server_fixture("hf_server", _launch_hf_server)


def test_a_server_on_a_cached_hf_id_answers_the_openai_client(hf_server: ServerHandle) -> None:
    client = _openai(hf_server, 120)
    answer = client.chat.completions.create(model="manager", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4, temperature=0.0)
    assert answer.choices[0].finish_reason in ("stop", "length")
    snapshot = hf_server.home.parent / "hub" / "models--mia-test--tiny-qwen3" / "snapshots" / REVISION
    assert f"starting engine tiny from {snapshot}" in hf_server.log_path.read_text()


def test_the_engine_argument_reached_vllm(hf_server: ServerHandle) -> None:
    """``max_logprobs = 5`` in the engine table: vLLM refuses more logprobs than that."""
    import openai

    client = _openai(hf_server, 120)
    client.chat.completions.create(model="manager", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                   logprobs=True, top_logprobs=5)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="manager", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=2, logprobs=True, top_logprobs=6)
