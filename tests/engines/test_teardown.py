"""Waiting for vLLM engine cores that are already tearing down (``engines/teardown.py``), on real
processes: one that restored the default SIGTERM action, as vLLM's engine core does when its busy loop
ends, and one that still handles SIGTERM. The ``AsyncLLM`` is a stand-in holding them (pure logic: what
is waited for, what is left to vLLM's shutdown)."""

from __future__ import annotations

import multiprocessing
import signal
import time
from types import SimpleNamespace

from mia_engine.engines.teardown import await_begun_teardowns, catches_sigterm


def _tearing_down(seconds: float) -> None:
    """Like an engine core past its busy loop: default SIGTERM action, exits by itself after ``seconds``."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    time.sleep(seconds)


def _serving() -> None:
    """Like a running engine core: SIGTERM is handled (here: ends the process cleanly)."""
    signal.signal(signal.SIGTERM, lambda *_: exit(0))
    time.sleep(60)


def _start(target, *args) -> multiprocessing.process.BaseProcess:
    process = multiprocessing.get_context("spawn").Process(target=target, args=args, daemon=True)
    process.start()
    return process


def _handler_set(process, expected: bool) -> None:
    """Wait until the spawned process's SIGTERM disposition is the one its target sets."""
    deadline = time.monotonic() + 30
    while catches_sigterm(process.pid) is not expected:
        assert time.monotonic() < deadline, "the process never set its SIGTERM action"
        time.sleep(0.05)


def _llm(*processes) -> SimpleNamespace:
    resources = SimpleNamespace(engine_manager=SimpleNamespace(processes=list(processes)), engine_dead=False)
    return SimpleNamespace(engine_core=SimpleNamespace(resources=resources))


def test_only_an_engine_core_already_tearing_down_is_waited_for() -> None:
    ending, serving = _start(_tearing_down, 1.0), _start(_serving)
    try:
        _handler_set(serving, True)
        assert catches_sigterm(ending.pid) is False  # (so does an interpreter before its target runs)
        llm = _llm(ending, serving)
        assert await_begun_teardowns(llm, timeout_s=30) == [ending.pid]
        assert ending.exitcode == 0  # it finished by itself, nothing signalled it
        assert serving.is_alive()  # left to vLLM's shutdown, whose SIGTERM it handles
        assert llm.engine_core.resources.engine_dead  # vLLM's monitor takes the exit as expected
    finally:
        for process in (ending, serving):
            process.kill()
            process.join()
    assert catches_sigterm(ending.pid) is None  # gone


def test_the_wait_is_bounded_and_nothing_is_marked_when_none_is_tearing_down() -> None:
    stuck = _start(_tearing_down, 60.0)
    try:
        _handler_set(stuck, False)
        assert await_begun_teardowns(_llm(stuck), timeout_s=0.5) == [stuck.pid]
        assert stuck.is_alive()  # vLLM's shutdown then signals it, as before
    finally:
        stuck.kill()
        stuck.join()
    serving = _start(_serving)
    try:
        _handler_set(serving, True)
        llm = _llm(serving)
        assert await_begun_teardowns(llm, timeout_s=30) == []
        assert not llm.engine_core.resources.engine_dead
        assert await_begun_teardowns(SimpleNamespace(engine_core=None)) == []  # engines run elsewhere
    finally:
        serving.kill()
        serving.join()
