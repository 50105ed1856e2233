"""``doctor --checks contention``: memory searches while the test-time learner trains on the same GPU.

On the 8-GPU box the serving process's GPU holds both the memory search a ``mia`` question waits for and
the learner's GRPO steps. This measures what each costs the other, with the threads bound the way the
serving process binds them (``devices.bind_thread``: searches on a high-priority stream, the learner on
a low-priority one), and, in the same run, with both on the GPU's shared default stream for comparison:

- one **search** = what the agent does per question: encode 8 queries (a MiniLM-shaped encoder, 6 layers
  x 384, random weights) and score them against ``num_keys`` fp16 memory keys with the Triton kernel
  (``memory_topk``), synchronised (the ids reach the CPU);
- one **learner step** = ``PlannerLearner.step`` on a Qwen3-8B-shaped stack (``num_layers`` deep, rank-64
  LoRA, 8 sequences of ``seq_len`` tokens), in a thread of this process or, as the serving process runs
  it by default (``learner.process = "spawn"``), in a spawned process of its own with its own CUDA
  context (``learner/process.py``): the searches then share neither the GIL nor a context with it.
  ``measure_all`` measures the learner process and, for comparison, the in-process thread.

Phases: searches alone, learner steps alone, then both at once (searches run back to back until the
learner's steps end). Goals on a GPU, for the learner in its own process: search p99 under the learner
<= 1.5x idle, its max <= 30 ms, and a learner step <= 1.1x its time alone.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from ..config.learner import LearnerProcessKind
from ..devices import bind_device, bind_thread
from .random_stack import grpo_samples, random_stack

MINILM = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536,
          "vocab_size": 30522}
NUM_QUERIES = 8
QUERY_TOKENS = 32
MAX_P99_RATIO = 1.5
MAX_SEARCH_S = 0.030
MAX_STEP_RATIO = 1.1


class Latencies(msgspec.Struct, frozen=True):
    """Seconds of each timed call."""

    seconds: list[float]

    @property
    def p50(self) -> float:
        return statistics.median(self.seconds)

    @property
    def p99(self) -> float:
        ordered = sorted(self.seconds)
        return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]

    @property
    def max(self) -> float:
        return max(self.seconds)


class Contention(msgspec.Struct, frozen=True):
    """One variant's measurements: searches and learner steps, alone and together."""

    streams: str
    """``priority`` (bound as the serving process binds them) or ``default`` (GPU's shared default stream)."""
    search_alone: Latencies
    search_under_learner: Latencies
    step_alone: Latencies
    step_under_searches: Latencies
    learner: LearnerProcessKind = "thread"
    """Where the learner stepped: ``spawn`` (a process of its own) or ``thread`` (this process)."""

    def summary(self) -> str:
        a, b = self.search_alone, self.search_under_learner
        return (f"{self.streams} streams: search p50 {a.p50 * 1e3:.1f} -> {b.p50 * 1e3:.1f} ms, p99 "
                f"{a.p99 * 1e3:.1f} -> {b.p99 * 1e3:.1f} ms, max {a.max * 1e3:.1f} -> {b.max * 1e3:.1f} ms "
                f"({len(b.seconds)} searches); learner step {self.step_alone.p50:.2f} -> "
                f"{self.step_under_searches.p50:.2f} s ({self.step_ratio:.2f}x), learner "
                f"{'in its own process' if self.learner == 'spawn' else 'in a thread'}")

    @property
    def step_ratio(self) -> float:
        return self.step_under_searches.p50 / self.step_alone.p50

    def misses(self) -> list[str]:
        """The goals this variant misses (empty: all met)."""
        alone, under = self.search_alone, self.search_under_learner
        missed = []
        if under.p99 > MAX_P99_RATIO * alone.p99:
            missed.append(f"search p99 {under.p99 / alone.p99:.2f}x idle (goal <= {MAX_P99_RATIO:g}x)")
        if under.max > MAX_SEARCH_S:
            missed.append(f"search max {under.max * 1e3:.0f} ms (goal <= {MAX_SEARCH_S * 1e3:.0f} ms)")
        if self.step_ratio > MAX_STEP_RATIO:
            missed.append(f"learner step {self.step_ratio:.2f}x alone (goal <= {MAX_STEP_RATIO:g}x)")
        return missed


def measure_all(device: str, **sizes: Any) -> list[Contention]:
    """The learner in its own process (as the serving process runs it), then in a thread of this process
    for comparison: with the priority streams and, on a GPU, on the shared default stream."""
    rows = [measure(device, process="spawn", **sizes), measure(device, process="thread", **sizes)]
    if device != "cpu":
        rows.append(measure(device, use_streams=False, process="thread", **sizes))
    return rows


