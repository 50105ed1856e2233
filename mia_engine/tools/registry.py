"""Dispatch of the Executor's parsed tool calls, with argument checks, per-trajectory limits and
the Qwen-style tool schemas for its prompt.

A bad call (unknown tool, wrong arguments, a tool that is off) is part of a trajectory, not an
error of the engine: it becomes an unsuccessful ``Observation`` whose text tells the Executor what
was wrong, and the Executor's offline reward counts it against the call. A tool that fails says only
its name and the error's class: observations reach clients (traces, streamed progress) and memory, so
the error's own text, which may name server paths or URLs, goes to the server log alone, in one line
escaped and bounded (it may quote the model's arguments).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from typing import Any

from . import ToolUnavailable
from ..base.log_text import MAX_LOGGED_NAME_CHARS, printable
from .calls import Observation, ToolCall, truncate_words
from ..config.tools import ToolsConfig
from .image import ImageSearch, render_hits
from .search import LocalSearch, render_results
from .web import OFF_MESSAGE, WebSearch

SEARCH, IMAGE_SEARCH = "search", "web_image_to_image_search"

log = logging.getLogger(__name__)


class ToolContext:
    """Per-trajectory state: the question's id (for the image cache) and the image searches made so far."""

    def __init__(self, data_id: str = "", image: Any = None) -> None:
        self.data_id = data_id
        self.image = image
        """The question's image (a decoded ``PIL.Image``), the query of a local image index."""
        self.num_image_searches = 0


class Tools:
    """The tools one Executor sees; shared by all trajectories (their state lives in ``ToolContext``)."""

    def __init__(self, config: ToolsConfig, *, local: LocalSearch | None = None, web: WebSearch | None = None,
                 image: ImageSearch | None = None) -> None:
        self._config = config
        self._local, self._web, self._image = local, web, image

    def names(self, *, with_image: bool = False) -> list[str]:
        """Tools offered: ``search`` always (it explains itself when off), image search for image questions."""
        return [SEARCH, IMAGE_SEARCH] if with_image else [SEARCH]

    def schemas(self, *, with_image: bool = False) -> list[dict[str, Any]]:
        """Qwen ``<tools>`` entries (``{"type": "function", "function": {...}}``), one per tool."""
        where = "the web" if self._config.search_backend == "web" else "a local knowledge corpus"
        search = _function(SEARCH, f"Searches {where} for relevant information based on the given queries.", {
            "query_list": {"type": "array", "items": {"type": "string"},
                           "description": "A list of complete textual queries; each must state its topic."}})
        image = _function(IMAGE_SEARCH, "**IMPORTANT: This tool can only be called once.** Searches for images "
                          "similar to the question's image.", {
                              "img_idx": {"type": "string", "description": "Always '0'."}})
        return [search, image] if with_image else [search]

    async def call(self, call: ToolCall, context: ToolContext, *, max_words: int) -> Observation:
        """Run one call; never raises for a bad call or an unavailable tool (only on cancellation)."""
        try:
            if call.name == SEARCH:
                return await self._search(call.arguments, max_words)
            if call.name == IMAGE_SEARCH:
                return await self._image_search(call.arguments, context, max_words)
            return _failed(call.name, f"Error: unknown tool {call.name!r}; available tools: {SEARCH}, {IMAGE_SEARCH}.")
        except asyncio.CancelledError:
            raise
        except ToolUnavailable as err:
            return _failed(call.name, f"Error: {err}")
        except Exception as err:  # noqa: BLE001 - a tool bug must not end the rollout
            _log_failure(call.name, err)
            return _failed(call.name, f"Error: tool {call.name!r} failed ({type(err).__name__}); "
                                      "the details are in the server log.")

    async def _search(self, arguments: dict[str, Any], max_words: int) -> Observation:
        queries, error = query_list(arguments, self._config.max_queries_per_call)
        if error:
            return _failed(SEARCH, f"Error: {error}")
        if self._config.search_backend == "web":
            if self._web is None:
                raise ToolUnavailable(OFF_MESSAGE)
            results = await self._web.search(queries, self._config.web_top_k)
        else:
            if self._local is None:
                raise ToolUnavailable("local search is off: no index is loaded (tools.corpus)")
            results = await self._local.search(queries, self._config.search_top_k)
        return Observation(render_results(queries, results, max_words), True, SEARCH)

    async def _image_search(self, arguments: dict[str, Any], context: ToolContext, max_words: int) -> Observation:
        if set(arguments) - {"img_idx"} or str(arguments.get("img_idx", "0")).strip() != "0":
            return _failed(IMAGE_SEARCH, 'Error: the only argument is "img_idx", and it must be "0".')
        if context.num_image_searches >= self._config.max_image_searches:
            return _failed(IMAGE_SEARCH, f"Error: {IMAGE_SEARCH} may be called only "
                                         f"{self._config.max_image_searches} time(s) per question.")
        if self._image is None:
            raise ToolUnavailable("image search is off: build a local image index (python -m mia_engine index "
                                  "--images DIR) or set tools.image_cache_dir")
        context.num_image_searches += 1
        hits = await self._image.search(context.data_id, self._config.image_top_k, context.image)
        text = truncate_words(render_hits(hits), max_words)
        return Observation(text, bool(hits), IMAGE_SEARCH, [hit.path for hit in hits if hit.path])


def query_list(arguments: dict[str, Any], max_queries: int) -> tuple[list[str], str | None]:
    """The ``query_list`` argument as non-empty strings, or why it is malformed (a lone string is accepted)."""
    if set(arguments) != {"query_list"}:
        return [], f'search takes exactly one argument, "query_list" (got {sorted(arguments)})'
    value = arguments["query_list"]
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(q, str) for q in value):
        return [], '"query_list" must be a list of strings'
    queries = [q.strip() for q in value if q.strip()]
    if not queries:
        return [], '"query_list" holds no non-empty query'
    if len(queries) > max_queries:
        return [], f'"query_list" may hold at most {max_queries} queries (got {len(queries)})'
    return queries, None


def _function(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": list(properties)}}}


def _log_failure(tool: str, err: Exception) -> None:
    """One bounded line (the error's text, which may quote the model's arguments, escaped and cut; where it
    was raised); the traceback's frames, without that text, at debug level."""
    frames = traceback.extract_tb(err.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    log.warning("tool '%s' failed%s: %s: %s", printable(tool, MAX_LOGGED_NAME_CHARS), where, type(err).__name__,
                printable(str(err)))
    log.debug("tool '%s' failure, traceback:\n%s", printable(tool, MAX_LOGGED_NAME_CHARS),
              "".join(frames.format()).rstrip())


def _failed(tool: str, text: str) -> Observation:
    return Observation(text, False, tool)
