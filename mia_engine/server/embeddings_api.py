"""``POST /v1/embeddings``: the memory's sentence encoder (already loaded for retrieval) as OpenAI's embeddings
endpoint, under the model id ``embedding`` or the encoder's folder name.

Vectors are the encoder's own: L2-normalised mean-pooled sentence embeddings, one per input text, computed on
the encoder's thread (never on the event loop) and batched with the memory's own encodes. The encoder takes a
request's texts as jobs of ``memory.embedder.max_texts_per_job``, one after another, so the agent's retrieval
runs between them rather than after all 2,048 (``memory/embedder.py``); the reply is the jobs' rows in
order. ``dimensions``
is accepted only when it equals the encoder's (a sentence encoder cannot shorten its vectors faithfully).
The texts are bounded in number and in characters (``server.limits``) before any is read, and a request
holds a slot of the model ``embedding`` (``server.admission.max_concurrent_per_model``) while it encodes, so
concurrent requests wait in that queue rather than in the encoder's, which the memory's own encodes share.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import msgspec
import numpy as np
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from ..config import EMBEDDING_MODEL, ServerConfig
from ..memory.embedder import EncoderBusy
from .admission import Admission
from .body import read_json
from .errors import BadRequest, NotFound, TooManyRequests, Unavailable
from .limits import check_embedding_inputs
from .openapi import ApiRoute
from .responses import json_response

class SentenceEncoder(Protocol):
    """What the route needs of the memory's encoder (``memory.embedder.Embedder``)."""

    model_dir: Path

    @property
    def dim(self) -> int: ...

    @property
    def max_seq_tokens(self) -> int: ...

    async def encode_async(self, texts: Sequence[str]) -> np.ndarray: ...


EncoderSource = Callable[[], "SentenceEncoder | None"]
"""The loaded encoder, or None while it loads (or if it failed to)."""


class EmbeddingRequest(msgspec.Struct):
    model: str
    input: str | Annotated[list[str], Meta(min_length=1)]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    user: str | None = None


class Embedding(msgspec.Struct):
    index: int
    embedding: list[float] | str
    object: str = "embedding"


class EmbeddingUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(msgspec.Struct):
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
    object: str = "list"


def encoder_name(encoder: SentenceEncoder) -> str:
    """The encoder's folder name (its parent's when the folder is a wheel's ``model``)."""
    folder = encoder.model_dir
    return folder.parent.name if folder.name == "model" else folder.name


def embedding_routes(source: EncoderSource, config: ServerConfig, admission: Admission) -> list[BaseRoute]:
    handlers = EmbeddingHandlers(source, config, admission)
    return [ApiRoute("/v1/embeddings", handlers.embeddings, method="POST",
                     summary="Sentence embeddings from the memory's encoder (model `embedding`)", scope="chat",
                     request_type=EmbeddingRequest, response_type=EmbeddingList)]


class EmbeddingHandlers:
    def __init__(self, source: EncoderSource, config: ServerConfig, admission: Admission) -> None:
        self._source = source
        self._config = config
        self._admission = admission
        self._decoder = msgspec.json.Decoder(EmbeddingRequest)
        self._tokenizer: Any = None

    async def embeddings(self, request: Request) -> Response:
        body: EmbeddingRequest = await read_json(request, self._config.max_body_bytes, self._decoder)
        encoder = self._source()
        if encoder is None:
            if body.model == EMBEDDING_MODEL:
                raise Unavailable("the sentence encoder is not loaded (yet); retry shortly", code="encoder_not_ready")
            raise NotFound(f"The model `{body.model}` does not exist.", param="model", code="model_not_found")
        if body.model not in (EMBEDDING_MODEL, encoder_name(encoder)):
            raise NotFound(f"The model `{body.model}` does not exist (embeddings come from `{EMBEDDING_MODEL}`).",
                           param="model", code="model_not_found")
        if body.dimensions is not None and body.dimensions != encoder.dim:
            raise BadRequest(f"dimensions = {body.dimensions}: this encoder's vectors have {encoder.dim} and cannot "
                             "be shortened.", param="dimensions")
        texts = [body.input] if isinstance(body.input, str) else body.input
        check_embedding_inputs(texts, self._config.limits)
        async with self._admission.slot(f"model:{EMBEDDING_MODEL}", self._config.admission.max_concurrent_per_model,
                                  param="model", request=request):
            try:
                vectors = await encoder.encode_async(texts)  # (n, d) float32 on the encoder's thread, job by job
            except EncoderBusy as err:
                raise TooManyRequests(str(err), retry_after_s=self._config.admission.retry_after_s) from None
            num_tokens = await self._count_tokens(encoder, texts)
        data = [Embedding(i, _encoded(v, body.encoding_format)) for i, v in enumerate(vectors)]
        return json_response(EmbeddingList(data, body.model, EmbeddingUsage(num_tokens, num_tokens)))

    async def _count_tokens(self, encoder: SentenceEncoder, texts: list[str]) -> int:
        """Word pieces the encoder read (each text truncated to its limit, special tokens included)."""
        loop = asyncio.get_running_loop()
        if self._tokenizer is None:
            from transformers import AutoTokenizer  # heavy; once, on the first request

            self._tokenizer = await loop.run_in_executor(
                None, lambda: AutoTokenizer.from_pretrained(str(encoder.model_dir), local_files_only=True))
        tokenizer, limit = self._tokenizer, encoder.max_seq_tokens
        counts = await loop.run_in_executor(
            None, lambda: tokenizer(texts, truncation=True, max_length=limit)["input_ids"])
        return sum(len(ids) for ids in counts)


def _encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """A float list, or base64 of the little-endian float32 bytes (what the ``openai`` client decodes)."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()
