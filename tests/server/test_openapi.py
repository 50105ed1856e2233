"""``/openapi.json`` is generated from the routes' msgspec structs; route contracts checked in-process
(fakes stand in for the engine and the learner: only the HTTP logic is under test here)."""

from __future__ import annotations

import msgspec
from starlette.testclient import TestClient

from mia_engine.config import ServerConfig
from mia_engine.server.app import AppParts, build_app
from mia_engine.server.learner_api import GRPORequest
from mia_engine.server.openai_bodies import ChatCompletionRequest
from tests.fakes import RolesByName

ADMIN_KEY = "admin-key-of-this-test"
CONFIG = ServerConfig(allowed_hosts=["testserver"], admin_api_key=ADMIN_KEY)
GROUP = {"messages": [{"role": "user", "content": "hi"}],
         "completions": [{"text": "a", "reward": 1.0}, {"text": "b", "reward": 0.0}]}


class _Engine(RolesByName):
    def models(self) -> list:
        return []

    def is_ready(self) -> bool:
        return True

    async def render_chat(self, model: str, messages: list[dict[str, str]]) -> list[int]:
        raise ValueError("Conversation roles must alternate user/assistant/user/assistant/...")


class _Learner:
    role = "planner"
    is_ready = True

    async def update(self, samples: list) -> None:
        raise AssertionError("a request the template refuses must not reach the learner")


def _client() -> TestClient:
    app = build_app(AppParts(_Engine(), CONFIG, learner=_Learner()))  # type: ignore[arg-type]
    return TestClient(app)


def test_the_document_is_generated_from_the_structs() -> None:
    document = _client().get("/openapi.json").json()
    _, components = msgspec.json.schema_components([ChatCompletionRequest, GRPORequest],
                                                   ref_template="#/components/schemas/{name}")
    for name, schema in components.items():
        assert document["components"]["schemas"][name] == msgspec.json.decode(msgspec.json.encode(schema))
    chat = document["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ChatCompletionRequest"}
    assert document["paths"]["/v1/adapters/{role}/grpo"]["post"]["x-mia-scopes"] == ["learn"]


def test_a_chat_template_error_on_the_grpo_route_is_400() -> None:
    response = _client().post("/v1/adapters/planner/grpo", json={"groups": [GROUP]},
                              headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "groups[0].messages"
