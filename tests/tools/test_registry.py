"""The tool registry: dispatch, argument checks, per-trajectory limits, off tools, and web search over HTTP."""

from __future__ import annotations

import json

import httpx
import msgspec
import pytest

from mia_engine.agent.turns import parse_executor_turn
from mia_engine.tools import ToolUnavailable
from mia_engine.tools.calls import ToolCall
from mia_engine.config.tools import ToolsConfig
from mia_engine.tools.image import ImageSearch
from mia_engine.tools.registry import ToolContext, Tools
from mia_engine.tools.search import LocalSearch
from mia_engine.tools.web import OFF_MESSAGE, WebSearch

CONFIG = ToolsConfig()


@pytest.fixture()
def tools(index_dir, counting):
    local = LocalSearch(index_dir, counting, batch_wait_ms=1.0)
    yield Tools(CONFIG, local=local)
    local.close()


async def test_search_call_from_a_parsed_turn(tools, wiki_slice):
    title = wiki_slice.passages[5].title
    turn = parse_executor_turn('<think>t</think><tool_call>{"name": "search", "arguments": {"query_list": ["%s"]}}'
                               "</tool_call>" % title)
    observation = await tools.call(turn.tool_call, ToolContext("q1"), max_words=512)
    assert observation.is_success and observation.tool == "search"
    assert observation.text.startswith("Doc 1(Title: ") and f"(Title: {title})" in observation.text
    assert observation.text.count("Doc ") == 3


@pytest.mark.parametrize("call, message", [
    (ToolCall("python", {"code": "1"}), "unknown tool 'python'"),
    (ToolCall("search", {}), '"query_list"'),
    (ToolCall("search", {"query": "x"}), '"query_list"'),
    (ToolCall("search", {"query_list": [1, 2]}), "list of strings"),
    (ToolCall("search", {"query_list": ["", "  "]}), "no non-empty query"),
    (ToolCall("search", {"query_list": ["q"] * 9}), "at most 8"),
    (ToolCall("search", {"query_list": ["q"], "top_k": 50}), "exactly one argument"),
    (ToolCall("web_image_to_image_search", {"img_idx": "3"}), '"img_idx"'),
    (ToolCall("web_image_to_image_search", {"img_idx": "0"}), "image search is off"),
])
async def test_bad_calls_are_unsuccessful_observations(tools, call, message):
    observation = await tools.call(call, ToolContext("q1"), max_words=100)
    assert not observation.is_success and message in observation.text


async def test_a_lone_query_string_is_accepted(tools, wiki_slice):
    observation = await tools.call(ToolCall("search", {"query_list": wiki_slice.passages[0].title}), ToolContext(),
                                   max_words=50)
    assert observation.is_success


async def test_tools_that_are_not_loaded_say_so():
    bare = Tools(CONFIG)
    local_off = await bare.call(ToolCall("search", {"query_list": ["x"]}), ToolContext(), max_words=10)
    assert not local_off.is_success and "local search is off" in local_off.text
    web_tools = Tools(msgspec.structs.replace(CONFIG, search_backend="web"), web=WebSearch(CONFIG))
    web_off = await web_tools.call(ToolCall("search", {"query_list": ["x"]}), ToolContext(), max_words=10)
    assert not web_off.is_success and OFF_MESSAGE in web_off.text


async def test_web_search_is_off_without_key_and_url():
    with pytest.raises(ToolUnavailable, match="set tools.serper_api_key and tools.serper_url"):
        await WebSearch(CONFIG).search(["x"])
    with pytest.raises(ToolUnavailable):
        await WebSearch(msgspec.structs.replace(CONFIG, serper_api_key="k")).search(["x"])


