"""``[server]``: the HTTP front end, its per-request limits, admission (bounded concurrency and queues) and
image inputs. Each struct checks its own fields; ``check_bind`` / ``check_keys`` / ``check_adapter_dirs`` are
the rules only ``serve`` applies (batch commands load the same config and bind nothing)."""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path
from typing import Literal

import msgspec

from ..base.key_table import read_key_table
from ..base.keys import MIN_KEY_CHARS, KeyFileError
from ..base.structs import Frozen
from .errors import ConfigError, check_field, check_non_negative, check_positive


def _check_counts(section: Frozen, zero_means: dict[str, str]) -> None:
    """Every number of ``section`` is >= 1, or >= 0 where 0 has a meaning (``zero_means``)."""
    for field, value in msgspec.structs.asdict(section).items():
        if isinstance(value, bool):
            continue
        if field in zero_means:
            check_non_negative(field, value, zero_means[field])
        else:
            check_positive(field, value)


def _is_network(cidr: str) -> bool:
    try:
        ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        return False
    return True


class LimitsConfig(Frozen):
    """Per-request size limits of the HTTP API; a request over one is refused with a 4xx naming the field."""

    max_tokens: int = 0
    """Largest ``max_tokens`` / ``max_completion_tokens`` accepted, and the most a request without one may
    generate; 0 = no cap beyond the context: as with ``vllm serve``, a request without ``max_tokens`` may fill
    what the context leaves after its prompt (or its role's ``sampling.max_tokens``, where set)."""
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
    max_completion_choices: int = 128
    """Most choices (prompts x ``n``) of one ``/v1/completions`` request: each is an engine request running
    under the request's one model slot, so a list of prompts could otherwise put thousands on an engine past
    every concurrency bound (the default is ``admission.max_concurrent_per_model``'s)."""
    max_embedding_inputs: int = 2048
    """Most texts in one ``/v1/embeddings`` request (OpenAI's own limit): they are encoded on the memory's shared
    encoder, in jobs of ``memory.embedder.max_texts_per_job`` between which the agent's retrieval runs."""
    max_embedding_chars: int = 1_200_000
    """Most characters over all texts of one ``/v1/embeddings`` request, counted before any is tokenised:
    OpenAI's 300,000 tokens a request at four characters a token. The encoder reads only the first
    ``memory.embedder.max_seq_tokens`` of each text, but its tokenizer reads the whole text first, so without
    this cap 2,048 huge texts would hold the encoder's thread for seconds."""
    max_logprob_entries: int = 524_288
    """Most log-prob entries one chat or text completion may ask for, checked before the prompt is tokenised
    (and again with the budget the context leaves when no ``max_tokens`` is given): ``n`` x prompts x
    ``max_tokens`` x (``top_logprobs`` / ``logprobs`` + 1). Each entry is an object the server builds, holds
    and encodes, so the other caps' largest, n = 16 x 4,096 tokens x 21 (1.4 million), is refused. The
    default lets one completion of 24,000 tokens with 20 top log-probs through, six over the default
    config's whole 4,096-token context, or n = 16 x 3,072 tokens with 5; a client that asks for 20 top
    log-probs without ``max_tokens`` on a 32k-token context (``8xgpu.toml``) needs it raised to 700,000."""
    max_grpo_groups: int = 16
    """Most groups in one ``POST /v1/adapters/{role}/grpo``."""
    max_grpo_completions: int = 16
    """Most completions in one GRPO group."""
    max_grpo_tokens: int = 65536
    """Most tokens (prompts + completions, all groups) in one GRPO request."""


    def __post_init__(self) -> None:
        _check_counts(self, zero_means={"max_tokens": "no cap beyond the context"})


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
    """Requests with a body in flight at once from one client, counted before the body bound; more wait in
    that client's queue like any key's. A client is its key where it sends one of ``server.keys_file`` (which
    may set its own bound, ``max_concurrent``), else its address (an IPv6 client by its /64), loopback
    included. One client cannot take every slot; 0 = no per-client bound (but a key's own)."""
    bound_loopback_clients: bool = True
    """Apply ``max_concurrent_per_client`` to loopback addresses too. Off only for a trusted proxy or
    benchmark on the box that is one client driving every slot: off, any local user escapes the bound. A
    local user can still pick another 127.x source address, so give users on the box keys of
    ``server.keys_file``, which are bound by key whatever their address."""
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


    def __post_init__(self) -> None:
        _check_counts(self, zero_means={"max_concurrent_per_client": "no per-client bound",
                                        "send_buffer_bytes": "the kernel's own"})


