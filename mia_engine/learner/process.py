"""The Planner's learner in a process of its own (``learner.process = "spawn"``).

``LearnerProcess`` has the surface of ``PlannerLearner`` that the test-time learner uses (``step``,
``save_adapter``, ``load_adapter_weights``, ``token_logprobs``, ``lora_state``, ``version``,
``adapter_num_bytes``), each call forwarded to a child process started with multiprocessing's ``spawn``:
a separate interpreter (its own GIL) and, on a GPU, its own CUDA context on the learner's device, so a
GRPO step never holds the lock or the stream that the serving process's memory searches wait for.

The child builds the ``PlannerLearner``, binds its thread to the learner's device and a low-priority
stream (``devices.bind_thread``), and answers one call at a time over a pipe; arguments, results and
exceptions travel pickled (an exception is re-raised here with its own type where it pickles, its
traceback attached as a note). The calls block, like ``PlannerLearner``'s: the test-time learner makes
them on its dedicated thread, never on the event loop. A child that dies (killed, out of memory, a
crash) makes its call, and every later one, raise ``LearnerDied``; the caller starts a fresh one.

The child lives as long as its parent wants it: it stops when the pipe closes (``close``), dies with
its parent (``base.parent_watch``, watched before torch is imported), and ignores SIGINT and SIGTERM,
which a Ctrl-C or a service stop sends to the whole process group: the serving process, stopping, closes
it, and a learner that vanished under it then would look like one that died.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import traceback
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ..base.heap_trim import trim_heap
from ..base.logs import JsonFormatter, configure
from ..base.parent_watch import PARENT_PID_ENV, watch_parent
from ..config.learner import LearnerConfig
from ..devices import bind_thread

if TYPE_CHECKING:  # the child imports them once its parent is watched
    import torch

    from .batching import GRPOSample
    from .learner import PlannerLearner
    from .step_result import StepResult

PROCESS_NAME = "mia-learner"
"""The child's name (``ps``, ``top``, ``psutil.Process.name()``)."""
STOP_TIMEOUT_S = 5.0
"""How long ``close`` waits for the child to stop after its pipe closed (it finishes a call first) before
it sends SIGKILL."""


class LearnerDied(RuntimeError):
    """The learner's process ended before answering (killed, out of memory, a crash); ``exitcode`` is its
    exit status (negative: the signal that ended it; None: unknown)."""

    def __init__(self, message: str, exitcode: int | None = None) -> None:
        super().__init__(message)
        self.exitcode = exitcode


