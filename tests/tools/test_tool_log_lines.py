"""A failing tool logs one bounded line: the text of its error (which may quote the model's arguments, or a
remote answer) escaped and cut, never a megabyte or a forged record."""

from __future__ import annotations

import logging

import httpx
import msgspec
import pytest

from mia_engine.base.log_text import MAX_LOGGED_CHARS
from mia_engine.config.tools import ToolsConfig
from mia_engine.tools.calls import ToolCall
from mia_engine.tools.registry import ToolContext, Tools
from mia_engine.tools.web import WebSearch

HUGE = "first line\n2026-01-01 00:00:00 ERROR forged: record\n" + "x" * (1 << 20)
"""An error text with a line break that would start a forged record, and a megabyte after it."""
BOUND = MAX_LOGGED_CHARS + 200
"""Characters one record may take: the bounded error text and the line around it."""


class _QuotingSearch:
    """A search whose backend fails with an error quoting its (model-written) query."""

    async def search(self, queries, top_k):
        raise ValueError(f"cannot search {queries[0]}")


def _web_tools() -> tuple[Tools, WebSearch]:
    def fail(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(HUGE, request=request)

    config = msgspec.structs.replace(ToolsConfig(), serper_api_key="key", serper_url="https://search.invalid/s",
                                     search_backend="web")
    web = WebSearch(config, client=httpx.AsyncClient(transport=httpx.MockTransport(fail)))
    return Tools(config, web=web), web


@pytest.mark.parametrize("backend", ["local", "web"])
async def test_a_failing_tool_logs_one_bounded_line(caplog: pytest.LogCaptureFixture, backend: str) -> None:
    web = None
    if backend == "web":
        tools, web = _web_tools()
    else:
        tools = Tools(ToolsConfig(), local=_QuotingSearch())  # type: ignore[arg-type]
    with caplog.at_level(logging.DEBUG, logger="mia_engine.tools"):
        observation = await tools.call(ToolCall("search", {"query_list": [HUGE]}), ToolContext(), max_words=100)
    if web is not None:
        await web.aclose()
    assert not observation.is_success
    warnings = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(warnings) == 1, [record.getMessage()[:100] for record in warnings]
    line = warnings[0].getMessage()
    assert warnings[0].exc_info is None and "\n" not in line and len(line) < BOUND, (len(line), line[:300])
    assert "first line\\n2026-01-01" in line and "chars)" in line, line  # escaped, then cut with a count
    for record in caplog.records:  # the debug traceback too: frames, never the error's text
        text = record.getMessage() + (logging.Formatter().formatException(record.exc_info) if record.exc_info else "")
        assert "x" * 1000 not in text and not any(part.startswith("2026-01-01") for part in text.splitlines())
