"""``/v1/adapters/{role}/grpo`` and ``/v1/adapters/{role}/rollback``: test-time learning by hand.

``grpo`` runs one GRPO update of the role's adapter from externally scored completions (one group per
prompt; advantages within each group) and publishes it like an online update; ``rollback`` serves the
checkpoint before the latest good one. Both are behind ``--api-key`` like every /v1 route.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import msgspec
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..engines.adapters import AdapterError
from ..learner.ttl import TestTimeLearner, planner_samples
from .errors import BadRequest, Conflict, NotFound, Unavailable, decode_body


class ScoredCompletion(msgspec.Struct):
    text: str
    reward: float


class ScoredGroup(msgspec.Struct):
    messages: Annotated[list[dict[str, str]], Meta(min_length=1)]
    """The prompt, as chat messages (the role's chat template is applied)."""
    completions: Annotated[list[ScoredCompletion], Meta(min_length=2)]


class GRPORequest(msgspec.Struct):
    groups: Annotated[list[ScoredGroup], Meta(min_length=1)]


def learner_routes(learner: TestTimeLearner, client: Any) -> list[BaseRoute]:
    decoder = msgspec.json.Decoder(GRPORequest)

    def _check(role: str) -> None:
        if role != learner.role:
            raise NotFound(f"Role `{role}` does not learn (only `{learner.role}`).", param="role")
        if not learner.is_ready:
            raise Unavailable("the test-time learner is not loaded yet", code="learner_not_ready")

    async def grpo(request: Request) -> Response:
        role = request.path_params["role"]
        _check(role)
        body: GRPORequest = decode_body(await request.body(), decoder)
        samples = []
        for group in body.groups:
            for message in group.messages:
                if set(message) != {"role", "content"}:
                    raise BadRequest("each message needs exactly `role` and `content`", param="groups.messages")
            samples += await planner_samples(client, role, group.messages, [c.text for c in group.completions],
                                             [c.reward for c in group.completions], uuid.uuid4().hex)
        try:
            report = await learner.update(samples)
        except ValueError as err:
            raise BadRequest(f"invalid samples: {err}", param="groups") from None
        return Response(msgspec.json.encode(report), media_type="application/json")

    async def rollback(request: Request) -> Response:
        role = request.path_params["role"]
        _check(role)
        try:
            version = await learner.rollback()
        except AdapterError as err:
            raise Conflict(str(err)) from None
        return Response(msgspec.json.encode({"role": role, "version": version}), media_type="application/json")

    return [
        Route("/v1/adapters/{role}/grpo", grpo, methods=["POST"]),
        Route("/v1/adapters/{role}/rollback", rollback, methods=["POST"]),
    ]
