"""Engines started in this process by these tests leave vLLM objects behind (its ``zmq.asyncio``
sockets among them); collected later, during another test's event loop, they may unregister fd numbers
that loop has since given to new connections (bench/RESULTS.md section 6). Collect them here, at the
end of each module, before any later test opens sockets."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="module")
def _collect_engine_leftovers() -> Iterator[None]:
    yield
    gc.collect()