async def test_web_search_over_http():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.headers["X-API-KEY"], json.loads(request.content)))
        if json.loads(request.content)["q"] == "fail":
            return httpx.Response(500)
        return httpx.Response(200, json={"organic": [
            {"title": "Lima", "snippet": "Capital of Peru.", "link": "https://a.invalid/lima"},
            {"title": "no snippet"}, "junk", {"title": "Peru", "snippet": "A country."}]})

    config = msgspec.structs.replace(CONFIG, serper_api_key="key", serper_url="https://search.invalid/search",
                                     search_backend="web")
    web = WebSearch(config, client=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    results = await web.search(["capital of peru"], top_k=5)
    assert seen == [("key", {"q": "capital of peru", "num": 5})]
    assert [(p.title, p.text) for p in results[0]] == [("Lima", "Capital of Peru. (https://a.invalid/lima)"),
                                                        ("Peru", "A country.")]
    tools = Tools(config, web=web)
    observation = await tools.call(ToolCall("search", {"query_list": ["a", "fail"]}), ToolContext(), max_words=100)
    assert not observation.is_success and "web search failed for 'fail'" in observation.text
    await web.aclose()


async def test_image_search_from_cache_once_per_trajectory(tmp_path):
    folder = tmp_path / "q7"
    folder.mkdir()
    for name in ("1.jpg", "2.png", "3.jpg", "4.jpg"):
        (folder / name).write_bytes(b"\xff")
    (folder / "meta.json").write_text(json.dumps([
        {"image": "1.jpg", "title": "Golden Gate Bridge"}, {"path": "2.png", "caption": "A red bridge"},
        "3.jpg", {"image": "../escape.jpg", "title": "outside"}, {"image": "4.jpg"}]))
    config = msgspec.structs.replace(CONFIG, image_cache_dir=str(tmp_path))
    tools = Tools(config, image=ImageSearch(str(tmp_path)))
    context = ToolContext("q7")
    first = await tools.call(ToolCall("web_image_to_image_search", {"img_idx": "0"}), context, max_words=100)
    assert first.is_success and first.images == [str(folder / "1.jpg"), str(folder / "2.png"), str(folder / "3.jpg")]
    assert "Image 1(Title: Golden Gate Bridge)" in first.text and "Image 3(Title: untitled)" in first.text
    again = await tools.call(ToolCall("web_image_to_image_search", {"img_idx": 0}), context, max_words=100)
    assert not again.is_success and "only 1 time" in again.text
    missing = await tools.call(ToolCall("web_image_to_image_search", {"img_idx": "0"}), ToolContext("nope"),
                               max_words=100)
    assert not missing.is_success and "no cached results for question id 'nope'" in missing.text


async def test_image_cache_without_meta_lists_the_images(tmp_path):
    (tmp_path / "q1").mkdir()
    (tmp_path / "q1" / "b.png").write_bytes(b"x")
    (tmp_path / "q1" / "a.jpg").write_bytes(b"x")
    hits = await ImageSearch(str(tmp_path)).search("q1")
    assert [h.path for h in hits] == [str(tmp_path / "q1" / "a.jpg"), str(tmp_path / "q1" / "b.png")]
    with pytest.raises(ToolUnavailable, match="image_cache_dir"):
        await ImageSearch("").search("q1")


def test_schemas_are_qwen_function_entries():
    tools = Tools(CONFIG)
    (search,) = tools.schemas()
    assert search["type"] == "function" and search["function"]["name"] == "search"
    assert search["function"]["parameters"]["required"] == ["query_list"]
    assert [s["function"]["name"] for s in tools.schemas(with_image=True)] == tools.names(with_image=True)
    json.dumps(tools.schemas(with_image=True))


async def test_a_failing_web_search_shows_the_error_class_and_status_not_the_url(caplog):
    """Observations reach clients (traces, streamed progress) and memory: the endpoint's URL stays in the log."""
    url = "https://search.invalid/private-endpoint/search"
    config = msgspec.structs.replace(CONFIG, serper_api_key="key", serper_url=url, search_backend="web")
    web = WebSearch(config, client=httpx.AsyncClient(transport=httpx.MockTransport(lambda _: httpx.Response(503))))
    with caplog.at_level("WARNING", logger="mia_engine.tools.web"):
        observation = await Tools(config, web=web).call(ToolCall("search", {"query_list": ["q"]}), ToolContext(),
                                                        max_words=100)
    await web.aclose()
    assert observation.text == "Error: web search failed for 'q': HTTPStatusError (HTTP 503)"
    assert url in caplog.text


class _BrokenSearch:
    """A search whose backend fails with an error naming a server path (what a real OSError would say)."""

    async def search(self, queries, top_k):
        raise FileNotFoundError(2, "No such file or directory", "/srv/private/index/passages.faiss")


async def test_a_failing_tool_shows_its_name_and_error_class_not_the_error_text(caplog):
    with caplog.at_level("WARNING", logger="mia_engine.tools.registry"):
        observation = await Tools(CONFIG, local=_BrokenSearch()).call(ToolCall("search", {"query_list": ["q"]}),
                                                                      ToolContext(), max_words=100)
    assert not observation.is_success and "/srv/private" not in observation.text
    assert observation.text.startswith("Error: tool 'search' failed (FileNotFoundError)")
    assert "/srv/private/index/passages.faiss" in caplog.text
