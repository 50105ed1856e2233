"""``/v1/embeddings``: the memory's sentence encoder through the real ``openai`` client."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from openai import OpenAI

from mia_engine.config import load_config
from mia_engine.memory.embedder import Embedder
from tests.conftest import ServerHandle

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