class LearnerProcess:
    """A ``PlannerLearner`` in a spawned child process; blocking calls, one at a time, from one thread."""

    def __init__(self, base_dir: Path, adapter_dir: Path, config: LearnerConfig = LearnerConfig(),
                 publish_dtype: torch.dtype | None = None) -> None:
        """Start the child and wait until its learner is built (as ``PlannerLearner(...)`` would take); the
        child's error (a bad adapter folder) is raised here, ``LearnerDied`` if it died while loading."""
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(
            target=serve_learner, name=PROCESS_NAME, daemon=True,
            args=(child_conn, os.getpid(), Path(base_dir), Path(adapter_dir), msgspec.to_builtins(config),
                  None if publish_dtype is None else str(publish_dtype).removeprefix("torch."), _log_setup()))
        self._process.start()
        child_conn.close()  # the child's end lives in the child only: its death is an EOF here
        self._died: LearnerDied | None = None
        self.pending: str | None = None
        """The call the child is answering now (None: idle)."""
        try:
            self.adapter_num_bytes, self._version = self._receive()
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self._process.pid or 0

    @property
    def sentinel(self) -> int:
        """A file descriptor that turns readable once the child has ended."""
        return self._process.sentinel

    @property
    def version(self) -> int:
        """The learner's version (``PlannerLearner.version``), as of its latest answer."""
        return self._version

    @version.setter
    def version(self, value: int) -> None:
        self._call("set_version", value)

    def step(self, samples: list[GRPOSample], policy_version: int | None = None) -> StepResult:
        return self._call("step", samples, policy_version)

    def save_adapter(self, out_dir: Path) -> Path:
        return self._call("save_adapter", Path(out_dir))

    def load_adapter_weights(self, adapter_dir: Path) -> None:
        self._call("load_adapter_weights", Path(adapter_dir))

    def token_logprobs(self, samples: list[GRPOSample]) -> list[torch.Tensor]:
        return self._call("token_logprobs", samples)

    def lora_state(self) -> dict[str, torch.Tensor]:
        """Copies of the LoRA weights, on the CPU."""
        return self._call("lora_state")

    def died(self) -> LearnerDied:
        """Why the child is gone (it must have ended: see ``sentinel``); every later call raises it."""
        if self._died is None:
            self._process.join(STOP_TIMEOUT_S)
            code = self._process.exitcode
            if code is None:  # its pipe broke while it runs: it can answer nothing any more
                self._process.kill()
                self._process.join(STOP_TIMEOUT_S)
                how = "its pipe broke; stopped"
            else:
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
            self._died = LearnerDied(f"the learner's process (pid {self.pid}) died: {how}", code)
            self._conn.close()
        return self._died

    def close(self) -> None:
        """Stop the child: close its pipe, then SIGKILL if it has not ended within ``STOP_TIMEOUT_S``."""
        self._conn.close()
        self._process.join(STOP_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(STOP_TIMEOUT_S)
        if self._died is None:
            self._died = LearnerDied(f"the learner's process (pid {self.pid}) was stopped", self._process.exitcode)

    def _call(self, method: str, *args: Any) -> Any:
        if self._died is not None:
            raise self._died
        self.pending = method
        try:
            try:
                self._conn.send_bytes(pickle.dumps((method, args), protocol=pickle.HIGHEST_PROTOCOL))
            except OSError as err:  # BrokenPipeError, ConnectionResetError: the child is gone
                raise self.died() from err
            result, self._version = self._receive()
        finally:
            self.pending = None
        return result

    def _receive(self) -> tuple[Any, int]:
        """The child's answer to the call sent: (result, the learner's version after it)."""
        try:
            if self._conn not in wait([self._conn, self._process.sentinel]):  # ended with nothing to read
                raise self.died()
            data = self._conn.recv_bytes()  # an answer sent just before the end still counts
        except (EOFError, OSError) as err:
            raise self.died() from err
        is_ok, payload, version = pickle.loads(data)
        if not is_ok:
            raise payload
        return payload, version


# ----- the child --------------------------------------------------------------------------------------


def serve_learner(conn: Connection, parent_pid: int, base_dir: Path, adapter_dir: Path, raw_config: dict[str, Any],
                  publish_dtype: str | None, log_setup: tuple[str, str]) -> None:
    """The child's main: build the learner, then answer calls until the parent closes the pipe. The config
    comes by field name, not pickled by position: a fresh child imports the code installed now."""
    watch_parent({PARENT_PID_ENV: str(parent_pid)})  # its own mapping: outside ``serve`` too
    for stop in (signal.SIGINT, signal.SIGTERM):  # sent to the whole group: the parent stops this one
        signal.signal(stop, signal.SIG_IGN)
    _name_process(PROCESS_NAME)
    configure(*log_setup, environ={})
    config = msgspec.convert(raw_config, LearnerConfig)
    bind_thread(config.device, "learning")
    import torch
    from tqdm import tqdm

    from .learner import PlannerLearner

    # tqdm's default lock (the model's loading bars) is a multiprocessing semaphore, which a killed child
    # leaves to the resource tracker to unlink (a "leaked semaphore" warning at the server's exit)
    tqdm.set_lock(threading.RLock())
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    try:
        dtype = getattr(torch, publish_dtype) if publish_dtype else None
        learner = PlannerLearner(base_dir, adapter_dir, config, dtype)
    except Exception as err:
        _answer(conn, False, _portable(err), 0)
        return
    _answer(conn, True, learner.adapter_num_bytes, learner.version)
    while True:
        try:
            request = conn.recv_bytes()
        except EOFError:  # the parent closed the pipe: stop
            _exit_now()
        _handle(conn, learner, request)


def _handle(conn: Connection, learner: PlannerLearner, request: bytes) -> None:
    """Answer one pickled ``(method, args)`` call, then trim the heap after the calls that end a burst."""
    method = ""
    try:
        method, args = pickle.loads(request)
        _answer(conn, True, _run(learner, method, args), learner.version)
    except Exception as err:
        _answer(conn, False, _portable(err), learner.version)
    if method in HEAP_TRIMMED_AFTER:
        trim_heap()


HEAP_TRIMMED_AFTER = frozenset({"step", "token_logprobs"})
"""Calls after which the child gives glibc's free pages back to the system (``base.heap_trim``), once it has
answered: a batch's activations and log-prob chunks are freed at its end, and glibc would keep their pages
resident for the next batch's reuse, so the process's RSS would ratchet up to its largest batch yet. The
serving process trims its own heap on a timer (``server.malloc_trim_interval_s``), which a learner thread
shares; this process has no event loop, and trims where its bursts end."""


def _run(learner: PlannerLearner, method: str, args: tuple) -> Any:
    if method == "set_version":
        (learner.version,) = args
        return None
    if method == "lora_state":  # on the CPU: a CUDA tensor would open a CUDA context in the parent
        return {key: value.cpu() for key, value in learner.lora_state().items()}
    if method in ("step", "save_adapter", "load_adapter_weights", "token_logprobs"):
        return getattr(learner, method)(*args)
    raise ValueError(f"the learner's process has no call {method!r}")


def _answer(conn: Connection, is_ok: bool, payload: Any, version: int) -> None:
    try:
        data = pickle.dumps((is_ok, payload, version), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as err:  # a result that does not pickle is the call's failure
        data = pickle.dumps((False, _portable(err), version), protocol=pickle.HIGHEST_PROTOCOL)
    conn.send_bytes(data)


def _portable(err: Exception) -> Exception:
    """``err`` with its traceback as a note, if it survives pickling; else a RuntimeError naming it."""
    err.add_note("in the learner's process:\n" + "".join(traceback.format_exception(err)).rstrip())
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:
        portable = RuntimeError(f"{type(err).__name__}: {err}")
        portable.__notes__ = list(err.__notes__)
        return portable


def _exit_now() -> None:
    """Exit without the interpreter's teardown, which takes seconds with torch loaded (the learner holds
    nothing to clean up: its adapters are written atomically), once the logs are out."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            continue
    os._exit(0)


def _log_setup() -> tuple[str, str]:
    """This process's log level and format (text or json), for the child to log as it does."""
    root = logging.getLogger()
    is_json = any(isinstance(handler.formatter, JsonFormatter) for handler in root.handlers)
    return logging.getLevelName(root.getEffectiveLevel()), "json" if is_json else "text"


def _name_process(name: str) -> None:
    """Name the process as ``ps`` and ``top`` show it (Linux; elsewhere nothing)."""
    if sys.platform == "linux":
        try:
            ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME
        except (OSError, AttributeError):
            pass