def measure(device: str, *, num_keys: int, num_layers: int, seq_len: int, shape: dict, num_steps: int = 2,
            num_idle_searches: int = 50, use_streams: bool = True,
            process: LearnerProcessKind = "thread") -> Contention:
    """Build the searcher and the learner on ``device`` (each in its own bound thread, or the learner in a
    process of its own: ``process``) and time them."""
    serving = ThreadPoolExecutor(1, thread_name_prefix="contention-search",
                                 initializer=_binder(device, "serving", use_streams))
    # a learner process binds its own device and stream: this thread only waits on its pipe
    learning = ThreadPoolExecutor(1, thread_name_prefix="contention-learner", initializer=None
                                  if process == "spawn" else _binder(device, "learning", use_streams))
    with tempfile.TemporaryDirectory(prefix="mia-contention-") as tmp, serving, learning:
        search = serving.submit(_searcher, device, num_keys).result()
        step, stop = learning.submit(_learner_step, Path(tmp), device, shape, num_layers, seq_len, process).result()
        try:
            learning.submit(step).result()  # warm-up: optimizer state, kernels' first compile
            serving.submit(search).result()
            search_alone = Latencies(serving.submit(_timed_calls, search, num_idle_searches).result())
            step_alone = Latencies(learning.submit(_timed_calls, step, num_steps).result())
            under, steps = _together(serving, learning, search, step, num_steps)
        finally:
            stop()
    return Contention("priority" if use_streams else "default", search_alone, Latencies(under), step_alone,
                      Latencies(steps), process)


def _binder(device: str, priority: str, use_streams: bool) -> Callable[[], None]:
    if use_streams:
        return lambda: bind_thread(device, priority)  # type: ignore[arg-type]

    def device_only() -> None:
        bind_device(device)

    return device_only


def _together(serving: ThreadPoolExecutor, learning: ThreadPoolExecutor, search: Callable[[], None],
              step: Callable[[], None], num_steps: int) -> tuple[list[float], list[float]]:
    """Searches back to back on the serving thread for as long as the learner takes its steps."""
    is_done = threading.Event()

    def searches() -> list[float]:
        times = []
        while not is_done.is_set():
            times += _timed_calls(search, 1)
        return times

    under = serving.submit(searches)
    try:
        steps = learning.submit(_timed_calls, step, num_steps).result()
    finally:
        is_done.set()
    return under.result(), steps


def _timed_calls(fn: Callable[[], None], num_calls: int) -> list[float]:
    times = []
    for _ in range(num_calls):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return times


def _searcher(device: str, num_keys: int) -> Callable[[], None]:
    """One agent-shaped search: encode NUM_QUERIES queries, score them against the keys, read the ids."""
    import torch
    from transformers import BertConfig, BertModel

    from mia_kernels.memory_score import memory_topk

    from ..config.memory import ScoreWeights

    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        encoder = BertModel(BertConfig(**MINILM), add_pooling_layer=False).to(dtype).eval()
        keys = torch.nn.functional.normalize(torch.randn(num_keys, MINILM["hidden_size"]), dim=1).to(dtype)
        usage = torch.randint(0, 20, (num_keys,)).float()
        success = torch.floor(usage * torch.rand(num_keys))
        labels = (torch.rand(num_keys) < 0.5).to(torch.int8)
        tokens = torch.randint(0, MINILM["vocab_size"], (NUM_QUERIES, QUERY_TOKENS))
    weights = ScoreWeights()

    @torch.no_grad()
    def search() -> None:
        hidden = encoder(input_ids=tokens).last_hidden_state  # (Q, T, H)
        query = torch.nn.functional.normalize(hidden.float().mean(dim=1), dim=1)  # (Q, H)
        result = memory_topk(query, None, None, keys, None, usage, success, labels, 4, weights)
        result.ids.tolist()  # synchronises: the search is done when its ids reach the CPU

    return search


def _learner_step(folder: Path, device: str, shape: dict, num_layers: int, seq_len: int,
                  process: LearnerProcessKind) -> tuple[Callable[[], None], Callable[[], None]]:
    """One GRPO step of a random Qwen3-8B-shaped stack (the doctor's ``grpo`` check's model and batch), in
    this thread or in a learner process (``process``); and what stops that process."""
    import torch

    from ..config.learner import LearnerConfig
    from ..learner.learner import PlannerLearner
    from ..learner.process import LearnerProcess

    shape = {**shape, "num_hidden_layers": num_layers, "model_type": "qwen3", "tie_word_embeddings": False,
             "torch_dtype": "bfloat16"}
    base, adapter = random_stack(folder, shape, device)
    if process == "spawn" and device.startswith("cuda"):
        torch.cuda.empty_cache()  # the stack was built here: its weights live in the learner's process only
    # num_threads 0: the learner process keeps torch's thread count, as a thread of this process does
    config = LearnerConfig(device=device, dtype="float32" if device == "cpu" else "bfloat16", micro_batch_size=1,
                           gradient_checkpointing=True, process=process, num_threads=0)
    learner = (LearnerProcess if process == "spawn" else PlannerLearner)(base, adapter, config,
                                                                       publish_dtype=torch.bfloat16)
    samples = grpo_samples(shape["vocab_size"], seq_len)

    def step() -> None:
        result = learner.step(samples)  # a learner process answers once its step is done on the GPU
        if device.startswith("cuda") and process == "thread":
            torch.cuda.current_stream().synchronize()
        if not result.is_accepted:
            raise RuntimeError(f"the learner's step was rejected: {result.reason}")

    return step, learner.close if isinstance(learner, LearnerProcess) else lambda: None
