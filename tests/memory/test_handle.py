"""The server's ``MemoryHandle``: the routes are mounted before the store opens; until it is open they
answer 503 with the reason, then they reach the real service through the handle, which forwards nothing."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware

from mia_engine.config import ServerConfig
from mia_engine.config.memory import MemoryConfig
from mia_engine.memory.embedder import Embedder
from mia_engine.memory.entries import MemoryUnavailable
from mia_engine.memory.handle import MemoryHandle
from mia_engine.memory.service import MemoryService
from mia_engine.base.readiness import StartupHandle
from mia_engine.server.health_api import waiting_line
from mia_engine.server.memory_api import memory_routes
from mia_engine.server.security import SecurityMiddleware

from .factories import memory_config


def test_the_handle_opens_the_store_and_forwards_no_memory_operation() -> None:
    """Each memory operation is written once, on ``MemoryService``; the handle only opens, closes and
    hands out the open service."""
    public = {name for name in vars(MemoryHandle) if not name.startswith("_")}
    assert public == {"unavailable", "open", "close", "service"}
    assert "__getattr__" not in vars(MemoryHandle)


async def test_the_service_is_unavailable_until_the_store_opens(tmp_path: Path) -> None:
    handle = MemoryHandle(tmp_path, MemoryConfig())
    assert isinstance(handle, StartupHandle) and not handle.is_ready()
    assert handle.not_ready_reason() == "the memory store is opening; retry shortly"
    with pytest.raises(MemoryUnavailable, match="opening"):
        handle.service
    handle.fail("memory store failed to open: OSError: /secret/path")
    with pytest.raises(MemoryUnavailable, match="failed to open"):
        handle.service
    assert waiting_line("memory_not_ready", handle) == "memory is not ready"  # no progress, no reason


async def test_routes_over_the_handle_answer_503_until_the_store_opens_then_the_service(
        tmp_path: Path, embedder: Embedder) -> None:
    handle = MemoryHandle(tmp_path, memory_config())
    config = ServerConfig(admin_api_key="admin-key-of-this-test")  # memory writes are in the admin scope
    app = Starlette(routes=memory_routes(handle), middleware=[Middleware(SecurityMiddleware, config=config)])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1",
                                 headers={"Authorization": f"Bearer {config.admin_api_key}"}) as client:
        waiting = await client.get("/v1/memory/stats")
        assert waiting.status_code == 503 and waiting.json()["error"]["code"] == "memory_not_ready"
        assert "opening" in waiting.json()["error"]["message"]
        await handle.open(embedder)
        try:
            assert isinstance(handle.service, MemoryService) and handle.is_ready()
            added = await client.post("/v1/memory/add", json={"question": "Who painted The Night Watch?",
                                                              "workflow_summary": "1. **search** (painting → Rembrandt)",
                                                              "label": "correct"})
            assert added.status_code == 200, added.text
            stats = await client.get("/v1/memory/stats")
            assert stats.status_code == 200 and stats.json()["num_entries"] == 1
        finally:
            await handle.close()
        closed = await client.get("/v1/memory/stats")
        assert closed.status_code == 503 and closed.json()["error"]["code"] == "memory_not_ready"
