"""Research throughput at G = 4: the one-process engine vs a reference-topology baseline.

    python bench/bench_research.py --questions 16 --rounds 2 --out bench/results/research.json

* ours: ``Services`` in this process (the serving path without its HTTP front): every role call goes
  straight to the engine, questions run concurrently, the G rollouts of a question run concurrently,
  tool calls of all trajectories are micro-batched.
* reference topology: the same research loop and components deployed the way the reference runs
  them: every LLM call is an HTTP request to an OpenAI server (our server, in its own process, on
  the same tiny model), one question at a time, the G rollouts one after another, one search per
  call (no batching). Its requests carry the same structured-output constraints (vLLM's
  ``structured_outputs`` extension), so both sides write the same kind of turns. Memory stays in-process (the reference's /memory service is an HTTP hop too, so
  this flatters the baseline slightly).
Both use configs/tiny.toml, alternate round by round, and answer the same questions.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.servers import launch_mia  # noqa: E402
from bench.stats import percentile, report  # noqa: E402
from mia_engine.agent.loop import ResearchAgent, ResearchRequest  # noqa: E402
from mia_engine.agent.rollout import RolloutRunner  # noqa: E402
from mia_engine.cli import dotted_overrides  # noqa: E402
from mia_engine.config import load_config  # noqa: E402
from mia_engine.engines.client import CompletionDelta, SamplingOptions  # noqa: E402
from mia_engine.memory.service import MemoryService  # noqa: E402
from mia_engine.services import Services  # noqa: E402
from mia_engine.tools.registry import Tools  # noqa: E402
from mia_engine.tools.search import LocalSearch  # noqa: E402


class HttpRoles:
    """The engine interface over HTTP, one request per LLM call, like the reference's services."""

    def __init__(self, base_url: str, max_model_len: int) -> None:
        self.client = httpx.AsyncClient(base_url=base_url, timeout=600)
        self.max_model_len = max_model_len
        self._messages: dict[int, list[dict[str, str]]] = {}
        self._next = 0

    async def render_chat(self, model: str, messages: list[dict[str, str]]) -> list[int]:
        return [self._keep(messages)]  # the server renders; we only pass a handle along

    async def extend_chat(self, model: str, ids: list[int], user_text: str) -> list[int]:
        return [*ids, self._keep([*self._messages[ids[-1]], {"role": "user", "content": user_text}])]

    def _keep(self, messages: list[dict[str, str]]) -> int:
        self._next += 1
        self._messages[self._next] = messages
        return self._next

    def max_tokens_for(self, model: str, prompt_len: int, requested: int | None) -> int:
        return requested or 256

    async def generate(self, model: str, prompt_ids: list[int], options: SamplingOptions, request_id: str, *,
                       stream: bool):
        messages = self._messages[prompt_ids[-1]]
        body: dict[str, Any] = {"model": model, "messages": messages, "n": options.n,
                                "max_tokens": options.max_tokens, "stop": options.stop or None}
        if options.temperature is not None:
            body["temperature"] = options.temperature
        if options.regex is not None:  # the same constrained turns as ours: the same work per question
            body["structured_outputs"] = {"regex": options.regex}
        elif options.json_schema is not None:
            body["structured_outputs"] = {"json": options.json_schema}
        response = await self.client.post("/v1/chat/completions", json=body)
        response.raise_for_status()
        texts = [(c["index"], c["message"]["content"] or "") for c in response.json()["choices"]]
        # a handle per completion stands in for its tokens, so the Planner's conversation can continue
        yield [CompletionDelta(i, text, 0, token_ids=[self._keep([*messages, {"role": "assistant", "content": text}])])
               for i, text in texts]


class SequentialAgent(ResearchAgent):
    """The reference's loop: one question at a time, and its G rollouts one after another."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._one_question = asyncio.Semaphore(1)
        self.runner = SequentialRunner(self.runner.client, self.runner.tools, self.runner.config)

    async def research(self, request: ResearchRequest, emit=None):
        async with self._one_question:
            return await super().research(request, emit)


class SequentialRunner(RolloutRunner):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._one_rollout = asyncio.Semaphore(1)

    async def run(self, *args: Any, **kwargs: Any):
        async with self._one_rollout:
            return await super().run(*args, **kwargs)


async def run_questions(agent: ResearchAgent, questions: list[str], *, learn: bool, concurrent: bool,
                        rollouts: int) -> tuple[float, list[float]]:
    latencies: list[float] = []

    async def one(q: str) -> None:
        start = time.perf_counter()
        await agent.research(ResearchRequest(q, ["Paris"] if learn else None, rollouts, learn))
        latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    if concurrent:
        await asyncio.gather(*(one(q) for q in questions))
    else:
        for q in questions:
            await one(q)
    return time.perf_counter() - start, latencies


async def main_async(args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="mia-research-bench-"))
    engine_overrides = dotted_overrides(args.engine_set)  # both systems: the same engine settings
    config = load_config("tiny", {"data_dir": str(tmp / "ours"), "learner.batch_size": 4, **engine_overrides})
    ours = Services(config)
    await ours.start()
    server = launch_mia(tmp, "tiny", "--data-dir", str(tmp / "server"), *args.engine_set)
    await asyncio.to_thread(server.wait_ready)
    base_config = load_config("tiny", {"data_dir": str(tmp / "baseline"), "tools.batch_wait_ms": 0.0})
    memory = await MemoryService.open(tmp / "baseline-memory", base_config.memory, encoder=ours.encoders[0])
    search = LocalSearch.from_config(base_config.tools, ours.encoders[0], tmp / "baseline-index", progress=False)
    baseline = SequentialAgent(HttpRoles(server.base_url, 4096), memory, Tools(base_config.tools, local=search),
                               base_config.agent)
    questions = [f"Question {i}: which river flows through the capital city number {i}?" for i in range(args.questions)]
    results: dict[str, dict[str, list]] = {}
    try:
        for round_index in range(args.rounds):
            for learn in (False, True):
                for name, agent, concurrent in (("ours", ours.agent.agent, True), ("reference", baseline, False)):
                    wall, lat = await run_questions(agent, questions, learn=learn, concurrent=concurrent,
                                                    rollouts=args.rollouts)
                    key = f"{name}/learn={'on' if learn else 'off'}"
                    entry = results.setdefault(key, {"qps": [], "lat": []})
                    entry["qps"].append(len(questions) / wall)
                    entry["lat"] += lat
                    print(f"round {round_index} {key}: {len(questions) / wall:.2f} q/s", flush=True)
    finally:
        server.stop()
        search.close()
        await memory.close()
        await ours.stop()
    summary = {k: {"questions_per_s": statistics.median(v["qps"]), "p50_s": statistics.median(v["lat"]),
                   "p99_s": percentile(v["lat"], 0.99)}
               for k, v in results.items()}
    for learn in ("off", "on"):
        summary[f"speedup/learn={learn}"] = (summary[f"ours/learn={learn}"]["questions_per_s"]
                                             / summary[f"reference/learn={learn}"]["questions_per_s"])
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--engine-set", action="append", default=[], metavar="--KEY=VALUE",
                        help="config override for both systems, e.g. --engine-set=--engines.tiny.max_num_seqs=64")
    args = parser.parse_args()
    report(asyncio.run(main_async(args)), args.out, args={k: str(v) for k, v in vars(args).items()})


if __name__ == "__main__":
    main()
