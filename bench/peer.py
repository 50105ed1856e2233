"""The strong peer of the research benchmark: MIA's loop as a user would parallelise it without this engine.

The same agent code (``ResearchAgent``: concurrent questions, concurrent rollouts, searches in batches)
runs in the benchmark's process, and every LLM call is an HTTP request to ``vllm serve`` (vLLM's own
OpenAI server, the roles as LoRA modules there). Prompts go as token ids to ``/v1/completions`` with
``return_token_ids``, so the peer renders, continues conversations and trains on exactly the tokens
ours does; structured outputs use vLLM's own ``structured_outputs`` field. "Learning" for the peer is
what a user of ``vllm serve`` can do: the same GRPO learner trains in this process, saves the adapter,
and ``POST /v1/load_lora_adapter`` loads it into the server as the role's next version (the old one is
unloaded once its requests finish).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
from vllm.lora.request import LoRARequest

from mia_engine.config import MIAConfig, SamplingDefaults, resolve_role
from mia_engine.engines.adapters import AdapterRegistry
from mia_engine.engines.client import CompletionDelta, ContextLengthError, SamplingOptions
from mia_engine.engines.role_handle import turn_glue
from mia_engine.models.embedded import adapter_dir


class NamedRole:
    """``client.role(name)`` of a client whose methods take the model id first (``render_chat(model, ...)``):
    each call is the client's method with ``name`` bound."""

    def __init__(self, client: Any, name: str) -> None:
        self._client = client
        self.name = name

    def __getattr__(self, attr: str) -> Any:
        return functools.partial(getattr(self._client, attr), self.name)


class RolesByName:
    """``role``/``find`` of the engine interface, for a client keyed by model id."""

    def role(self, name: str) -> NamedRole:
        return NamedRole(self, name)

    def find(self, name: str) -> NamedRole:
        return NamedRole(self, name)


class ServedLoRAHost:
    """``AdapterRegistry``'s engine interface over vLLM's runtime LoRA endpoints
    (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` on the server)."""

    def __init__(self, http: httpx.AsyncClient, max_lora_rank: int) -> None:
        self.http = http
        self.max_lora_rank = max_lora_rank
        self._names: dict[int, str] = {}

    async def add_lora(self, request: LoRARequest) -> bool:
        response = await self.http.post("/v1/load_lora_adapter",
                                         json={"lora_name": request.lora_name, "lora_path": request.lora_path})
        response.raise_for_status()
        self._names[request.lora_int_id] = request.lora_name
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        response = await self.http.post("/v1/unload_lora_adapter", json={"lora_name": self._names.pop(lora_id)})
        response.raise_for_status()
        return True


KEEPALIVE_EXPIRY_S = 2.0
"""How long the peer keeps an idle connection to ``vllm serve``: below uvicorn's ``timeout_keep_alive`` (5 s).
With httpx's default, also 5 s, a request sent on a connection the server was closing failed with
``ReadError`` (a seventeenth-session run of ``bench_research.py``)."""


class ServedRoles(RolesByName):
    """The agent's engine interface (``render_chat``, ``extend_chat``, ``generate``, ...) over ``vllm serve``."""

    def __init__(self, config: MIAConfig, base_url: str, served_name: str, model_dir: Path, home: Path) -> None:
        self.config = config
        self.http = httpx.AsyncClient(base_url=base_url, timeout=900,
                                      limits=httpx.Limits(max_connections=1024, max_keepalive_connections=1024,
                                                          keepalive_expiry=KEEPALIVE_EXPIRY_S))
        self.served_name = served_name
        self.model_dir = model_dir
        self.home = home
        self.adapters = AdapterRegistry()
        self.tokenizer: Any = None
        self.tokens = {"prompt": 0, "completion": 0}
        """Tokens sent and generated so far (a request's prompt once, every completion's output)."""

    async def start(self) -> None:
        """Load the tokenizer and every adapter role's first version into the server."""
        from transformers import AutoTokenizer

        self.tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, self.model_dir)
        for name, role in self.config.roles.items():
            canonical, resolved = resolve_role(self.config, name)
            if resolved.adapter and canonical == name:
                engine = self.config.engines[resolved.engine]
                path = await asyncio.to_thread(adapter_dir, resolved.adapter, engine.model, self.home)
                await self.adapters.register(name, ServedLoRAHost(self.http, engine.max_lora_rank), path)

    async def close(self) -> None:
        await self.http.aclose()

    def _role(self, model: str) -> tuple[str | None, SamplingDefaults, dict[str, Any]]:
        canonical, role = resolve_role(self.config, model)
        return (canonical if role.adapter else None), role.sampling, dict(role.chat_template_kwargs)

    def supports_images(self, model: str) -> bool:
        return False

    def max_model_len(self, model: str) -> int:
        return self.config.engines[resolve_role(self.config, model)[1].engine].max_model_len

    def max_tokens_for(self, model: str, prompt_len: int, requested: int | None) -> int:
        limit = self.max_model_len(model)
        if prompt_len >= limit:
            raise ContextLengthError(f"prompt of {prompt_len} tokens does not fit {limit}")
        return min(requested, limit - prompt_len) if requested else limit - prompt_len

    async def render_chat(self, model: str, messages: list[dict[str, Any]]) -> list[int]:
        kwargs = self._role(model)[2]

        def render() -> list[int]:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
            return self.tokenizer.encode(text, add_special_tokens=False)

        return await asyncio.to_thread(render)

    async def extend_chat(self, model: str, ids: list[int], user_text: str) -> list[int]:
        glue = await asyncio.to_thread(turn_glue, self.tokenizer, user_text, **self._role(model)[2])
        if ids and glue and ids[-1] == glue[0]:
            glue = glue[1:]
        return [*ids, *glue]

    async def encode(self, model: str, text: str) -> list[int]:
        return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens=False)

    async def generate(self, model: str, prompt_ids: list[int], options: SamplingOptions, request_id: str, *,
                       stream: bool, images: Sequence[Any] = ()) -> AsyncIterator[list[CompletionDelta]]:
        adapter_role, defaults, _ = self._role(model)
        body: dict[str, Any] = {
            "prompt": prompt_ids, "n": options.n, "max_tokens": options.max_tokens,
            "temperature": defaults.temperature if options.temperature is None else options.temperature,
            "top_p": defaults.top_p if options.top_p is None else options.top_p, "top_k": defaults.top_k,
            "presence_penalty": (defaults.presence_penalty if options.presence_penalty is None
                                 else options.presence_penalty),
            "stop": options.stop or None, "seed": options.seed, "return_token_ids": True,
            "skip_special_tokens": True, "request_id": request_id,
        }
        if options.regex is not None or options.json_schema is not None:
            body["structured_outputs"] = ({"regex": options.regex} if options.regex is not None
                                          else {"json": options.json_schema})
        if adapter_role is None:
            body["model"] = self.served_name
            choices = await self._post(body)
        else:
            async with self.adapters.acquire(adapter_role) as lora:
                body["model"] = lora.lora_name
                choices = await self._post(body)
        self.tokens["prompt"] += len(prompt_ids)
        self.tokens["completion"] += sum(len(c["token_ids"]) for c in choices)
        yield [CompletionDelta(c["index"], c["text"], len(c["token_ids"]), None, c["finish_reason"],
                               list(c["token_ids"])) for c in choices]

    async def _post(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        response = await self.http.post("/v1/completions", json=body)
        if response.status_code != 200:
            raise RuntimeError(f"vllm serve answered {response.status_code}: {response.text[:500]}")
        return response.json()["choices"]
