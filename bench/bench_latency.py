"""The low-latency path near its floor: one ``mia`` question with ``rollouts = 1``, end to end over HTTP,
against the sum of the LLM and tool calls on its critical path, each replayed alone on the idle engine.

    python bench/bench_latency.py --questions 16 --repeats 3 --out bench/results/latency.json

The server runs in this process (the real app, uvicorn, on 127.0.0.1) so its engine calls can be
recorded: every ``generate`` of the research loop (its role, prompt token ids, sampling options) and
every tool call. After each question, the prefix cache is reset and the recorded calls are replayed one
by one, in order, straight into the engine (and the tool): the first replayed call starts cold, as the
question did (the cache is reset before it too), later ones find the prefix cache warmed by the
replayed earlier turns, as in the real run. With G = 1 every call is on the critical path. Each
question is asked and replayed ``--repeats`` times (greedy: the same calls each time), and the ratio
of the medians

    overhead = wall time at the client / (replayed LLM calls + replayed tool calls)

is what orchestration, HTTP, SSE, detokenisation, memory retrieval and scheduling add (goal: <= 1.10).
A single sample of each side is not enough on a shared 2-core CPU: the model's time for the same calls
varies by about 15 % from run to run, in both directions (ratios below 0.9 were seen). The in-run
ratio, wall time / the time the same question's calls took inside it, measures the same overhead
without a replay.
A streamed request of the same question gives time to first event and time to the answer.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.servers import free_port  # noqa: E402
from bench.results_io import Result  # noqa: E402
from bench.stats import percentile, report  # noqa: E402
from mia_engine.cli import dotted_overrides  # noqa: E402
from mia_engine.config import load_config  # noqa: E402
from mia_engine.engines.client import SamplingOptions  # noqa: E402
from mia_engine.server.app import build_app  # noqa: E402
from mia_engine.services import Services  # noqa: E402
from mia_engine.tools.registry import ToolContext  # noqa: E402

QUESTIONS = ["Which river flows through Paris?", "Who wrote Pride and Prejudice?", "What is the capital of Sweden?",
             "Who composed The Magic Flute?", "Where is the Suez Canal?", "Who painted Las Meninas?",
             "When was the Hermitage Museum founded?", "Who directed Battleship Potemkin?"]


class RecordingClient:
    """The engine interface of the research loop, recording each ``generate`` of every role (for the replay)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[str, list[int], SamplingOptions, dict]] = []
        self.each_s: list[float] = []
        """Each recorded call's own time as it ran (in the question, not replayed), to compare call by
        call with its replay."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def role(self, name: str) -> RecordingRole:
        return RecordingRole(self, self.inner.role(name))


class RecordingRole:
    """One role's handle whose ``generate`` calls are recorded on the client."""

    def __init__(self, client: RecordingClient, inner: Any) -> None:
        self.client = client
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def generate(self, prompt_ids: list[int], options: SamplingOptions, request_id: str, *,
                       stream: bool, **extra: Any) -> AsyncIterator[Any]:
        self.client.calls.append((self.inner.name, list(prompt_ids), options, extra))
        start = time.perf_counter()
        try:
            async for deltas in self.inner.generate(prompt_ids, options, request_id, stream=stream, **extra):
                yield deltas
        finally:
            self.client.each_s.append(time.perf_counter() - start)


class RecordingTools:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[Any, str, int]] = []
        self.seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def call(self, call: Any, context: ToolContext, *, max_words: int) -> Any:
        self.calls.append((call, context.data_id, max_words))
        start = time.perf_counter()
        try:
            return await self.inner.call(call, context, max_words=max_words)
        finally:
            self.seconds += time.perf_counter() - start


async def reset_prefix_caches(services: Services) -> None:
    """Drop every engine's cached KV blocks through vLLM's public ``AsyncLLM.reset_prefix_cache``, so a replay
    starts cold, as the question it replays did. Reached through the engine's private handle on purpose:
    resetting the cache is a measurement's need, not something the server offers."""
    for engine in services.roles.engines.values():
        await engine._llm.reset_prefix_cache()


async def replay(services: Services, client: RecordingClient, tools: RecordingTools) -> tuple[list[float], float]:
    """(seconds of each recorded LLM call, of the tool calls), each run alone, in order, prefix cache reset."""
    await reset_prefix_caches(services)
    llm = []
    for i, (model, prompt_ids, options, extra) in enumerate(client.calls):
        start = time.perf_counter()
        async for _ in services.roles.role(model).generate(prompt_ids, options, f"replay-{i}-{time.time_ns()}",
                                                           stream=False, **extra):
            pass
        llm.append(time.perf_counter() - start)
    tool = 0.0
    for call, data_id, max_words in tools.calls:
        start = time.perf_counter()
        await tools.inner.call(call, ToolContext(data_id), max_words=max_words)
        tool += time.perf_counter() - start
    return llm, tool


async def wait_ready(http: httpx.AsyncClient, serving: asyncio.Future) -> None:
    while not serving.done():
        try:
            if (await http.get("/health")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.5)
    serving.result()  # the server exited: raise its error
    raise RuntimeError("the server exited before it was ready")


async def ask(http: httpx.AsyncClient, question: str) -> tuple[float, dict[str, float]]:
    """(wall time at the client, the loop's stage timings) of one question."""
    start = time.perf_counter()
    response = await http.post("/v1/chat/completions", json={
        "model": "mia", "messages": [{"role": "user", "content": question}], "rollouts": 1, "return_trace": True})
    response.raise_for_status()
    return time.perf_counter() - start, response.json()["mia"]["timings"]


