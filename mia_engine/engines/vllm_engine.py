"""One vLLM ``AsyncLLM`` serving one base model (and any number of LoRA adapters on it).

vLLM is configured through engine args (GPUs included: ``devices`` -> ``device_ids``); the platform adds
its own (``platforms.py``; on vLLM's CPU platform the dtype ``auto`` asks for and our keys in
``additional_config``, ``engines/cpu/options.py``). The few variables its spawned processes read only from the environment are
applied by the caller around a group of starts (``startup.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from vllm import SamplingParams
from vllm.config import StructuredOutputsConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.lora.request import LoRARequest
from vllm.outputs import RequestOutput
from vllm.v1.metrics.loggers import PrometheusStatLogger

from ..config import EngineConfig
from ..config.cpu import CpuConfig
from .client import EngineUnavailable
from .platforms import Platform, resolve_platform
from .startup import replica_for
from .teardown import await_begun_teardowns, teardown_timeout_s

log = logging.getLogger(__name__)

T = TypeVar("T")


def hf_config(model_dir: Path) -> dict[str, Any]:
    """The model folder's ``config.json`` ({} when it cannot be read)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def chat_template_text(template: str) -> str:
    """``engines.<name>.chat_template``: a file's contents, or the text itself (as ``vllm serve
    --chat-template`` reads it)."""
    path = Path(template).expanduser()
    is_file = "{" not in template and path.is_file()
    return path.read_text() if is_file else template


def vocab_size(config: dict[str, Any]) -> int:
    """The vocabulary in tokens of a model's ``config.json`` (``vocab_size``, or its ``text_config``'s for a
    vision-language model); 0 when it does not say."""
    text = config.get("text_config")
    size = config.get("vocab_size") or (text.get("vocab_size") if isinstance(text, dict) else None)
    return size if isinstance(size, int) and not isinstance(size, bool) else 0


def executor_backend(config: EngineConfig) -> str | None:
    """vLLM's ``distributed_executor_backend`` for this engine (None: vLLM decides)."""
    return None if config.executor_backend == "auto" else config.executor_backend


_STAT_LOGGER_BUILD = threading.Lock()
"""Held while a stat logger is built: vLLM's logger first unregisters every ``vllm:`` collector of the
process-global registry. With every group bound (``_METRIC_GROUPS``) ours leave none there; the lock keeps
two engines starting at once from unregistering the same one (``KeyError``) should a group vLLM adds
later still register globally."""

_METRIC_GROUPS = ("_spec_decoding_cls", "_kv_connector_cls", "_ec_connector_cls", "_perf_metrics_cls")
"""The logger's attributes naming vLLM's per-feature metric groups, each of which builds its own metrics."""


def stat_logger_for(registry: CollectorRegistry) -> type[PrometheusStatLogger]:
    """vLLM's Prometheus stat logger, registering all its ``vllm:*`` series (its per-feature groups' too:
    speculative decoding, KV/EC connectors, performance estimates) in ``registry`` instead of the
    process-global one: each logger clears every ``vllm:`` series of the global registry when it is built,
    so with several engines in one process only the last one's would remain there."""
    def bound(cls: type) -> type:
        return type(cls.__name__, (cls,), {"__init__": lambda self, *args, **kwargs: cls.__init__(
            self, *args, **{**kwargs, "registry": registry})})

    metric_classes = {"_gauge_cls": bound(Gauge), "_counter_cls": bound(Counter), "_histogram_cls": bound(Histogram)}

    def grouped(cls: type) -> type:
        return type(cls.__name__, (cls,), {key: value for key, value in metric_classes.items() if hasattr(cls, key)})

    def build(self: PrometheusStatLogger, *args: Any, **kwargs: Any) -> None:
        with _STAT_LOGGER_BUILD:
            PrometheusStatLogger.__init__(self, *args, **kwargs)

    return type("EnginePrometheusStatLogger", (PrometheusStatLogger,), {
        **metric_classes, **{name: grouped(getattr(PrometheusStatLogger, name)) for name in _METRIC_GROUPS},
        "__init__": build})


