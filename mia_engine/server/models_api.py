"""``GET /v1/models`` and ``GET /v1/models/{model}``: the roles the engines serve (with their adapter
version), the research agent's model ``mia`` when the server has the agent, and the sentence encoder
``embedding`` (``/v1/embeddings``) once it is loaded.

Each card has vLLM's fields: ``root`` (a base model's Hugging Face id or folder; an adapter's folder, shown
to the admin scope only as ``/v1/adapters`` shows it, None to others), ``parent`` (the base model id a role
or adapter runs on) and ``max_model_len`` (its engine's; the Planner's for ``mia``)."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from ..config import AGENT_MODEL
from ..engines.client import EngineClient, ModelCard
from .embeddings_api import EMBEDDING_MODEL, EncoderSource
from .errors import NotFound
from .openai_bodies import ModelList, ModelObject
from .openapi import ApiRoute
from .responses import json_response
from .security import is_admin


def model_routes(client: EngineClient, *, has_agent: bool, encoder: EncoderSource | None = None,
                 planner: str = "") -> list[BaseRoute]:
    """Every model answers with the time these routes were built as its ``created``; the sentence encoder
    (``embedding``) is listed once it is loaded. ``planner``: the agent's Planner model id, whose context
    length the ``mia`` card shows."""
    handlers = ModelHandlers(client, has_agent=has_agent, created=int(time.time()), encoder=encoder,
                             planner=planner)
    return [
        ApiRoute("/v1/models", handlers.list_models, method="GET", summary="List the model ids served",
                 scope=("chat", "agent"), response_type=ModelList),
        ApiRoute("/v1/models/{model:path}", handlers.get_model, method="GET", summary="One model id",
                 scope=("chat", "agent"), response_type=ModelObject),
    ]


class ModelHandlers:
    def __init__(self, client: EngineClient, *, has_agent: bool, created: int,
                 encoder: EncoderSource | None = None, planner: str = "") -> None:
        self._client = client
        self._encoder = encoder
        self._has_agent = has_agent
        self._created = created
        self._planner = planner

    async def list_models(self, request: Request) -> Response:
        show_path = is_admin(request)
        return json_response(ModelList([self._object(card, show_path) for card in self._cards()]))

    async def get_model(self, request: Request) -> Response:
        model_id = request.path_params["model"]
        for card in self._cards():
            if card.id == model_id:
                return json_response(self._object(card, is_admin(request)))
        raise NotFound(f"The model `{model_id}` does not exist.", param="model", code="model_not_found")

    def _cards(self) -> list[ModelCard]:
        """Asked of the engines on every request: adapter versions, and ids loaded by name, change while the
        server runs."""
        agent_card = [ModelCard(AGENT_MODEL, "agent", AGENT_MODEL, max_model_len=self._planner_len())] \
            if self._has_agent else []
        loaded = self._encoder() if self._encoder is not None else None
        encoder_card = [ModelCard(EMBEDDING_MODEL, "embedding", str(loaded.model_dir))] if loaded is not None else []
        return [*self._client.models(), *agent_card, *encoder_card]

    def _planner_len(self) -> int | None:
        planner = self._client.find(self._planner) if self._planner else None
        return planner.max_model_len() if planner is not None else None

    def _object(self, card: ModelCard, show_path: bool) -> ModelObject:
        """``show_path``: an adapter's folder as its ``root`` (admin scope); else None there."""
        root = card.root if card.adapter_path is None else card.adapter_path if show_path else None
        return ModelObject(card.id, card.owned_by, root, self._created, card.adapter_version, card.parent,
                           card.max_model_len)
