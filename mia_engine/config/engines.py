"""``[engines.<name>]``: one vLLM engine per base model, and ``[models]``, where embedded models are built.
An engine table takes every vLLM engine argument in vLLM's spelling (``vllm_args.py``, from vLLM's own
``EngineArgs``) and the fields below, which are this engine's own or vLLM's with another default (each
says why). Each engine checks its own fields; which roles use it is the root's rule (``root.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from ..base.structs import Frozen
from .cpu import CpuEngineConfig
from .errors import check_field, check_non_negative, check_positive
from .vllm_args import ENGINE_ARGS, VllmEngineArgs, vllm_engine_args


class EngineConfig(VllmEngineArgs, kw_only=True):
    """One vLLM engine (one base model); every role on the same base shares it through multi-LoRA."""

    model: str
    """A local Hugging Face model folder, a Hugging Face model id already in the local Hugging Face cache
    (``HF_HOME`` / ``HF_HUB_CACHE``; the server never downloads: ``hf download <id>`` first), or
    ``embedded:smollm2`` / ``embedded:tiny`` (built on first use)."""
    served_model_name: list[str] = []
    """The model ids clients name for this engine's bare base model (``vllm serve --served-model-name``);
    empty = the engine's name. ``serve MODEL`` sets it to MODEL as given, as ``vllm serve`` does. vLLM's own
    metrics label the engine by its name."""
    dtype: str = "auto"
    """Weights and activation dtype. ``auto`` takes the model's, except on an x86 CPU without native bfloat16
    (``avx512_bf16``/``amx_bf16``), where the engine asks vLLM for float32 (``engines/cpu/options.py``):
    oneDNN's emulated bf16 runs slower than float32. The engine logs what it resolved to."""
    max_model_len: int = 2048
    """Context length: prompt + completion tokens (vLLM: the model's; the server sizes its request limits
    from it before the engine starts)."""
    gpu_memory_utilization: float = 0.3
    """Fraction of GPU memory for weights + KV cache (on CPU, of a NUMA node's memory; vLLM: 0.92, which
    leaves nothing for the other engines, the encoder and the learner that share the box)."""
    devices: list[int] = []
    """GPUs this engine runs on, passed as vLLM's ``device_ids`` (physical ids, or indices into
    ``CUDA_VISIBLE_DEVICES`` when it is set): tensor x pipeline x data-parallel entries, replica by replica.
    Empty = the process's default devices. Must stay empty with ``executor_backend = "ray"`` (Ray's
    placement groups choose the GPUs)."""
    routing: Literal["rollout", "load"] = "rollout"
    """Data-parallel routing: ``rollout`` sends every request that carries an affinity key (the agent's
    rollout id) to one replica chosen by a stable hash of the key, so a rollout's later turns (reflection,
    replan, the Executor's next step) hit the replica that caches their prefix; requests without a key,
    and all of them with ``load``, are balanced by vLLM."""
    enforce_eager: bool = True
    """Skip CUDA-graph capture / compilation: faster start, slower decode (vLLM: off)."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of shared prompt prefixes: G plans of one question share the prompt (vLLM: its
    per-model choice)."""
    block_size: int = 0
    """Tokens per KV-cache block; 0 = vLLM's default for the platform (16 on GPUs, 128 on CPU). The prefix
    cache reuses whole blocks only, so a prompt shares nothing shorter than one block."""
    max_num_seqs: int = 256
    """Sequences decoded together in one step (vLLM: its per-platform choice; the warm-up and the request
    limits need the number before the engine starts)."""
    max_num_batched_tokens: int = 0
    """Tokens (prefill + decode) in one step; 0 = vLLM's default for the platform."""
    warmup_max_seqs: int = 0
    """Start-up warm-up (``engines/warmup.py``): before the server reports ready, the engine serves rounds
    of 1, 2, 4, ... up to this many synthetic requests at once, every adapter of its roles mixed in, so
    that its processes' allocators hold what batches up to that size need before traffic sends them. 0 =
    none (the default; on a GPU vLLM's own profiling run sizes the memory)."""
    tokenizer_threads: int = 2
    """Threads that run this engine's tokenizer (chat templates, tokenizing, detokenizing) off the event
    loop. The ``tokenizers`` library keeps its BPE word cache per thread (up to ten thousand words each),
    so this count, not the machine's core count, bounds that cache's memory."""
    max_images_per_prompt: int = 1
    """Images one request may carry on a vision-language engine (vLLM's ``limit_mm_per_prompt``; it
    profiles the vision encoder's memory for this many). An image question sends one."""
    enable_lora: bool = True
    """Serve LoRA adapters on this engine, needed by any role with an adapter (vLLM: off)."""
    max_loras: int = 4
    """Distinct adapters in one batch: Planner + Executor versions need at least 2, plus one for a swap
    (vLLM: 1)."""
    max_cpu_loras: int = 8
    """Adapters cached in host memory, old versions being drained counted (vLLM: ``max_loras``)."""
    structured_outputs_backend: Literal["auto", "xgrammar", "guidance", "outlines"] = "auto"
    """vLLM's structured-outputs backend (regex / JSON-schema constrained requests)."""
    structured_outputs_cache_mib: int = 512
    """xgrammar's cache of compiled grammars in this engine's core process, in MiB (vLLM's
    ``VLLM_XGRAMMAR_CACHE_MB``, its default 512), least recently used first out. The research loop reuses a
    few grammars for every question (turns, plan forms, judges); clients' own ``response_format`` schemas and
    regexes are one each, so the engine core's memory grows with the distinct ones until this bound; a small
    vocabulary's grammars are small and need less."""
    compact_json: bool = False
    """JSON-constrained output without optional whitespace: small models otherwise fill their budget with
    newlines between keys. Needs ``structured_outputs_backend`` xgrammar or guidance."""
    structured_outputs_in_reasoning: bool = False
    """With a ``reasoning_parser``: a request's constraint (``response_format``, ``structured_outputs``, a
    forced tool call) applies while the model thinks too, from its first token (vLLM's
    ``structured_outputs_config.enable_in_reasoning``). Off (vLLM's default): the constraint starts once the
    reasoning parser sees the thinking end, so a reasoning model thinks freely and then answers in the
    constrained form. No effect without a ``reasoning_parser``."""
    cpu: CpuEngineConfig = CpuEngineConfig()
    """This engine on vLLM's CPU platform (no effect on a GPU)."""
    tool_call_parser: str = ""
    """vLLM's tool-call parser for this engine's models (``vllm serve --enable-auto-tool-choice
    --tool-call-parser``): with one, ``tool_choice: "auto"`` (the default when a request gives ``tools``)
    generates freely and the parser reads the model's own call syntax into ``tool_calls`` (``hermes`` for
    Qwen2.5 and Qwen3); empty = ``auto`` is refused with a 400 naming ``tool_choice``, since nothing could read
    the calls. A name vLLM does not register is refused before any engine starts."""
    enable_auto_tool_choice: bool = False
    """Accepted as ``vllm serve --enable-auto-tool-choice`` is; it needs ``tool_call_parser``. Unlike vLLM,
    a ``tool_call_parser`` alone already answers ``tool_choice: "auto"``: the parser is the only thing
    that could read the calls."""
    chat_template: str = ""
    """A Jinja chat template (a file's path, or the template itself) that replaces the model's own for
    every request on this engine (``vllm serve --chat-template``); empty = the tokenizer's."""
    executor_backend: Literal["auto", "uni", "mp", "ray"] = "auto"
    """Where the model runs: ``mp`` in worker processes on this node (vLLM's choice, ``auto``), ``uni``
    inside the engine-core process (one GPU only), ``ray`` on the GPUs of a Ray cluster (vLLM's multi-node
    executor: a model that outgrows this box; start the cluster first, docs/DEPLOY_8GPU.md, "Past one box"). On a small
    CPU ``uni`` gives the model the core that ``mp``'s busy-waiting worker queue takes; it is opt-in
    because it was no faster than ``mp`` with ``cpu.keep_off_model_cores`` and had a worse p99 for
    one request at a time."""

    def __post_init__(self) -> None:
        for field in ("max_model_len", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                      "max_num_seqs", "tokenizer_threads", "max_loras", "max_cpu_loras", "max_lora_rank",
                      "max_images_per_prompt", "structured_outputs_cache_mib"):
            check_positive(field, getattr(self, field))
        check_field(0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization", "must be in (0, 1]")
        check_field(self.max_cpu_loras >= self.max_loras, "max_cpu_loras", f"must be >= max_loras ({self.max_loras})")
        check_field(not self.compact_json or self.structured_outputs_backend in ("xgrammar", "guidance"),
                    "compact_json", "needs structured_outputs_backend xgrammar or guidance")
        check_non_negative("block_size", self.block_size, "vLLM's default for the platform")
        check_non_negative("warmup_max_seqs", self.warmup_max_seqs, "no warm-up")
        check_field(self.warmup_max_seqs <= self.max_num_seqs, "warmup_max_seqs",
                    f"{self.warmup_max_seqs} is more than max_num_seqs ({self.max_num_seqs}), the most the engine "
                    "runs at once")
        check_field(not self.enable_auto_tool_choice or bool(self.tool_call_parser), "enable_auto_tool_choice",
                    "needs tool_call_parser (vllm serve --tool-call-parser NAME)")
        check_field(all(self.served_model_name), "served_model_name", "names must not be empty")
        check_field(not self.chat_template or "{" in self.chat_template
                    or Path(self.chat_template).expanduser().is_file(), "chat_template",
                    f"{self.chat_template!r} is neither a file nor a Jinja template")
        self._check_placement()

    def model_ids(self, name: str) -> list[str]:
        """The model ids of this engine's bare base model, ``name`` being its table's name."""
        return list(self.served_model_name) or [name]

    def cpu_kv_cache_bytes(self) -> int:
        """The KV cache on vLLM's CPU platform, in bytes: vLLM's own ``kv_cache_memory_bytes`` where set,
        else ``cpu.kv_cache_space_gib`` (fractions of a GiB too, which vLLM's legacy whole-GiB
        ``VLLM_CPU_KVCACHE_SPACE`` cannot say; an operator's ``VLLM_CPU_KVCACHE_SPACE`` still wins, as vLLM
        reads it last)."""
        if self.kv_cache_memory_bytes is not None:
            return int(self.kv_cache_memory_bytes)
        return int(self.cpu.kv_cache_space_gib * (1 << 30))

    def other_vllm_args(self) -> dict[str, object]:
        """The vLLM engine arguments this table sets, other than vLLM's defaults, that are not fields of
        this class's own (the engine converts and passes those itself)."""
        return vllm_engine_args(self, _OWN_VLLM_FIELDS)

    def _check_placement(self) -> None:
        replica = self.tensor_parallel_size * self.pipeline_parallel_size
        check_field(self.executor_backend != "uni" or replica == 1, "executor_backend",
                    f"'uni' runs one GPU per replica; tensor x pipeline parallel = {replica} needs 'mp' or 'ray'")
        check_field(self.executor_backend != "ray" or not self.devices, "devices",
                    "must be empty with executor_backend 'ray' (Ray places the workers)")
        num_devices = replica * self.data_parallel_size
        check_field(not self.devices or len(self.devices) == num_devices, "devices",
                    f"needs tensor_parallel_size x pipeline_parallel_size x data_parallel_size = {num_devices} "
                    f"entries, got {len(self.devices)}")
        check_field(len(set(self.devices)) == len(self.devices) and all(d >= 0 for d in self.devices), "devices",
                    "GPU ids must be distinct and >= 0")


_OWN_VLLM_FIELDS = frozenset(EngineConfig.__annotations__) & ENGINE_ARGS.keys()
"""vLLM's engine arguments that ``EngineConfig`` redefines (another default or meaning)."""


class ModelsConfig(Frozen):
    """Where embedded models are built and cached."""

    home: str = ""
    """Cache folder; empty = ``$MIA_HOME`` or ``~/.cache/mia_engine``."""