class ConnectionsConfig(Frozen):
    """Bounds on the TCP connections themselves, applied as each is accepted, before a byte of its request is
    read (``server/connections.py``): a client cannot hold sockets open with partial requests. A connection
    over a cap is answered 503 and closed at once; refusals and late headers are logged at most once every
    few seconds, with counts."""

    max_connections: int = 16384
    """Open connections at once, all clients together; one more is refused. The serving process raises its
    open-files limit towards the hard limit at start to fit it (and lowers this cap, with a warning, where
    it cannot), so a flood is refused here rather than failing ``accept`` for everyone. Thousands of
    clients, each with a few pooled connections, fit; 0 = no cap."""
    max_connections_per_client: int = 1024
    """Open connections at once from one client address (an IPv6 client by its /64, loopback included);
    one more from it is refused while other addresses keep connecting. As many as one client's requests may
    wait for admission (``admission.max_queued_per_key``), so a benchmark or a gateway on one host is not
    refused where admission would queue it. A trusted proxy (``proxy_headers`` and ``forwarded_allow_ips``)
    is exempt: it carries many clients. 0 = no per-client cap."""
    header_timeout_s: float = 10.0
    """Time for a request's line and headers to arrive, in seconds from the connection's opening (its first
    request) or from the first byte of the next one on a keep-alive connection; later the connection is
    closed. Headers are a few hundred bytes, so only a stalled or trickling client takes this long. Between
    requests a keep-alive connection is closed after ``keep_alive_s``; a body is bounded by
    ``admission.body_timeout_s``."""


    def __post_init__(self) -> None:
        _check_counts(self, zero_means={"max_connections": "no cap",
                                        "max_connections_per_client": "no per-client cap"})


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


    def __post_init__(self) -> None:
        for field in ("max_bytes", "max_pixels", "max_images_per_request", "fetch_timeout_s"):
            check_positive(field, getattr(self, field))
        ca_file = self.remote_ca_file
        check_field(not ca_file or Path(ca_file).expanduser().is_file(), "remote_ca_file", f"{ca_file} is not a file")
        for cidr in self.remote_allowed_networks:
            check_field(_is_network(cidr), "remote_allowed_networks", f"{cidr!r} is not a network (CIDR)")


