"""Web search through a Serper-compatible API (``POST <url>`` with ``X-API-KEY``, JSON ``{"q", "num"}``).

Off unless both ``tools.serper_api_key`` and ``tools.serper_url`` are set: the engine never reaches
the network on its own, and no endpoint is baked into the code. A failed query tells the Executor (and
so the client's trace) the error's class and HTTP status only; its text, which names the URL, is logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from . import ToolUnavailable
from ..base.log_text import printable
from ..config.tools import ToolsConfig
from .corpus import Passage

OFF_MESSAGE = "web search is off: set tools.serper_api_key and tools.serper_url"

log = logging.getLogger(__name__)


class WebSearch:
    """Concurrent Serper queries over one pooled HTTP client."""

    def __init__(self, config: ToolsConfig, client: Any | None = None) -> None:
        self._config = config
        self._client = client
        """An ``httpx.AsyncClient`` (injected in tests); created on first use otherwise."""

    @property
    def is_enabled(self) -> bool:
        return self._config.is_web_enabled

    async def search(self, queries: Sequence[str], top_k: int | None = None) -> list[list[Passage]]:
        """Up to ``top_k`` (default ``web_top_k``) results per query as passages (title, snippet + link)."""
        if not self.is_enabled:
            raise ToolUnavailable(OFF_MESSAGE)
        k = top_k or self._config.web_top_k
        return list(await asyncio.gather(*(self._search_one(query, k) for query in queries)))

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _search_one(self, query: str, top_k: int) -> list[Passage]:
        client = self._http()
        headers = {"X-API-KEY": self._config.serper_api_key, "Content-Type": "application/json"}
        try:
            response = await client.post(self._config.serper_url, json={"q": query, "num": top_k}, headers=headers,
                                         timeout=self._config.web_timeout_s)
            response.raise_for_status()
            body = response.json()
        except Exception as err:  # network, HTTP status or JSON: one clear message for the Executor
            log.warning("web search at tools.serper_url failed: %s: %s", type(err).__name__, printable(str(err)))
            raise ToolUnavailable(f"web search failed for {query!r}: {short_reason(err)}") from None
        return organic_passages(body, top_k)

    def _http(self) -> Any:
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient()
        return self._client


def short_reason(err: Exception) -> str:
    """The error's class, with the HTTP status when the server answered one; never the error's text,
    which names the endpoint's URL."""
    status = getattr(getattr(err, "response", None), "status_code", None)
    return f"{type(err).__name__} (HTTP {status})" if isinstance(status, int) else type(err).__name__


def organic_passages(body: Any, top_k: int) -> list[Passage]:
    """Serper's ``organic`` results as passages; anything unexpected yields fewer, never an error."""
    items = body.get("organic", []) if isinstance(body, dict) else []
    passages = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        snippet = str(item.get("snippet") or "").strip()
        link = str(item.get("link") or "").strip()
        text = f"{snippet} ({link})" if link else snippet
        if text:
            passages.append(Passage(str(item.get("title") or "").strip(), text))
        if len(passages) == top_k:
            break
    return passages
