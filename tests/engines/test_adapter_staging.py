"""A folder a request names is checked and loaded as a private copy (``engines/adapter_staging.py``): a swap of
its weights after the check changes nothing the engine reads; a link or a special file in it is refused,
naming the file; a copy goes once its version leaves the engine, a dead run's at the next start."""

from __future__ import annotations

import asyncio
import fcntl
import os
import stat
from pathlib import Path

import pytest

from mia_engine.engines.adapter_staging import STAGING_DIR, AdapterFileRefused, AdapterStaging
from mia_engine.engines.adapters import AdapterNotFound, AdapterRegistry
from mia_engine.models.lora import write_lora_adapter
from mia_engine.models.tiny import LORA_TARGETS, VOCAB_SIZE, _model_config

WEIGHTS = "adapter_model.safetensors"


def _adapter(folder: Path, seed: int) -> Path:
    write_lora_adapter(folder, _model_config(VOCAB_SIZE, 0, 1), rank=8, alpha=16, target_modules=LORA_TARGETS,
                       seed=seed, b_std=0.08, base_model_name="mia-tiny")
    return folder


class _SwappingHost:
    """An engine that reads the folder it is handed only after someone swapped the named folder's weights:
    what vLLM's worker does when it loads (or reloads an evicted) adapter by path, later than the check."""

    max_lora_rank = 8

    def __init__(self, named: Path, swap_with: bytes) -> None:
        self.named, self.swap_with = named, swap_with
        self.read: dict[str, bytes] = {}
        self.removed: list[int] = []

    async def add_lora(self, request) -> bool:
        (self.named / WEIGHTS).write_bytes(self.swap_with)  # after the check, before the engine reads
        self.read[request.lora_path] = (Path(request.lora_path) / WEIGHTS).read_bytes()
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        self.removed.append(lora_id)
        return True

    async def loaded_loras(self) -> list[set[int]]:
        return [set()]


async def test_the_engine_reads_the_checked_copy_whatever_happens_to_the_folder(tmp_path: Path) -> None:
    named = _adapter(tmp_path / "uploads" / "a", seed=1)
    checked = (named / WEIGHTS).read_bytes()
    other = (_adapter(tmp_path / "other", seed=2) / WEIGHTS).read_bytes()
    registry, host = AdapterRegistry(), _SwappingHost(named, other)
    registry.staging = AdapterStaging(tmp_path / "data" / STAGING_DIR)
    version = await registry.register("planner", host, named, stage=True)
    (loaded, read), = host.read.items()
    assert read == checked != other
    assert Path(loaded) == version.path and version.path.parent == registry.staging.run_dir
    assert version.source == named.resolve() and version.origin == named.resolve()
    assert stat.S_IMODE(os.stat(registry.staging.run_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(version.path / WEIGHTS).st_mode) == 0o600
    assert sorted(os.listdir(version.path)) == ["adapter_config.json", WEIGHTS]
    await registry.unregister("planner")
    for _ in range(100):  # removal runs as a task once the version is drained
        if not version.path.exists():
            break
        await asyncio.sleep(0.01)
    assert host.removed == [version.lora_id] and not version.path.exists()
    registry.staging.close()


@pytest.mark.parametrize("kind", ["weights link", "other link", "fifo"])
async def test_a_link_or_special_file_in_the_folder_is_refused_naming_it(tmp_path: Path, kind: str) -> None:
    named = _adapter(tmp_path / "uploads" / "a", seed=1)
    elsewhere = _adapter(tmp_path / "elsewhere", seed=2)
    if kind == "weights link":
        (named / WEIGHTS).unlink()
        (named / WEIGHTS).symlink_to(elsewhere / WEIGHTS)
        culprit = WEIGHTS
    elif kind == "other link":
        (named / "README.md").symlink_to("/etc/hostname")
        culprit = "README.md"
    else:
        os.mkfifo(named / "tokenizer.json")
        culprit = "tokenizer.json"
    registry, host = AdapterRegistry(), _SwappingHost(named, b"")
    registry.staging = AdapterStaging(tmp_path / "data" / STAGING_DIR)
    with pytest.raises(AdapterFileRefused, match=f"{named / culprit} is "):
        await registry.register("planner", host, named, stage=True)
    assert host.read == {} and registry.current("planner") is None
    assert os.listdir(registry.staging.run_dir) == []  # nothing copied stays behind


async def test_a_missing_folder_is_not_an_adapter(tmp_path: Path) -> None:
    registry = AdapterRegistry()
    registry.staging = AdapterStaging(tmp_path / STAGING_DIR)
    with pytest.raises(AdapterNotFound, match="not a PEFT adapter"):
        await registry.register("planner", _SwappingHost(tmp_path, b""), tmp_path / "missing", stage=True)
    link = tmp_path / "link"
    link.symlink_to(_adapter(tmp_path / "real", seed=3))
    with pytest.raises(AdapterFileRefused, match="turned into a symbolic link"):  # a link where the path had none
        registry.staging.stage(link)


def test_a_dead_runs_copies_go_at_the_next_start_a_live_ones_stay(tmp_path: Path) -> None:
    root = tmp_path / STAGING_DIR
    live = AdapterStaging(root)
    live_copy = live.stage(_adapter(tmp_path / "a", seed=1))
    dead = root / "run-dead"
    (dead / "adapter-x").mkdir(parents=True)
    fd = os.open(dead, os.O_RDONLY | os.O_DIRECTORY)  # a run dies holding its lock: the lock goes with it
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.close(fd)
    second = AdapterStaging(root)
    assert not dead.exists() and live_copy.is_dir()
    assert sorted(p.name for p in root.iterdir()) == sorted([live.run_dir.name, second.run_dir.name])
    live.close()
    second.close()
    second.close()  # once only
    assert list(root.iterdir()) == []
