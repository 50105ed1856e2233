"""``/v1/embeddings``: the memory's sentence encoder through the real ``openai`` client."""

from __future__ import annotations

import asyncio
import base64

import httpx
import numpy as np
import pytest
from openai import OpenAI

from mia_engine.config import LimitsConfig, load_config
from mia_engine.memory.embedder import Embedder
from tests.conftest import ServerHandle, scrape_metrics

TEXTS = ["The Nile flows north into the Mediterranean.", "Photosynthesis turns light into sugar."]


@pytest.fixture(scope="module")
def encoder() -> Embedder:
    """The tiny config's encoder, loaded here: the server's vectors must equal its own."""
    embedder = Embedder(load_config("tiny").memory.embedder)
    yield embedder
    embedder.close()


def _post(server: ServerHandle, body: dict) -> httpx.Response:
    return httpx.post(f"{server.openai_url}/embeddings", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {server.api_key}"})


def _vectors(server: ServerHandle, texts: list[str]) -> np.ndarray:
    """(n, d) the server's vectors for ``texts``, exactly as sent (base64 of float32)."""
    response = _post(server, {"model": "embedding", "input": texts, "encoding_format": "base64"})
    assert response.status_code == 200, response.text
    return np.stack([np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
                     for item in response.json()["data"]])


def test_embeddings_equal_the_encoder(openai_client: OpenAI, encoder: Embedder) -> None:
    out = openai_client.embeddings.create(model="embedding", input=TEXTS)  # the client asks for base64
    assert [d.index for d in out.data] == [0, 1]
    vectors = np.array([d.embedding for d in out.data], dtype=np.float32)
    assert vectors.shape == (2, encoder.dim)
    np.testing.assert_allclose(vectors, encoder.encode(TEXTS), atol=1e-4)
    assert out.usage.prompt_tokens == out.usage.total_tokens > 10


def test_float_format_and_string_input(tiny_server: ServerHandle, encoder: Embedder) -> None:
    response = _post(tiny_server, {"model": "embedding", "input": TEXTS[0], "encoding_format": "float"})
    assert response.status_code == 200, response.text
    (item,) = response.json()["data"]
    assert item["object"] == "embedding" and isinstance(item["embedding"], list)
    np.testing.assert_allclose(np.array(item["embedding"], dtype=np.float32), encoder.encode(TEXTS[:1])[0],
                               atol=1e-4)


def test_listed_in_models_and_dimensions_refused(openai_client: OpenAI, tiny_server: ServerHandle,
                                                 encoder: Embedder) -> None:
    assert "embedding" in {m.id for m in openai_client.models.list().data}
    same = _post(tiny_server, {"model": "embedding", "input": "x", "dimensions": encoder.dim})
    assert same.status_code == 200
    other = _post(tiny_server, {"model": "embedding", "input": "x", "dimensions": 8})
    assert other.status_code == 400 and other.json()["error"]["param"] == "dimensions"
    unknown = _post(tiny_server, {"model": "planner", "input": "x"})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"


def test_more_inputs_than_the_cap_are_refused_before_any_encoding(tiny_server: ServerHandle) -> None:
    """server.limits.max_embedding_inputs (2048, OpenAI's limit): a list of millions of one-character texts would
    hold the memory's shared encoder for minutes."""
    refused = _post(tiny_server, {"model": "embedding", "input": ["x"] * 2049})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input", refused.text
    assert "server.limits.max_embedding_inputs" in refused.json()["error"]["message"]
    assert refused.json()["error"]["code"] == "limit_exceeded"
    assert _post(tiny_server, {"model": "embedding", "input": ["x"] * 2048}).status_code == 200


def test_more_characters_than_the_cap_are_refused_before_any_encoding(tiny_server: ServerHandle) -> None:
    """server.limits.max_embedding_chars (1.2 million, OpenAI's 300,000 tokens a request): under the count cap,
    a few huge texts would hold the encoder's tokenizer for seconds (it reads each text whole)."""
    cap = LimitsConfig().max_embedding_chars
    texts = ["word " * (cap // 15)] * 3  # 3 x cap / 3 characters, and a few more
    refused = _post(tiny_server, {"model": "embedding", "input": texts + ["x" * 16]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input", refused.text
    assert "server.limits.max_embedding_chars" in refused.json()["error"]["message"]
    assert refused.json()["error"]["code"] == "limit_exceeded"


@pytest.mark.parametrize("inputs", [[1, 2, 3], [[1, 2], [3]], []])
def test_token_ids_and_empty_inputs_are_refused(tiny_server: ServerHandle, inputs: list) -> None:
    """OpenAI also takes token ids; the memory's encoder reads text only, so they are a 400 (never a 500)."""
    response = _post(tiny_server, {"model": "embedding", "input": inputs})
    assert response.status_code == 400 and response.json()["error"]["param"].startswith("input"), response.text


def test_a_request_holds_a_slot_of_the_encoder(tiny_server: ServerHandle) -> None:
    """Concurrent requests wait in the admission queue of model ``embedding`` (``max_concurrent_per_model``)
    rather than piling up in the encoder's, which the memory's retrieval shares."""

    def admitted() -> float:
        return next((s.value for s in scrape_metrics(tiny_server) if s.name == "mia_admission_wait_seconds_count"
                     and s.labels.get("key") == "model:embedding"), 0.0)

    before = admitted()
    assert _post(tiny_server, {"model": "embedding", "input": TEXTS}).status_code == 200
    assert admitted() == before + 1


def test_a_long_list_is_the_replies_of_its_jobs_in_order(tiny_server: ServerHandle) -> None:
    """The encoder takes a request's texts as jobs of ``memory.embedder.max_texts_per_job`` (the last one short):
    the reply is what each job's texts get alone, in the request's order."""
    size = load_config("tiny").memory.embedder.max_texts_per_job
    texts = [f"passage {i}: " + "the delta floods each spring " * (i % 5) for i in range(size + size // 3)]
    jobs = [_vectors(tiny_server, texts[start:start + size]) for start in range(0, len(texts), size)]
    whole = _vectors(tiny_server, texts)
    assert whole.shape == (len(texts), jobs[0].shape[1])
    # same rows in the same order; the last bits may differ where other texts shared a forward pass
    np.testing.assert_allclose(whole, np.concatenate(jobs), rtol=0, atol=1e-5)


async def test_a_retrieval_runs_between_the_jobs_of_a_long_list(encoder: Embedder) -> None:
    """A retrieval-sized encode (a question and its caption, as the memory's own) sent while a long list
    encodes finishes before the list does: it waits for one job of the list, not for all of it."""
    size = load_config("tiny").memory.embedder.max_texts_per_job
    finished: list[str] = []
    long_list = asyncio.ensure_future(encoder.encode_async([f"document {i}" for i in range(2 * size + 1)]))
    long_list.add_done_callback(lambda _: finished.append("long list"))
    await asyncio.sleep(0)  # its first job is queued; the next is queued when that one is done
    retrieval = asyncio.ensure_future(encoder.encode_async(["Which river floods each spring?", "a delta"]))
    retrieval.add_done_callback(lambda _: finished.append("retrieval"))
    vectors, _ = await asyncio.gather(retrieval, long_list)
    assert finished == ["retrieval", "long list"]
    assert vectors.shape == (2, encoder.dim)
