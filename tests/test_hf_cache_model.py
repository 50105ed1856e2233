"""An engine whose ``model`` is a Hugging Face id, resolved offline from the local Hugging Face cache (a server on
one: ``tests/test_serve_model.py``, ``serve REPO_ID``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mia_engine.models.embedded import embedded_root, model_dir

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
