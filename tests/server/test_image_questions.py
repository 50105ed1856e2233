"""Image questions through the real server on the tiny vision-language model (real vLLM engine, real
image processor and vision tower), with the real ``openai`` client."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from openai import BadRequestError, OpenAI

from tests.conftest import SERVING_ONLY, ServerHandle, _openai, server_fixture, start_server
from tests.server.test_image_inputs import data_url, encoded, png_header_only

CONFIG = str(Path(__file__).parents[2] / "configs" / "tiny_vl.toml")  # this checkout's
DATA_ID = "img-q1"
SIMILAR_TITLE = "Eiffel Tower at night"


def _launch_vl_server(tmp_path_factory: pytest.TempPathFactory) -> ServerHandle:
    tmp = tmp_path_factory.mktemp("vl_server")
    cache = tmp / "image_cache" / DATA_ID
    cache.mkdir(parents=True)
    (cache / "similar.png").write_bytes(encoded(colour=(30, 30, 30)))
    (cache / "meta.json").write_text(json.dumps([{"path": "similar.png", "caption": SIMILAR_TITLE}]))
    (tmp / "images").mkdir()
    os.mkfifo(tmp / "images" / "pipe.png")
    return start_server(tmp, CONFIG, f"--tools.image_cache_dir={tmp / 'image_cache'}",
                        "--agent.first_image_search=true", "--server.images.allow_remote=true",
                        f"--server.images.file_root={tmp / 'images'}", *SERVING_ONLY)


vl_server = server_fixture("vl_server", _launch_vl_server)


def _metric(server: ServerHandle, prefix: str) -> float:
    for line in httpx.get(f"{server.base_url}/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    return 0.0


def _admin(server: ServerHandle) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.admin_key}"}


def image_question(text: str, url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]}]


def test_an_image_question_is_captioned_searched_by_image_and_remembered_with_its_caption(vl_server) -> None:
    admin = _openai(vl_server, 300, vl_server.admin_key)
    images_before = _metric(vl_server, 'mia_role_images_total{role="executor"}')
    messages = image_question("Which tower is this?", data_url(encoded(size=(90, 70))))
    out = admin.chat.completions.create(model="mia", messages=messages, extra_body={
        "data_id": DATA_ID, "learn": True, "ground_truth": ["Eiffel Tower"], "return_trace": True})
    trace = out.model_extra["mia"]
    caption = trace["caption"]
    assert isinstance(caption, str) and caption.strip()
    image_calls = [c for r in trace["rollouts"] for c in r["tool_calls"] if c["name"] == "web_image_to_image_search"]
    assert image_calls and all(c["is_success"] and SIMILAR_TITLE in c["result"] for c in image_calls)
    # the image itself went to the engine with the Executor's and the captioner's requests
    assert _metric(vl_server, 'mia_role_images_total{role="executor"}') > images_before
    assert _metric(vl_server, 'mia_role_images_total{role="manager"}') >= 1
    assert trace["new_memory_ids"], "a judged image question leaves a workflow memory"
    for memory_id in trace["new_memory_ids"]:
        stored = httpx.get(f"{vl_server.openai_url}/memory/{memory_id}", headers=_admin(vl_server)).json()
        assert stored["modality"] == "text_image" and stored["caption"] == caption
    again = admin.chat.completions.create(model="mia", messages=messages, extra_body={"data_id": DATA_ID})
    assert set(trace["new_memory_ids"]) & set(again.model_extra["mia"]["memory_ids_used"])  # text_image bucket


def test_a_vision_role_reads_the_image_itself(vl_server) -> None:
    client = _openai(vl_server, 120)

    def answer(colour: tuple[int, int, int]) -> str:
        out = client.chat.completions.create(model="manager", max_tokens=12, temperature=0.0, messages=image_question(
            "Describe the image.", data_url(encoded(size=(64, 64), colour=colour))))
        return out.choices[0].message.content

    assert answer((250, 10, 10)) != answer((10, 10, 250))  # different pixels, different completions


@pytest.mark.parametrize("url, words", [
    (data_url(b"\x89PNG\r\n\x1a\nnot really"), "not an image"),
    (data_url(png_header_only(100_000, 100_000)), "pixels"),
    (data_url(b"plain text"), "not an image"),
    (data_url(encoded("JPEG"), "image/png"), "bytes are JPEG"),
    ("https://example.com/tower.png", "The image could not be fetched."),  # no network or a 404: one message
    ("http://127.0.0.1:1/tower.png", "The image could not be fetched."),  # loopback: refused before connecting
    ("http://169.254.169.254/latest/meta-data/", "The image could not be fetched."),
    ("file:///x%00.png", "NUL"),
    ("pipe.png", "not a regular file"),  # a FIFO under file_root: refused, not waited on
])
def test_bad_images_are_a_400_store_nothing_and_leave_the_server_healthy(vl_server, url: str, words: str) -> None:
    admin = _openai(vl_server, 120, vl_server.admin_key)
    stats = f"{vl_server.openai_url}/memory/stats"
    before = httpx.get(stats, headers=_admin(vl_server)).json()["num_entries"]
    with pytest.raises(BadRequestError) as info:
        admin.chat.completions.create(model="mia", messages=image_question("Which tower?", url),
                                      extra_body={"learn": True, "ground_truth": ["x"]})
    error = info.value.body
    assert words in error["message"] and error["param"] == "messages[0].content[1].image_url"
    assert httpx.get(stats, headers=_admin(vl_server)).json()["num_entries"] == before
    assert httpx.get(f"{vl_server.base_url}/health").status_code == 200


def test_a_text_only_configuration_refuses_image_questions_clearly(openai_client: OpenAI) -> None:
    messages = image_question("Which tower?", data_url(encoded()))
    with pytest.raises(BadRequestError) as info:
        openai_client.chat.completions.create(model="mia", messages=messages)
    assert info.value.body["code"] == "images_not_supported" and "text-only" in info.value.body["message"]
    with pytest.raises(BadRequestError) as info:
        openai_client.chat.completions.create(model="manager", messages=messages)
    assert "does not take images" in info.value.body["message"]
    assert info.value.body["param"] == "messages[0].content[1].image_url"