class VLLMEngine:
    """An engine for one base model; ``start`` spawns it without blocking the event loop."""

    def __init__(self, name: str, config: EngineConfig, model_dir: Path, platform: Platform | None = None) -> None:
        """``platform``: the one the server resolved (None: resolve it here, with the ``[cpu]`` defaults)."""
        self.name = name
        self.config = config
        self.platform = platform or resolve_platform(CpuConfig())
        self.model_dir = model_dir
        self.max_lora_rank = config.max_lora_rank
        model_config = hf_config(model_dir)
        self.supports_images = "vision_config" in model_config and not config.language_model_only
        """Requests may carry images: the model has a vision tower and the engine serves it."""
        self.vocab_size = vocab_size(model_config)
        """The model's vocabulary in tokens (0: unknown): structured-output grammars compile slower on a larger one."""
        self.tokenizer: Any = None
        self._tokenizer_threads = ThreadPoolExecutor(config.tokenizer_threads, thread_name_prefix=f"tokenizer-{name}")
        self.dtype = config.dtype
        """The dtype the engine runs in, as vLLM resolved it at start (``auto`` depends on the hardware)."""
        self.max_num_batched_tokens = config.max_num_batched_tokens
        """Tokens in one engine step, as vLLM resolved it at start (0 in the config: the platform's default)."""
        self._llm: Any = None
        self.metrics_registry = CollectorRegistry(auto_describe=True)
        """vLLM's own ``vllm:*`` series of this engine (labels ``model_name`` = the engine's name, ``engine`` =
        the data-parallel rank), filled by its stat logger; the server's ``/metrics`` renders it."""

    @property
    def is_running(self) -> bool:
        return self._llm is not None and not self._llm.errored

    async def start(self, config_lock: threading.Lock | None = None) -> None:
        """Spawn the engine; ``config_lock`` serialises vLLM's config building (it sets a module-global
        "current config") when several engines start at once."""
        loop = asyncio.get_running_loop()
        self.tokenizer = await loop.run_in_executor(None, self._load_tokenizer)
        self._llm = await loop.run_in_executor(None, self._build, config_lock or threading.Lock())
        log.info("engine %s is up (%s, %s)", self.name, self.model_dir, self.dtype)

    async def with_tokenizer(self, work: Callable[[Any], T]) -> T:
        """``work(tokenizer)`` on this engine's tokenizer threads (``tokenizer_threads``), off the event loop.
        The server's tokenizing, chat templates and detokenizing go through here, so the tokenizer's
        per-thread word caches live on those threads only. Raises ``EngineUnavailable`` once the engine
        is shut down."""
        try:
            future = asyncio.get_running_loop().run_in_executor(self._tokenizer_threads, work, self.tokenizer)
        except RuntimeError:  # the pool no longer takes work: shutdown() ran
            raise EngineUnavailable(f"engine {self.name} is shut down") from None
        return await future

    def _load_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        if self.config.chat_template:
            tokenizer.chat_template = chat_template_text(self.config.chat_template)
        return tokenizer

    def _engine_args(self) -> AsyncEngineArgs:
        return AsyncEngineArgs(**self.engine_kwargs())

    def engine_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of vLLM's ``AsyncEngineArgs`` for this engine: what the table sets, the
        arguments every platform gets, and the platform's own."""
        return {**self.config.other_vllm_args(), **self._common_engine_args(), **self.platform.engine_args(self.config)}

    def _common_engine_args(self) -> dict[str, Any]:
        """The engine args on every platform."""
        c = self.config
        return dict(
            model=str(self.model_dir),
            served_model_name=self.name,
            dtype=c.dtype,
            max_model_len=c.max_model_len,
            gpu_memory_utilization=c.gpu_memory_utilization,
            device_ids=list(c.devices) or None,
            enforce_eager=c.enforce_eager,
            enable_prefix_caching=c.enable_prefix_caching,
            block_size=c.block_size or None,
            max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=c.max_num_batched_tokens or None,
            limit_mm_per_prompt={"image": c.max_images_per_prompt} if self.supports_images else None,
            enable_lora=c.enable_lora,
            max_loras=c.max_loras,
            max_cpu_loras=c.max_cpu_loras,
            disable_log_stats=True,
            distributed_executor_backend=executor_backend(c),
            structured_outputs_config=StructuredOutputsConfig(backend=c.structured_outputs_backend,
                                                              disable_any_whitespace=c.compact_json,
                                                              enable_in_reasoning=c.structured_outputs_in_reasoning),
        )

    def _build(self, config_lock: threading.Lock) -> Any:
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        args = self._engine_args()
        with config_lock:
            vllm_config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)
        self.dtype = str(vllm_config.model_config.dtype).removeprefix("torch.")
        self.max_num_batched_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        return AsyncLLM.from_vllm_config(vllm_config, disable_log_stats=args.disable_log_stats,
                                         stat_loggers=[stat_logger_for(self.metrics_registry)])

    def replica(self, affinity_key: str | None) -> int | None:
        """The data-parallel rank for a request (None: vLLM balances by load)."""
        if affinity_key is None or self.config.data_parallel_size == 1 or self.config.routing != "rollout":
            return None
        return replica_for(affinity_key, self.config.data_parallel_size)

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str, lora: LoRARequest | None,
        affinity_key: str | None = None, images: Sequence[Any] = (), *, reasoning_ended: bool | None = None,
        reasoning_kwargs: dict[str, Any] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """vLLM's stream for one request; closing it early aborts the request in the engine. ``images``
        (decoded RGB images) fill the prompt's image placeholders in order; vLLM's processor expands
        each placeholder token into the image's tokens. ``reasoning_ended`` and ``reasoning_kwargs``: what
        vLLM's structured-output gate reads on an engine with a reasoning parser (``AsyncLLM.generate``'s
        ``reasoning_ended`` and ``reasoning_parser_kwargs``)."""
        prompt = TokensPrompt(prompt_token_ids=prompt_ids)
        if images:
            prompt["multi_modal_data"] = {"image": list(images)}
        rank = self.replica(affinity_key)
        reasoning = {} if reasoning_kwargs is None else {"reasoning_ended": reasoning_ended,
                                                          "reasoning_parser_kwargs": reasoning_kwargs}
        async with aclosing(self._llm.generate(prompt, params, request_id, lora_request=lora,
                                               data_parallel_rank=rank, **reasoning)) as outputs:
            async for output in outputs:
                yield output

    async def abort(self, request_id: str) -> None:
        await self._llm.abort(request_id)

    async def add_lora(self, request: LoRARequest) -> bool:
        return await self._llm.add_lora(request)

    async def remove_lora(self, lora_id: int) -> bool:
        return await self._llm.remove_lora(lora_id)

    async def loaded_loras(self) -> list[set[int]]:
        """The LoRA ids each data-parallel replica holds, in rank order (one set per replica). vLLM sends
        ``add_lora``/``remove_lora`` to every replica but answers ``list_loras`` from the first one only,
        so each is asked through its engine-core client's ``call_utility_all_async``."""
        return [set(ids) for ids in await self._llm.engine_core.call_utility_all_async("list_loras")]

    def shutdown(self) -> None:
        self._tokenizer_threads.shutdown(wait=False, cancel_futures=True)
        if self._llm is not None:
            waited = await_begun_teardowns(self._llm)
            if waited:
                log.info("engine %s: waited for engine core %s to finish the teardown it had begun",
                         self.name, waited)
            self._llm.shutdown(timeout=teardown_timeout_s())
            self._llm = None
