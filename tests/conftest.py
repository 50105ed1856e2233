"""Session fixtures: one real server (tiny model, real vLLM engine) shared by every test that needs it."""

from __future__ import annotations

import asyncio.selector_events
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
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

    def admin_post(self, path: str, body: dict | None = None) -> httpx.Response:
        """``POST /v1<path>`` with ``body`` as JSON under the admin key."""
        return httpx.post(f"{self.openai_url}{path}", json=body or {}, timeout=300,
                          headers={"Authorization": f"Bearer {self.admin_key}"})

    def generated_admin_key(self) -> str:
        """The admin key ``serve`` generated at first start, where it was given none."""
        return (self.data_dir / "admin_api_key").read_text().strip()

    def log_tail(self, num_lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])


def start_server(tmp: Path, config: str | None, *extra: str, api_key: str = API_KEY, admin_key: str = ADMIN_KEY,
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
    cmd = [sys.executable, "-m", "mia_engine", "serve", *(["--config", config] if config else []), "--host", host,
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


HEALTH_POLL_S = 0.2


def wait_ready(server: ServerHandle, timeout_s: float = START_TIMEOUT_S) -> None:
    """Poll /health until 200; keep the answers seen before (503 while the engines start)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log_tail()}")
        try:
            response = httpx.get(f"{server.base_url}/health", timeout=5)
        except httpx.TransportError:
            time.sleep(HEALTH_POLL_S)
            continue
        if response.status_code == 200:
            return
        server.health_before_ready.append(response)
        time.sleep(HEALTH_POLL_S)
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


# ---- the servers of fixtures: started two at a time, stopped in the background ------------------------------
#
# A server's start is ~20 s of one core importing (the server, then vLLM's engine core, then its worker, one
# after the other), and its stop ~4 s of mostly waiting. So the first fixture server a test needs starts the
# next one the run will need too (in the order of the collected tests), both at once on the two cores, and
# a fixture server's stop runs in the background while the next tests run (all are waited for at the end of
# the session). A server started early idles until its fixture hands it out; its tests see the same server.
# A test that starts a server of its own (a restart on the same data) starts the next one beside it the same
# way (``wait_ready_beside_next``), and a session's server stops once its last test has run.

Launch = Callable[..., ServerHandle]
"""Starts a fixture's server (``start_server``) in a fresh folder of the factory's, without waiting for it:
``launch(tmp_path_factory, **needs)``, the values of the fixtures it needs by name."""


@dataclass
class _ServerFixture:
    name: str
    launch: Launch
    scope: str
    timeout_s: float
    needs: tuple[str, ...]
    """Fixtures the launch takes: one that needs any is started by its own fixture only, never ahead."""
    alone: bool
    """Started by its own fixture only, with no other (a server of many engines: two at once would hold the
    memory of both)."""


_SERVER_FIXTURES: dict[str, _ServerFixture] = {}
"""By fixture name (several modules may define the same name; each definition is one entry of ``_RUN``)."""
_RUN: list[tuple[_ServerFixture, str]] = []
"""(fixture, instance key) of every fixture server the collected tests use, in the order they first do."""
_STARTED: dict[str, tuple[ServerHandle | None, BaseException | None]] = {}
"""Servers started ahead of their fixture, by instance key: (the server, or the error its start raised)."""
_STOPPING: list[threading.Thread] = []
_FIRST_USE: dict[str, int] = {}
"""By instance key: the index in the session's items of the first test that uses it."""
_LAST_USE: dict[str, int] = {}
"""By instance key: the index in the session's items of the last test that uses it."""
_SERVING: dict[str, ServerHandle] = {}
"""The session's fixture servers handed out and not stopped yet, by instance key."""
_ITEM_INDEX: dict[str, int] = {}
"""By node id: the test's index in the session's items."""
_RUNNING: list[pytest.Item] = []
"""The test running now (set up last), for ``wait_ready_beside_next``."""


def _instance_key(fixture: _ServerFixture, scope_node_id: str) -> str:
    """``scope_node_id``: the node the fixture's value belongs to (the session's is "", a module's or a test's
    is its node id)."""
    return f"{fixture.name}@{scope_node_id}@{id(fixture)}"


def server_fixture(name: str, launch: Launch, *, scope: str = "module", timeout_s: float = START_TIMEOUT_S,
                   needs: tuple[str, ...] = (), alone: bool = False):
    """A ``scope`` fixture ``name`` serving the server ``launch`` starts, ready, and stopped after its last test."""
    fixture = _ServerFixture(name, launch, scope, timeout_s, needs, alone)

    def serve(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
        key = _instance_key(fixture, request.node.nodeid)
        server, error = _STARTED.pop(key, (None, None))
        try:
            if error is not None:
                raise error
            if server is None:
                server = fixture.launch(tmp_path_factory, **{n: request.getfixturevalue(n) for n in fixture.needs})
                partner = None if fixture.alone else _start_partner(key)
                _wait_together(server, fixture.timeout_s, partner, tmp_path_factory)
            else:
                wait_ready(server, fixture.timeout_s)  # started ahead: ready already, unless it died since
            if fixture.scope == "session":
                _SERVING[key] = server
            yield server
        finally:
            _SERVING.pop(key, None)
            if server is not None:
                _stop_in_background(server)

    serve._mia_server_fixture = fixture  # type: ignore[attr-defined]
    _SERVER_FIXTURES[name] = fixture
    return pytest.fixture(scope=scope, name=name)(serve)


def _start_partner(key: str) -> tuple[str, _ServerFixture] | None:
    """The next fixture server of the run after ``key``'s that is not started yet and may be, if any (marked
    as started)."""
    keys = [k for _, k in _RUN]
    return _next_to_start(keys.index(key) + 1) if key in keys else None


def _next_to_start(first: int) -> tuple[str, _ServerFixture] | None:
    """The first fixture server of ``_RUN[first:]`` that is not started yet and may be, if any (marked as
    started)."""
    for fixture, other in _RUN[first:]:
        if other not in _STARTED and not fixture.needs and not fixture.alone:
            _STARTED[other] = (None, None)
            return other, fixture
    return None


def wait_ready_beside_next(server: ServerHandle, timeout_s: float = START_TIMEOUT_S) -> None:
    """``wait_ready`` for a server a test starts itself (a restart on the same data, say), while the next
    fixture server the run will need starts beside it on the other core, as a fixture server's partner does;
    returns once both are ready (or the partner's start failed: its fixture raises that)."""
    item = _RUNNING[-1]
    now = _ITEM_INDEX[item.nodeid]
    later = next((i for i, (_, key) in enumerate(_RUN) if _FIRST_USE[key] > now), len(_RUN))
    factory = item.config._tmp_path_factory  # type: ignore[attr-defined]
    _wait_together(server, timeout_s, _next_to_start(later), factory)


def _wait_together(server: ServerHandle, timeout_s: float, partner: tuple[str, _ServerFixture] | None,
                   factory: pytest.TempPathFactory) -> None:
    """``wait_ready`` on the server while its partner starts and gets ready too (each keeps its own 503
    answers); the partner, or the error its start raised, is kept for its fixture. The partner of the
    session's first tiny server starts once that one has built the shared passage index: two encoding it
    at once would each take a core for it."""
    leader_done = threading.Event()
    index = TINY_INDEX_DIR if f"--tools.index_dir={TINY_INDEX_DIR}" in server.process.args else None

    def start_partner(other: str, fixture: _ServerFixture) -> None:
        while index is not None and not any(index.glob("*/meta.json")) and not leader_done.wait(HEALTH_POLL_S):
            pass
        partner_server = None
        try:
            partner_server = fixture.launch(factory)
            wait_ready(partner_server, fixture.timeout_s)
            _STARTED[other] = (partner_server, None)
        except Exception as error:
            _STARTED[other] = (partner_server, error)

    thread = None
    if partner is not None:
        thread = threading.Thread(target=start_partner, args=partner, name=f"start {partner[0]}")
        thread.start()
    try:
        wait_ready(server, timeout_s)
    finally:
        leader_done.set()
        if thread is not None:
            thread.join()


def _stop_in_background(server: ServerHandle) -> None:
    thread = threading.Thread(target=stop_server, args=(server,), name=f"stop {server.base_url}")
    thread.start()
    _STOPPING.append(thread)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The fixture servers of the collected tests, in the order the tests will first use them."""
    _RUN.clear()
    _FIRST_USE.clear()
    _LAST_USE.clear()
    _ITEM_INDEX.clear()
    seen = set()
    for index, item in enumerate(session.items):
        _ITEM_INDEX[item.nodeid] = index
        module = item.getparent(pytest.Module)
        for name in getattr(item, "fixturenames", ()):
            definitions = item._fixtureinfo.name2fixturedefs.get(name)  # type: ignore[attr-defined]
            command = getattr(definitions[-1].func, "_mia_command", None) if definitions else None
            if command is not None:
                command.wanted = True
            fixture = getattr(definitions[-1].func, "_mia_server_fixture", None) if definitions else None
            if fixture is None:
                continue
            node = {"session": "", "module": module.nodeid if module is not None else "", "function": item.nodeid}
            key = _instance_key(fixture, node[fixture.scope])
            if key not in seen:
                seen.add(key)
                _RUN.append((fixture, key))
                _FIRST_USE[key] = index
            _LAST_USE[key] = index


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the servers and commands started ahead whose tests never ran, and wait for every stop."""
    for server, _ in list(_STARTED.values()):
        if server is not None:
            _stop_in_background(server)
    _STARTED.clear()
    for command in _COMMANDS.values():
        command.stop()
    for thread in _STOPPING:
        thread.join()
    _STOPPING.clear()


# ---- commands started ahead -----------------------------------------------------------------------------
#
# A command-line test (``eval``, ``run``, ``ttl``) is a subprocess of a minute or more, mostly one core's work:
# it may start with an earlier module's first test, beside that module's own (the machine's second core), and
# its test then checks what it wrote. It runs as it would in its own test: same arguments, its own folders.


@dataclass
class CommandRun:
    """A finished command: ``folder`` (its own, for its files) and its completed process (text output)."""

    folder: Path
    result: subprocess.CompletedProcess


@dataclass
class _Command:
    name: str
    make: Callable[[Path], tuple[list[str], dict[str, str]]]
    start_with: str
    timeout_s: float
    wanted: bool = False
    folder: Path | None = None
    process: subprocess.Popen | None = None
    started: float = 0.0

    def start(self, factory: pytest.TempPathFactory) -> None:
        self.folder = factory.mktemp(self.name)
        args, env = self.make(self.folder)
        with open(self.folder / "stdout", "wb") as stdout, open(self.folder / "stderr", "wb") as stderr:
            self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env)
        self.started = time.monotonic()

    def wait(self) -> CommandRun:
        assert self.folder is not None and self.process is not None
        try:
            self.process.wait(timeout=max(1.0, self.started + self.timeout_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        result = subprocess.CompletedProcess(self.process.args, self.process.returncode,
                                             (self.folder / "stdout").read_text(errors="replace"),
                                             (self.folder / "stderr").read_text(errors="replace"))
        return CommandRun(self.folder, result)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


_COMMANDS: dict[str, _Command] = {}


def command_fixture(name: str, make: Callable[[Path], tuple[list[str], dict[str, str]]], *, start_with: str,
                    timeout_s: float):
    """A module fixture ``name``: the ``CommandRun`` of ``make(folder)`` (its arguments and environment), started
    ahead with the first test of the module ``start_with`` (a node id) where that module runs first (empty: with
    the session's first test)."""
    command = _Command(name, make, start_with, timeout_s)
    _COMMANDS[name] = command

    def run(tmp_path_factory: pytest.TempPathFactory) -> CommandRun:
        if command.process is None:
            command.start(tmp_path_factory)
        return command.wait()

    run._mia_command = command  # type: ignore[attr-defined]
    return pytest.fixture(scope="module", name=name)(run)


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """A session's fixture server stops once the last test that uses it has run, so that the later tests get
    its memory and cores back (its fixture's own stop, at the session's end, then finds it stopped)."""
    index = _ITEM_INDEX.get(item.nodeid)
    for key in [k for k in _SERVING if _LAST_USE.get(k) == index]:
        _stop_in_background(_SERVING.pop(key))


def pytest_runtest_setup(item: pytest.Item) -> None:
    _RUNNING[:] = [item]
    for command in _COMMANDS.values():
        if command.wanted and command.process is None and (not command.start_with
                                                           or item.nodeid.startswith(command.start_with + "::")):
            command.start(item.config._tmp_path_factory)  # type: ignore[attr-defined]


THREAD_LEARNER = "--learner.process=thread"
"""The test-time learner as a thread of the serving process instead of a spawned process of its own (which
imports torch and peft in one more interpreter, a few seconds of a core at every start), for servers whose
tests do not look at the learner's process: the learner's steps and publishes are the same either way. The
default (a learner process) is what the learning, adapter, learner-restart, mirror and ``serve MODEL`` tests
run."""

SERVING_ONLY = ("--engines.tiny.executor_backend=uni", THREAD_LEARNER)
"""For the servers of modules that test the serving process (HTTP, keys, limits, logs, research settings, the
memory journal), not vLLM's processes: the model runs inside the engine-core process, so a start imports vLLM
in two interpreters instead of three (about a quarter less of a core's time, and ~0.7 GiB less memory), and
the learner is a thread (``THREAD_LEARNER``). The tiny config's own layout (a model worker, its placement and
teardown) is what the shared servers and the engine, adapter, learning and lifecycle tests run."""


def launch_tiny(folder: str, *extra: str, **options) -> Launch:
    """Launches a tiny-model server in a fresh folder ``folder`` with ``extra`` overrides (``options``: as for
    ``start_server``)."""
    return lambda factory: start_server(factory.mktemp(folder), "tiny", *extra, **options)


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


tiny_server = server_fixture(
    "tiny_server", launch_tiny("tiny_server", f"--server.malloc_trim_interval_s={TRIM_INTERVAL_S}",
                               "--server.admission.bound_loopback_clients=false"), scope="session")
"""The shared server: tests may add requests and memories, never change adapters or weights. It trims
its heap every 2 s (60 by default), so every test that watches its event loop's lag runs beside trims.
Its loopback clients are not bound per client: ``test_admission``'s load test is one client sending 768
requests at once, more than ``max_concurrent_per_client`` (the bound has tests of its own)."""


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
    meanwhile, and their answers are never read (bench/history/HISTORY.md, "6. Admission under load")."""
    async with _async_openai(tiny_server) as client:
        yield client


own_server = server_fixture("own_server", launch_tiny("own_server"))
"""A server of the module's own, for tests that publish adapters or learn (what they change
would otherwise reach every later test through the shared server)."""

public_server = server_fixture("public_server", launch_tiny(
    "public_server", "--server.admission.max_queued_per_key=8", "--server.admission.max_concurrent_research=2",
    "--server.admission.max_concurrent_per_model=2", "--server.access_log=true", THREAD_LEARNER, host="0.0.0.0"),
    scope="session")
"""A keyed server bound to 0.0.0.0, as deployed, with small admission bounds (2 running and 8 queued per
key) so an overflow is cheap to provoke, and its access log on; for the Host, queue-bound and log-line tests."""


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failed test that used a server gets the server's log tail in its report: what the server saw
    (requests finished, engine errors) is the other half of a client-side timeout."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for name in _SERVER_FIXTURES:
        if name not in getattr(item, "fixturenames", ()):  # fixturenames holds the indirect ones too
            continue
        server = item._request.getfixturevalue(name)  # type: ignore[attr-defined]  # still set up here
        if isinstance(server, ServerHandle) and server.log_path.exists():
            report.sections.append((f"{name} log (last 80 lines)", server.log_tail(80)))
