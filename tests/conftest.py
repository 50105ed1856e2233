"""Session fixtures: one real server (tiny model, real vLLM engine) shared by every test that needs it."""

from __future__ import annotations

import asyncio.selector_events
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.processes import free_port, stop_process

API_KEY = "test-api-key-not-secret"
ADMIN_KEY = "test-admin-key-not-secret"
START_TIMEOUT_S = 600
TINY_INDEX_DIR: Path | None = None
"""One passage-index folder for every tiny-config server of the test session (set by ``_tiny_index_dir``):
the first start builds it, the others load it instead of encoding the corpus again. Index building
itself is tested by ``tests/tools`` and the embedded default's first start."""


@pytest.fixture(scope="session", autouse=True)
def _tiny_index_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    global TINY_INDEX_DIR
    TINY_INDEX_DIR = tmp_path_factory.mktemp("tiny_index")
    yield
    TINY_INDEX_DIR = None


@dataclass
class ServerHandle:
    base_url: str
    api_key: str
    process: subprocess.Popen
    log_path: Path
    home: Path
    data_dir: Path
    admin_key: str = ""
    """The admin key it was started with; empty: the one it generates (``generated_admin_key``)."""
    health_before_ready: list[httpx.Response] = field(default_factory=list)

    @property
    def openai_url(self) -> str:
        return f"{self.base_url}/v1"

    def generated_admin_key(self) -> str:
        """The admin key ``serve`` generated at first start, where it was given none."""
        return (self.data_dir / "admin_api_key").read_text().strip()

    def log_tail(self, num_lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])


def start_server(tmp: Path, config: str, *extra: str, api_key: str = API_KEY, admin_key: str = ADMIN_KEY,
                 data_dir: Path | None = None, host: str = "127.0.0.1", own_group: bool = False) -> ServerHandle:
    """Launch ``python -m mia_engine serve`` exactly as a user would, on a loopback address and a free port
    (the admin key through its environment variable, as an operator would keep it out of ``ps``).
    ``own_group``: its own process group (engine processes included), for tests that signal or kill the
    group; in this session, not a new one: Linux schedules each session as one group of its own
    (autogroup), and a kernel where a busy engine's session then held the other sessions off both cores
    for seconds froze the test's client mid-stream."""
    port = free_port()
    home, data = tmp / "home", data_dir or tmp / "data"
    log_path = tmp / "server.log"
    env = {k: v for k, v in os.environ.items() if k not in ("MIA_API_KEY", "MIA_ADMIN_API_KEY")}
    env.update({"MIA_HOME": str(home), "PYTHONUNBUFFERED": "1"})
    if admin_key:
        env["MIA_ADMIN_API_KEY"] = admin_key
    cmd = [sys.executable, "-m", "mia_engine", "serve", "--config", config, "--host", host,
           "--port", str(port), "--data-dir", str(data), *extra]
    if api_key:
        cmd += ["--api-key", api_key]
    if config == "tiny" and TINY_INDEX_DIR is not None and not any(a.startswith("--tools.index_dir") for a in extra):
        cmd.append(f"--tools.index_dir={TINY_INDEX_DIR}")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                process_group=0 if own_group else None)
    connect = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # a wildcard bind is reached on loopback
    return ServerHandle(f"http://{connect}:{port}", api_key, proc, log_path, home, data, admin_key)


def wait_ready(server: ServerHandle, timeout_s: float = START_TIMEOUT_S) -> None:
    """Poll /health until 200; keep the answers seen before (503 while the engines start)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log_tail()}")
        try:
            response = httpx.get(f"{server.base_url}/health", timeout=5)
        except httpx.TransportError:
            time.sleep(0.5)
            continue
        if response.status_code == 200:
            return
        server.health_before_ready.append(response)
        time.sleep(0.5)
    raise TimeoutError(f"server not ready after {timeout_s} s:\n{server.log_tail()}")


def stop_server(server: ServerHandle) -> None:
    stop_process(server.process)


def scrape_metrics(server: ServerHandle) -> list[Sample]:
    """Every sample the server's ``/metrics`` serves now."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=30,
                     headers={"Authorization": f"Bearer {server.api_key}"}).text
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


TRIM_INTERVAL_S = 2
"""The shared server's ``server.malloc_trim_interval_s``."""


def _serve_tiny(tmp: Path, *extra: str, own_group: bool = False) -> Iterator[ServerHandle]:
    """A tiny-model server for the fixture's scope (``extra``: its command-line overrides;
    ``own_group``: as for ``start_server``)."""
    server = start_server(tmp, "tiny", *extra, own_group=own_group)
    try:
        wait_ready(server)
        yield server
    finally:
        stop_server(server)


def _openai(server: ServerHandle, timeout: float, api_key: str | None = None):
    from openai import OpenAI

    return OpenAI(base_url=server.openai_url, api_key=api_key or server.api_key, max_retries=0, timeout=timeout)


