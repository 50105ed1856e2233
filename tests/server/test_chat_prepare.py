"""What ``ChatService.prepare`` makes of a chat request before any engine work, on a real role handle over the
tiny model's tokenizer (the engine never started): the chat-template variables the prompt is rendered with (a
request's ``chat_template_kwargs`` over the role's, bounded), and the completion budget (``max_tokens`` absent:
what the context leaves, as vLLM; ``server.limits.max_tokens`` only where set)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from transformers import AutoTokenizer

from mia_engine.config import LimitsConfig, SamplingDefaults, ServerConfig, load_config
from mia_engine.engines.adapters import AdapterRegistry
from mia_engine.engines.output_parsers import EngineParsers
from mia_engine.engines.role_handle import RoleHandle, RoleTarget
from mia_engine.engines.vllm_engine import VLLMEngine
from mia_engine.models.tiny import build_tiny
from mia_engine.server.chat import ChatService, capped_budget
from mia_engine.server.errors import BadRequest
from mia_engine.server.metrics import Metrics
from mia_engine.server.openai_bodies import ChatCompletionRequest

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "<|im_start|>assistant\n[{{ greeting }} {{ mood }}]")
"""Prints two variables in the generation prompt."""
ROLE_KWARGS = {"greeting": "hello from the role", "mood": "calm"}
CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    build_tiny(out)
    return out / "base"


class _OneRole:
    """An engine client serving one role handle."""

    def __init__(self, handle: RoleHandle) -> None:
        self.handle = handle

    def has_model(self, model: str) -> bool:
        return True

    def is_ready(self) -> bool:
        return True

    def find(self, model: str) -> RoleHandle:
        return self.handle


def _chat(base: Path, *, max_model_len: int = 4096, limits: LimitsConfig = LimitsConfig(),
          sampling: SamplingDefaults = SamplingDefaults()) -> tuple[ChatService, Any]:
    config = load_config("tiny").engines["tiny"]
    engine = VLLMEngine("tiny", msgspec.structs.replace(config, max_model_len=max_model_len), base)  # never started
    engine.tokenizer = AutoTokenizer.from_pretrained(base)
    engine.tokenizer.chat_template = TEMPLATE
    parsers = EngineParsers("tiny", "", "", engine.tokenizer)
    handle = RoleHandle("manager", RoleTarget(engine, None, sampling, "role", dict(ROLE_KWARGS)), AdapterRegistry(),
                        parsers, None)
    return ChatService(_OneRole(handle), ServerConfig(limits=limits), Metrics()), engine  # type: ignore[arg-type]


def _request(**fields: Any) -> ChatCompletionRequest:
    return msgspec.convert({"model": "manager", "messages": CHAT, **fields}, ChatCompletionRequest)


async def test_a_requests_template_variables_reach_the_template_over_the_roles(base: Path) -> None:
    chat, engine = _chat(base)
    try:
        plain = await chat.prepare(_request())
        assert engine.tokenizer.decode(plain.prompt_ids).endswith("[hello from the role calm]")
        mine = await chat.prepare(_request(chat_template_kwargs={"greeting": "hello from the request"}))
        assert engine.tokenizer.decode(mine.prompt_ids).endswith("[hello from the request calm]")
        assert mine.options.chat_template_kwargs == {"greeting": "hello from the request"}  # the engine's parsers too
    finally:
        engine.shutdown()


@pytest.mark.parametrize("kwargs", [
    {"messages": "x"}, {"add_generation_prompt": False}, {"tools": "x"}, {"eos_token": "x"},  # the template's own
    {f"k{i}": i for i in range(17)},  # too many
    {"greeting": "x" * 1025},  # too long
    {"bad name": 1}, {"": 1},
])
async def test_template_variables_out_of_bounds_are_a_400_naming_the_field(base: Path, kwargs: dict) -> None:
    chat, engine = _chat(base)
    try:
        with pytest.raises(BadRequest) as refused:
            await chat.prepare(_request(chat_template_kwargs=kwargs))
        assert refused.value.param == "chat_template_kwargs", refused.value.message
        with pytest.raises(BadRequest) as template:
            await chat.prepare(_request(chat_template="{{ messages }}"))
        assert template.value.param == "chat_template"
    finally:
        engine.shutdown()


async def test_without_max_tokens_the_budget_is_what_the_context_leaves(base: Path) -> None:
    """As vLLM: no server-wide default cap (it was 4096); the role's ``sampling.max_tokens`` where set, and
    ``server.limits.max_tokens`` only where the operator sets it."""
    chat, engine = _chat(base, max_model_len=32768)
    try:
        prepared = await chat.prepare(_request())
        assert prepared.options.max_tokens == 32768 - len(prepared.prompt_ids) > 4096
        capped, capped_engine = _chat(base, max_model_len=32768, limits=LimitsConfig(max_tokens=1000))
        assert (await capped.prepare(_request())).options.max_tokens == 1000
        capped_engine.shutdown()
        role_default, role_engine = _chat(base, max_model_len=32768, sampling=SamplingDefaults(max_tokens=300))
        assert (await role_default.prepare(_request())).options.max_tokens == 300
        role_engine.shutdown()
        assert (await chat.prepare(_request(max_tokens=20000))).options.max_tokens == 20000
    finally:
        engine.shutdown()
    assert capped_budget(5000, 0) == 5000 and capped_budget(5000, 1000) == 1000
