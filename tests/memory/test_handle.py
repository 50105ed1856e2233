"""The server's ``MemoryHandle``: 503 until the store is open, then each declared method is the service's."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from mia_engine.memory.config import MemoryConfig
from mia_engine.memory.entries import MemoryUnavailable
from mia_engine.memory.handle import MemoryHandle
from mia_engine.memory.service import MemoryService
from mia_engine.readiness import StartupHandle
from mia_engine.server.health_api import waiting_line

DELEGATED = [name for name, member in vars(MemoryHandle).items()
             if not name.startswith("_") and name not in {"open", "close", "service"}
             and (inspect.iscoroutinefunction(member) or isinstance(member, property))]


def test_the_handle_declares_what_its_users_call_with_the_services_signatures() -> None:
    assert set(DELEGATED) == {"config", "add", "search", "get", "delete", "record_outcome", "consolidate_group",
                              "clear_after_update", "search_meta_plans", "export_records", "import_records", "import_jsonl",
                              "stats"}
    assert "__getattr__" not in vars(MemoryHandle)  # nothing else is forwarded
    for name in DELEGATED:
        if name != "config":
            assert inspect.signature(getattr(MemoryHandle, name)) == inspect.signature(getattr(MemoryService, name))


async def test_every_call_is_unavailable_until_the_store_opens(tmp_path: Path) -> None:
    handle = MemoryHandle(tmp_path, MemoryConfig())
    assert isinstance(handle, StartupHandle) and not handle.is_ready()
    assert handle.not_ready_reason() == "the memory store is opening; retry shortly"
    with pytest.raises(MemoryUnavailable, match="opening"):
        await handle.search("q")
    with pytest.raises(MemoryUnavailable, match="opening"):
        handle.config
    handle.fail("memory store failed to open: OSError: /secret/path")
    with pytest.raises(MemoryUnavailable, match="failed to open"):
        await handle.stats()
    assert waiting_line("memory_not_ready", handle) == "memory is not ready"  # no progress, no reason


class _Recorder:
    """Stands in for an open ``MemoryService``: each call returns its name and arguments."""

    config = MemoryConfig(seed=5)

    def __getattr__(self, name: str):
        async def call(*args, **kwargs):
            return name, args, kwargs
        return call


async def test_calls_are_delegated_once_open(tmp_path: Path) -> None:
    handle = MemoryHandle(tmp_path, MemoryConfig())
    handle._started(_Recorder())
    assert handle.is_ready() and handle.config.seed == 5
    assert await handle.search("q", category="c") == (
        "search", ("q",), {"caption": None, "category": "c", "modality": None, "num_positive": None,
                           "num_negative": None})
    assert await handle.consolidate_group("q", [], caption="x") == (
        "consolidate_group", ("q", []), {"caption": "x", "category": None, "modality": None})
    assert await handle.search_meta_plans("q", 2) == ("search_meta_plans", ("q", 2), {})
    assert await handle.record_outcome(["a"], True) == ("record_outcome", (["a"], True), {})
    assert await handle.clear_after_update() == ("clear_after_update", (), {})
    assert await handle.import_jsonl(b"x") == ("import_jsonl", (b"x",), {})
    assert await handle.delete("a") is None  # delete answers nothing, like the service's