def _async_openai(server: ServerHandle):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=server.openai_url, api_key=server.api_key, max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def wiki_passages() -> dict[str, str]:
    """The default corpus's passage texts by title (the dev and popularity sets check their answers in them)."""
    from bench.make_devset import wiki_entries

    return {title: entry["extract"] for title, entry in wiki_entries().items()}


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """The shared server: tests may add requests and memories, never change adapters or weights. It trims
    its heap every 2 s (60 by default), so every test that watches its event loop's lag runs beside trims."""
    yield from _serve_tiny(tmp_path_factory.mktemp("tiny_server"), f"--server.malloc_trim_interval_s={TRIM_INTERVAL_S}")


@pytest.fixture(scope="session")
def openai_client(tiny_server: ServerHandle):
    return _openai(tiny_server, 120)


@pytest.fixture(scope="session")
def admin_openai_client(tiny_server: ServerHandle):
    """For requests in the admin scope (``learn: true``)."""
    return _openai(tiny_server, 300, tiny_server.admin_key)


@pytest.fixture
async def async_openai_client(tiny_server: ServerHandle):
    """One per test, closed when it ends. Never leave an async client to the garbage collector: openai's
    finaliser schedules ``aclose()`` on whatever loop runs then, while asyncio's transport finalisers have
    already closed the sockets; the late close then unregisters fd numbers that new connections got
    meanwhile, and their answers are never read (bench/HISTORY.md, "6. Admission under load")."""
    async with _async_openai(tiny_server) as client:
        yield client


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """A server of the module's own, for tests that publish adapters or learn (what they change
    would otherwise reach every later test through the shared server)."""
    yield from _serve_tiny(tmp_path_factory.mktemp("own_server"))


@pytest.fixture(scope="session")
def public_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """A keyed server bound to 0.0.0.0, as deployed, with small admission bounds (2 running and 8 queued per
    key) so an overflow is cheap to provoke; for the Host and queue-bound tests."""
    bounds = ("--server.admission.max_queued_per_key=8", "--server.admission.max_concurrent_research=2",
              "--server.admission.max_concurrent_per_model=2")
    server = start_server(tmp_path_factory.mktemp("public_server"), "tiny", *bounds, host="0.0.0.0")
    try:
        wait_ready(server)
        yield server
    finally:
        stop_server(server)


@pytest.fixture(scope="module")
def own_openai_client(own_server: ServerHandle):
    return _openai(own_server, 120)


@pytest.fixture
async def own_async_openai_client(own_server: ServerHandle):
    """One per test, closed when it ends, as ``async_openai_client``."""
    async with _async_openai(own_server) as client:
        yield client


@pytest.fixture(scope="module")
def own_admin_openai_client(own_server: ServerHandle):
    return _openai(own_server, 300, own_server.admin_key)


@pytest.fixture(scope="session")
def _foreign_reader_removals() -> Iterator[list[str]]:
    """Watches asyncio's reader removals for one transport unregistering an fd another live transport
    owns (its own socket closed behind it, the number reused): that connection's answer would sit unread
    and its request wait out its timeout. Such a removal is skipped (the stale transport's socket is
    gone, so there is nothing of its own to remove) and recorded: the test it happened in fails, naming
    both transports, instead of waiting."""
    removals: list[str] = []
    loop_class = asyncio.selector_events.BaseSelectorEventLoop
    remove_reader = loop_class._remove_reader

    def watched(loop: asyncio.selector_events.BaseSelectorEventLoop, fd: int) -> bool:
        caller = sys._getframe(1).f_locals.get("self")
        owner = loop._transports.get(fd)  # type: ignore[attr-defined]
        if isinstance(caller, asyncio.Transport) and owner is not None and caller is not owner:
            removals.append(f"fd {fd} of {owner!r} unregistered by another transport, {caller!r}")
            return False
        return remove_reader(loop, fd)

    loop_class._remove_reader = watched  # type: ignore[method-assign]
    yield removals
    loop_class._remove_reader = remove_reader  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _no_foreign_reader_removal(_foreign_reader_removals: list[str]) -> Iterator[None]:
    yield
    found, _foreign_reader_removals[:] = list(_foreign_reader_removals), []
    if found:
        pytest.fail("a connection lost its reader to another transport (an async client left to the "
                    f"garbage collector?): {found[:3]}")


SERVER_FIXTURES = ("tiny_server", "own_server")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failed test that used a server gets the server's log tail in its report: what the server saw
    (requests finished, engine errors) is the other half of a client-side timeout."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for name in SERVER_FIXTURES:
        if name not in getattr(item, "fixturenames", ()):  # fixturenames holds the indirect ones too
            continue
        server = item._request.getfixturevalue(name)  # type: ignore[attr-defined]  # still set up here
        if isinstance(server, ServerHandle) and server.log_path.exists():
            report.sections.append((f"{name} log (last 80 lines)", server.log_tail(80)))
