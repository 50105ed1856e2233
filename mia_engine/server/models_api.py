"""``GET /v1/models`` and ``GET /v1/models/{model}``: the roles the engines serve (with their adapter
version), the research agent's model ``mia`` when the server has the agent, and the sentence encoder
``embedding`` (``/v1/embeddings``) once it is loaded."""

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


def model_routes(client: EngineClient, *, has_agent: bool, encoder: EncoderSource | None = None) -> list[BaseRoute]:
    """Every model answers with the time these routes were built as its ``created``; the sentence encoder
    (``embedding``) is listed once it is loaded."""
    handlers = ModelHandlers(client, has_agent=has_agent, created=int(time.time()), encoder=encoder)
    return [
        ApiRoute("/v1/models", handlers.list_models, method="GET", summary="List the model ids served",
                 response_type=ModelList),
        ApiRoute("/v1/models/{model:path}", handlers.get_model, method="GET", summary="One model id",
                 response_type=ModelObject),
    ]


class ModelHandlers:
    def __init__(self, client: EngineClient, *, has_agent: bool, created: int,
                 encoder: EncoderSource | None = None) -> None:
        self._client = client
        self._encoder = encoder
        self._has_agent = has_agent
        self._created = created

    async def list_models(self, request: Request) -> Response:
        return json_response(ModelList([self._object(card) for card in self._cards()]))

    async def get_model(self, request: Request) -> Response:
        model_id = request.path_params["model"]
        for card in self._cards():
            if card.id == model_id:
                return json_response(self._object(card))
        raise NotFound(f"The model `{model_id}` does not exist.", param="model", code="model_not_found")

    def _cards(self) -> list[ModelCard]:
        """Asked of the engines on every request: an adapter version changes while the server runs."""
        agent_card = [ModelCard(AGENT_MODEL, "agent", AGENT_MODEL)] if self._has_agent else []
        loaded = self._encoder() if self._encoder is not None else None
        encoder_card = [ModelCard(EMBEDDING_MODEL, "embedding", str(loaded.model_dir))] if loaded is not None else []
        return [*self._client.models(), *agent_card, *encoder_card]

    def _object(self, card: ModelCard) -> ModelObject:
        return ModelObject(card.id, card.owned_by, card.root, self._created, card.adapter_version)
