"""``/v1/adapters/{role}/grpo`` and ``/v1/adapters/{role}/rollback``: test-time learning by hand.

``grpo`` runs one GRPO update of the role's adapter from externally scored completions (one group per
prompt; advantages within each group) and publishes it like an online update; ``rollback`` serves the
checkpoint before the latest good one. Both need the admin key and an admin admission slot (the
learner runs in the serving process); a GRPO request is capped in groups, completions and tokens
(``ServerConfig.limits``) before any tokenizing or training starts.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from ..config import LimitsConfig, ServerConfig
from ..engines.adapters import AdapterError
from ..learner.ttl import TestTimeLearner, UpdateReport, planner_samples
from .admission import Admission
from .body import read_json
from .errors import BadRequest, Conflict, NotFound, Unavailable
from .openapi import ApiRoute


class ScoredCompletion(msgspec.Struct, forbid_unknown_fields=True):
    text: str
    reward: float


class PromptMessage(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["system", "user", "assistant"]
    content: str


class ScoredGroup(msgspec.Struct, forbid_unknown_fields=True):
    messages: Annotated[list[PromptMessage], Meta(min_length=1)]
    """The prompt, as chat messages (the role's chat template is applied)."""
    completions: Annotated[list[ScoredCompletion], Meta(min_length=2)]


class GRPORequest(msgspec.Struct, forbid_unknown_fields=True):
    groups: Annotated[list[ScoredGroup], Meta(min_length=1)]


class RollbackResponse(msgspec.Struct):
    role: str
    version: int


def check_grpo_limits(body: GRPORequest, limits: LimitsConfig) -> None:
    """Counts first; tokens are checked once the texts are tokenized (``_samples``)."""
    if len(body.groups) > limits.max_grpo_groups:
        raise BadRequest(f"{len(body.groups)} groups is more than this server allows ({limits.max_grpo_groups}).",
                         param="groups", code="limit_exceeded")
    for i, group in enumerate(body.groups):
        if len(group.completions) > limits.max_grpo_completions:
            raise BadRequest(f"{len(group.completions)} completions is more than this server allows "
                             f"({limits.max_grpo_completions}).", param=f"groups[{i}].completions",
                             code="limit_exceeded")
    # a token is at least one byte of text: a body with more characters than the token cap may still fit,
    # but one with more than 16 characters per allowed token cannot, and is refused before tokenizing
    num_chars = sum(len(m.content) for g in body.groups for m in g.messages) + \
        sum(len(c.text) for g in body.groups for c in g.completions)
    if num_chars > 16 * limits.max_grpo_tokens:
        raise BadRequest(f"The groups' text is longer than this server allows ({limits.max_grpo_tokens} tokens).",
                         param="groups", code="limit_exceeded")


def learner_routes(learner: TestTimeLearner, client: Any, config: ServerConfig | None = None,
                   admission: Admission | None = None) -> list[BaseRoute]:
    config = config or ServerConfig()
    admission = admission or Admission(config.admission)
    decoder = msgspec.json.Decoder(GRPORequest)

    def _check(role: str) -> None:
        if role != learner.role:
            raise NotFound(f"Role `{role}` does not learn (only `{learner.role}`).", param="role")
        if not learner.is_ready:
            raise Unavailable("the test-time learner is not loaded yet", code="learner_not_ready")

    async def _samples(role: str, body: GRPORequest) -> list:
        samples, num_tokens = [], 0
        for i, group in enumerate(body.groups):
            messages = [{"role": m.role, "content": m.content} for m in group.messages]
            try:
                group_samples = await planner_samples(client, role, messages, [c.text for c in group.completions],
                                                      [c.reward for c in group.completions], uuid.uuid4().hex)
            except Exception as err:  # chat templates raise on sequences they don't accept
                raise BadRequest(f"The messages do not fit this model's chat template: {err}",
                                 param=f"groups[{i}].messages") from None
            num_tokens += sum(len(s.prompt_ids) + len(s.completion_ids) for s in group_samples)
            if num_tokens > config.limits.max_grpo_tokens:
                raise BadRequest(f"The groups hold more tokens than this server allows "
                                 f"({config.limits.max_grpo_tokens}).", param="groups", code="limit_exceeded")
            samples += group_samples
        return samples

    async def grpo(request: Request) -> Response:
        role = request.path_params["role"]
        _check(role)
        body: GRPORequest = await read_json(request, config.max_body_bytes, decoder)
        check_grpo_limits(body, config.limits)
        async with admission.slot("route:admin", config.admission.max_concurrent_admin):
            samples = await _samples(role, body)
            try:
                report = await learner.update(samples)
            except ValueError as err:
                raise BadRequest(f"invalid samples: {err}", param="groups") from None
        return Response(msgspec.json.encode(report), media_type="application/json")

    async def rollback(request: Request) -> Response:
        role = request.path_params["role"]
        _check(role)
        async with admission.slot("route:admin", config.admission.max_concurrent_admin):
            try:
                version = await learner.rollback()
            except AdapterError as err:
                raise Conflict(str(err)) from None
        return Response(msgspec.json.encode(RollbackResponse(role, version)), media_type="application/json")

    return [
        ApiRoute("/v1/adapters/{role}/grpo", grpo, method="POST", summary="One GRPO update from scored completions",
                 scope="learn", request_type=GRPORequest, response_type=UpdateReport),
        ApiRoute("/v1/adapters/{role}/rollback", rollback, method="POST",
                 summary="Serve the checkpoint before the latest good one", scope="admin",
                 response_type=RollbackResponse),
    ]