async def ask_streaming(http: httpx.AsyncClient, question: str) -> tuple[float, float]:
    """(time to the first event, time to the answer) of a streamed question."""
    start = time.perf_counter()
    first = None
    async with http.stream("POST", "/v1/chat/completions", json={
            "model": "mia", "messages": [{"role": "user", "content": question}], "rollouts": 1,
            "stream": True}) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data:") and first is None:
                first = time.perf_counter() - start
    return first or 0.0, time.perf_counter() - start


async def measure(services: Services, http: httpx.AsyncClient, client: RecordingClient, tools: RecordingTools,
                  question: str, repeats: int) -> dict[str, Any]:
    """One question asked ``repeats`` times and its calls replayed as often, each from a reset prefix cache
    (greedy: the same calls every time); medians on both sides, so one noisy sample of the model's
    time on a shared CPU moves neither."""
    walls, llm_alone, tools_alone, in_run, llm_in_run = [], [], [], [], []
    each_in_run, each_alone = [], []
    stages: dict[str, float] = {}
    for _ in range(repeats):
        client.calls.clear()
        client.each_s.clear()
        tools.calls.clear()
        tools.seconds = 0.0
        await reset_prefix_caches(services)
        wall, stages = await ask(http, question)
        walls.append(wall)
        llm_in_run.append(sum(client.each_s))
        in_run.append(llm_in_run[-1] + tools.seconds)
        num_llm, num_tool = len(client.calls), len(tools.calls)
        roles = [model for model, *_ in client.calls]
        each, tool = await replay(services, client, tools)
        each_in_run.append(list(client.each_s))
        each_alone.append(each)
        llm_alone.append(sum(each))
        tools_alone.append(tool)
    client.calls.clear()
    tools.calls.clear()
    first_event, answered = await ask_streaming(http, question)
    wall, llm, tool = statistics.median(walls), statistics.median(llm_alone), statistics.median(tools_alone)
    return {"wall_s": wall, "llm_alone_s": llm, "tools_alone_s": tool, "overhead": wall / (llm + tool),
            "in_run_overhead": statistics.median(w / c for w, c in zip(walls, in_run)),
            "num_llm_calls": num_llm, "num_tool_calls": num_tool, "llm_in_run_s": statistics.median(llm_in_run),
            "walls_s": walls, "llm_alone_runs_s": llm_alone, "stream_first_event_s": first_event,
            "stream_answer_s": answered, "stages_s": stages,
            "calls": [{"role": role, "in_run_s": statistics.median(run[i] for run in each_in_run),
                       "alone_s": statistics.median(run[i] for run in each_alone)}
                      for i, role in enumerate(roles)] if len({len(r) for r in each_in_run}) == 1 else []}


async def main_async(args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="mia-latency-bench-"))
    port = free_port()
    config = load_config(args.config, {"data_dir": str(tmp), "server.port": port, **dotted_overrides(args.set)})
    services = Services(config)
    app = build_app(services.app_parts(start=services.start))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    serving = asyncio.ensure_future(server.serve())
    rows: list[dict[str, float]] = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=900) as http:
        await wait_ready(http, serving)
        agent = services.agent.agent
        client, tools = RecordingClient(agent.client), RecordingTools(agent.runner.tools)
        agent.client = agent.runner.client = client
        agent.runner.tools = tools
        await ask(http, "Warm-up: which river flows through Rome?")
        for question in (QUESTIONS * args.questions)[:args.questions]:
            rows.append(await measure(services, http, client, tools, question, args.repeats))
            row = rows[-1]
            print(f"{question[:40]:40s} wall {row['wall_s']:6.2f} s  llm {row['llm_alone_s']:6.2f} s "
                  f"({row['num_llm_calls']} calls)  tools {row['tools_alone_s']:5.3f} s ({row['num_tool_calls']})  "
                  f"overhead {row['overhead']:.3f}  in-run {row['in_run_overhead']:.3f}  "
                  f"stream first {row['stream_first_event_s']:.3f} s", flush=True)
    server.should_exit = True
    await serving
    call_ratios = [c["in_run_s"] / c["alone_s"] for r in rows for c in r["calls"]]
    return {
        "config": args.config, "questions": len(rows), "repeats": args.repeats,
        "overhead_median": statistics.median(r["overhead"] for r in rows),
        "overhead_p90": percentile([r["overhead"] for r in rows], 0.9),
        "overhead_max": max(r["overhead"] for r in rows),
        "in_run_overhead_median": statistics.median(r["in_run_overhead"] for r in rows),
        "in_run_overhead_max": max(r["in_run_overhead"] for r in rows),
        "wall_median_s": statistics.median(r["wall_s"] for r in rows),
        "critical_path_median_s": statistics.median(r["llm_alone_s"] + r["tools_alone_s"] for r in rows),
        "stream_first_event_median_s": statistics.median(r["stream_first_event_s"] for r in rows),
        "stream_answer_median_s": statistics.median(r["stream_answer_s"] for r in rows),
        # Each LLM call's time inside its question over its time replayed alone (medians of the repeats):
        # near 1 says the calls themselves run as fast in the question, whatever the whole ratio shows.
        "call_in_run_over_alone_median": statistics.median(call_ratios) if call_ratios else None,
        "call_in_run_over_alone_p90": percentile(call_ratios, 0.9) if call_ratios else None,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3,
                        help="times each question is asked and its calls replayed (medians of both)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="--KEY=VALUE",
                        help="config override, e.g. --set=--tools.index_dir=/path")
    args = parser.parse_args()
    result = Result("latency")
    summary = asyncio.run(main_async(args))
    for index, row in enumerate(summary.pop("rows")):  # one run per question (its repeats' medians)
        result.add_run(question_index=index, **row)
    report(summary, args.out, result=result, args=args)


if __name__ == "__main__":
    main()