class ServerConfig(Frozen):
    """The HTTP front end."""

    host: str = "127.0.0.1"
    """Interface to bind. A non-loopback address needs ``api_key`` or ``keys_file`` (or
    ``allow_unauthenticated_bind``)."""
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
    keys_file: str = ""
    """A TOML file of hashed keys of several users, each with a name, its scopes (``chat``, ``agent``,
    ``learn``, ``memory-read``, ``memory-write``, ``admin``) and optionally its own per-client bound
    (``base/key_table.py``; ``python -m mia_engine keys add NAME --scopes chat,agent --file PATH`` writes
    entries). Read at start (a bad file: one line naming the entry, exit 2) and again on SIGHUP without
    dropping requests (a bad file then keeps the keys loaded before, with one error line). Set, every /v1
    request needs a key: one of the file's, or ``api_key`` (chat and agent) or ``admin_api_key`` (every
    scope), which keep working beside it. Refused where another user owns it or may write it (``chmod 600``):
    whoever can write it can add a key. Empty = ``api_key`` and ``admin_api_key`` alone."""
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
    connections: ConnectionsConfig = ConnectionsConfig()
    images: ImageInputConfig = ImageInputConfig()
    proxy_headers: bool = False
    """Take the client's address from ``X-Forwarded-For`` (and the scheme from ``X-Forwarded-Proto``) when the
    connection comes from one of ``forwarded_allow_ips``: for a server behind a reverse proxy, so that the
    per-client bounds and the access log see the real clients. Off: the header is ignored whoever sends it,
    so no client (a local user on loopback included) can pose as another address."""
    forwarded_allow_ips: list[str] = []
    """Addresses or networks (CIDR) of the proxies whose ``X-Forwarded-For`` is believed with
    ``proxy_headers``, e.g. ``["127.0.0.1"]`` for a proxy on the box; ``"*"`` = any peer (only where nothing
    but the proxy can reach the port). Required with ``proxy_headers``."""
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
    not stay in its RSS; 0 = never. No effect under another C library or a preloaded allocator. A learner
    process of its own (``learner.process``) trims its heap after each step instead."""

    def __post_init__(self) -> None:
        check_positive("max_n", self.max_n)
        check_non_negative("shutdown_timeout_s", self.shutdown_timeout_s, "cancel requests in flight at once")
        check_positive("max_body_bytes", self.max_body_bytes)
        check_field(0 <= self.port <= 65535, "port", f"{self.port} is not a TCP port")
        check_field(all(d.strip() and Path(d).expanduser().is_absolute() for d in self.adapter_dirs),
                    "adapter_dirs", f"must hold absolute paths, got {self.adapter_dirs}")
        for entry in self.forwarded_allow_ips:
            check_field(entry == "*" or _is_network(entry), "forwarded_allow_ips",
                        f"{entry!r} is not an address, a network (CIDR) or \"*\"")
        check_field(not self.proxy_headers or self.forwarded_allow_ips, "proxy_headers",
                    "name the proxies it trusts in server.forwarded_allow_ips")

    def is_loopback(self) -> bool:
        return is_loopback_host(self.host)

    def is_keyed(self) -> bool:
        """Whether /v1 needs a key: ``api_key`` or ``keys_file`` is set."""
        return bool(self.api_key or self.keys_file)


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(server: ServerConfig) -> None:
    """Refuse to serve a non-loopback address without an API key (checked by ``serve`` only: a config is
    also loaded by batch commands that bind nothing)."""
    if not server.is_loopback() and not server.is_keyed() and not server.allow_unauthenticated_bind:
        raise ConfigError(
            f"server.host: {server.host} is not a loopback address and no API key is set; set MIA_API_KEY "
            "(or --api-key-file, or server.keys_file), or pass --server.allow_unauthenticated_bind=true to serve "
            "it to anyone")


def check_adapter_dirs(server: ServerConfig) -> None:
    """Refuse (``ConfigError``, one line) an ``adapter_dirs`` folder that another user controls: each must be
    a folder (links followed, as the routes resolve them) owned by this user or by root that neither its
    group nor others may write, as ``base.files.private_dir`` demands of the folders the server writes;
    whoever can write it chooses the weights an admin key publishes. Checked by ``serve`` only, as
    ``check_bind``."""
    for folder in server.adapter_dirs:
        path = Path(folder).expanduser()
        try:
            st = os.stat(path)
        except OSError as err:
            raise ConfigError(f"server.adapter_dirs: cannot use {path}: {err.strerror}; create it (mkdir -m 755 "
                              f"{path}) or leave it out") from None
        if not stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"server.adapter_dirs: {path} is not a folder")
        if st.st_uid not in (os.geteuid(), 0):
            raise ConfigError(f"server.adapter_dirs: {path} belongs to another user (uid {st.st_uid}), who can "
                              "change what it holds; use a folder of your own or of root's")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o022:
            raise ConfigError(f"server.adapter_dirs: {path} is open to other users (mode {mode:04o}); run: "
                              f"chmod go-w {path}")


def check_keys(server: ServerConfig) -> list[str]:
    """Refuse keys that merge the two scopes, a ``keys_file`` that is unsafe or invalid, and keys shorter
    than ``MIN_KEY_CHARS`` on a bind that other machines reach; on loopback a short key (``vllm serve
    --api-key token-abc123``) is accepted, and returned as a warning line to log (checked by
    ``serve`` only, as ``check_bind``)."""
    warnings = []
    for field in ("api_key", "admin_api_key"):
        key = getattr(server, field)
        if key and len(key) < MIN_KEY_CHARS:
            advice = f"use at least {MIN_KEY_CHARS} (python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            if not server.is_loopback():
                raise ConfigError(f"server.{field}: {len(key)} characters, on {server.host}, which other machines "
                                  f"reach; {advice}")
            warnings.append(f"server.{field}: {len(key)} characters, accepted on loopback only; {advice}")
    if server.admin_api_key and server.admin_api_key == server.api_key:
        raise ConfigError("server.admin_api_key: equals server.api_key, which would make every API client an "
                          "admin; use a different key")
    if server.keys_file:
        try:
            read_key_table(Path(server.keys_file).expanduser())
        except KeyFileError as err:
            raise ConfigError(str(err)) from None
    return warnings
