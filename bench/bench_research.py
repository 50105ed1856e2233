"""Research throughput at G = 4: the one-process engine vs the strongest peer and the reference topology.

    python bench/bench_research.py --questions 16 --rounds 2 --out bench/results/research.json
    python bench/bench_research.py --systems ours peer --questions 32 --rounds 3 --out bench/results/research_peer.json

* ours: ``Services`` in this process (the serving path without its HTTP front): every role call goes
  straight to the engine, questions run concurrently, the G rollouts of a question run concurrently,
  tool calls of all trajectories are micro-batched.
* peer (``bench/peer.py``): what a user who outgrows the reference builds: the same loop as asyncio code
  in this process, all questions and rollouts concurrent, searches in batches, every LLM call an HTTP
  request to ``vllm serve`` (the roles as LoRA modules there, the same engine settings, prompts as
  token ids). Its learning: the same GRPO learner, the adapter saved and loaded into ``vllm serve``
  through its runtime LoRA endpoint.
* reference topology: the same research loop and components deployed the way the reference runs
  them: every LLM call is an HTTP request to an OpenAI server (our server, in its own process, on
  the same tiny model), one question at a time, the G rollouts one after another, one search per
  call (no batching). Its requests carry the same structured-output constraints (vLLM's
  ``structured_outputs`` extension), so both sides write the same kind of turns. Memory stays in-process (the reference's /memory service is an HTTP hop too, so
  this flatters the baseline slightly).
All use configs/tiny.toml, alternate round by round, and answer the same questions. After a learning
pass, ours' and the peer's learners finish the updates it queued before the next pass starts; that time
is reported beside the pass (``drain_s``, and ``questions_per_s_with_drain``), not in it.

The peer's ``vllm serve`` gets every engine setting ours gets, our CPU LoRA ops and CPU async scheduling
included (through the platform plugin this package installs into vLLM); ``--peer-cpu-lora-ops vllm`` /
``--peer-cpu-async-scheduling vllm`` give it vLLM's own instead, and the summary names what differs
(``peer_settings_differ``). Each pass is a run of the result file (``bench/results_io.py``) with its cost
per question: prompt and completion tokens (ours: its ``/metrics`` series; the peer: the tokens it sent
and got back; the reference: the server's ``usage``) and the CPU seconds of every process of this
benchmark's tree during the pass (this process, the servers and their engines; ``cpu_s_by_process``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.peer import RolesByName, ServedRoles  # noqa: E402
from bench.servers import launch_mia, launch_vllm  # noqa: E402
from bench.results_io import Result  # noqa: E402
from bench.stats import cpu_spent, metrics_breakdown, percentile, report, tree_cpu_s  # noqa: E402
from mia_engine.agent.loop import ResearchAgent, ResearchRequest  # noqa: E402
from mia_engine.agent.rollout import RolloutRunner  # noqa: E402
from mia_engine.cli import dotted_overrides  # noqa: E402
from mia_engine.config import load_config  # noqa: E402
from mia_engine.engines.client import CompletionDelta, SamplingOptions  # noqa: E402
from mia_engine.learner.ttl import TestTimeLearner, rollout_samples  # noqa: E402
from mia_engine.memory.service import MemoryService  # noqa: E402
from mia_engine.models.cache import default_home  # noqa: E402
from mia_engine.models.embedded import model_dir  # noqa: E402
from mia_engine.base.onednn import bound_this_process  # noqa: E402
from mia_engine.services import Services  # noqa: E402
from mia_engine.tools.registry import Tools  # noqa: E402
from mia_engine.tools.search import LocalSearch  # noqa: E402


class HttpRoles(RolesByName):
    """The engine interface over HTTP, one request per LLM call, like the reference's services."""

    def __init__(self, base_url: str, max_model_len: int) -> None:
        self.client = httpx.AsyncClient(base_url=base_url, timeout=600)
        self.max_model_len = max_model_len
        self._messages: dict[int, list[dict[str, str]]] = {}
        self._next = 0
        self.tokens = {"prompt": 0, "completion": 0}
        """Tokens the server reported (``usage``) so far."""

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
        usage = response.json().get("usage") or {}
        self.tokens["prompt"] += usage.get("prompt_tokens", 0)
        self.tokens["completion"] += usage.get("completion_tokens", 0)
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


async def drain(flush: Any) -> float:
    """Seconds until a system's learner has finished the updates its learning pass queued (``flush``;
    None: nothing to wait for). Untimed in the pass itself, so that they do not run into the next pass,
    whichever system's it is (they did: a peer's learning-off pass right after its learning-on pass
    spent 8-9 CPU s in the agent process instead of 3-4)."""
    if flush is None:
        return 0.0
    start = time.perf_counter()
    await flush()
    return time.perf_counter() - start


async def start_peer(tmp: Path, config: Any, ours: Services, same_cpu_lora_ops: bool,
                     same_cpu_async_scheduling: bool) -> tuple[Any, ...]:
    """``vllm serve`` with runtime LoRA loading, and the concurrent agent over it with its own learner."""
    engine = config.engines["tiny"]
    base = model_dir(engine.model, default_home())
    server = launch_vllm(tmp, base, "tiny", engine, onednn_cache_capacity=config.cpu.onednn_cache_capacity,
                         same_cpu_lora_ops=same_cpu_lora_ops,
                         same_cpu_async_scheduling=same_cpu_async_scheduling,
                         env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    await asyncio.to_thread(server.wait_ready)
    roles = ServedRoles(config, server.base_url, "tiny", base, default_home())
    await roles.start()
    learner = TestTimeLearner(config.learner, roles.adapters, tmp / "peer-adapters" / "planner", "planner")
    await learner.start(base, engine.dtype)

    async def learn(rollouts: list) -> None:
        samples = rollout_samples(rollouts, uuid.uuid4().hex)
        if samples:
            await learner.submit(samples)

    memory = await MemoryService.open(tmp / "peer-memory", config.memory, encoder=ours.encoders[0])
    search = LocalSearch.from_config(config.tools, ours.encoders[0], tmp / "peer-index", progress=False)
    agent = ResearchAgent(roles, memory, Tools(config.tools, local=search), config.agent, on_learn=learn)
    return server, roles, learner, memory, search, agent


async def main_async(args: argparse.Namespace, result: Result) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="mia-research-bench-"))
    engine_overrides = dotted_overrides(args.engine_set)  # every system: the same engine settings
    settings = {"learner.batch_size": 4, **engine_overrides}
    config = load_config(args.config, {"data_dir": str(tmp / "ours"), **settings})
    bound_this_process(config.cpu.onednn_cache_capacity)  # as `serve` does; the peer's agent runs here too
    ours = Services(config)
    await ours.start()
    systems: list[tuple[str, ResearchAgent, bool]] = [("ours", ours.agent.agent, True)]
    drains: dict[str, Any] = {"ours": ours.learner.flush}

    def ours_tokens() -> tuple[float, float]:
        breakdown = metrics_breakdown(ours.metrics.registry)
        return sum(breakdown["prompt_tokens"].values()), sum(breakdown["completion_tokens"].values())

    tokens: dict[str, Any] = {"ours": ours_tokens}  # (prompt, completion) so far, per system
    closers: list[Any] = []
    versions: dict[str, Any] = {"ours": lambda: ours.roles.adapters.current("planner").version}
    try:
        if "peer" in args.systems:
            server, roles, learner, memory, search, agent = await start_peer(
                tmp, load_config(args.config, {"data_dir": str(tmp / "peer"), **settings}), ours,
                args.peer_cpu_lora_ops == "same", args.peer_cpu_async_scheduling == "same")
            closers += [server.stop, search.close, memory.close, learner.close, roles.close]
            systems.append(("peer", agent, True))
            drains["peer"] = learner.flush
            tokens["peer"] = lambda roles=roles: (roles.tokens["prompt"], roles.tokens["completion"])
            versions["peer"] = lambda: roles.adapters.current("planner").version
        if "reference" in args.systems:
            server = launch_mia(tmp, args.config, "--data-dir", str(tmp / "server"), *args.engine_set)
            closers.append(server.stop)
            await asyncio.to_thread(server.wait_ready)
            base_config = load_config(args.config, {"data_dir": str(tmp / "baseline"), "tools.batch_wait_ms": 0.0})
            memory = await MemoryService.open(tmp / "baseline-memory", base_config.memory, encoder=ours.encoders[0])
            search = LocalSearch.from_config(base_config.tools, ours.encoders[0], tmp / "baseline-index",
                                             progress=False)
            closers += [search.close, memory.close]
            http_roles = HttpRoles(server.base_url, 4096)
            systems.append(("reference", SequentialAgent(http_roles, memory, Tools(base_config.tools, local=search),
                                                         base_config.agent), False))
            tokens["reference"] = lambda: (http_roles.tokens["prompt"], http_roles.tokens["completion"])
        questions = [f"Question {i}: which river flows through the capital city number {i}?"
                     for i in range(args.questions)]
        for _, agent, concurrent in systems:  # untimed: the first pass of this process pays one-time costs
            await run_questions(agent, questions[: args.warmup], learn=False, concurrent=concurrent,
                                rollouts=args.rollouts)
        results: dict[str, dict[str, list]] = {}
        for round_index in range(args.rounds):
            for learn in (False, True):
                order = systems if round_index % 2 == 0 else systems[::-1]  # alternate who goes first
                for name, agent, concurrent in order:
                    cpu_before, tokens_before = tree_cpu_s(), tokens[name]()
                    wall, lat = await run_questions(agent, questions, learn=learn, concurrent=concurrent,
                                                    rollouts=args.rollouts)
                    cpu = cpu_spent(cpu_before, tree_cpu_s(), min_s=0.0)
                    prompt, completion = (after - before for after, before in zip(tokens[name](), tokens_before))
                    drain_s = await drain(drains.get(name)) if learn else 0.0
                    key = f"{name}/learn={'on' if learn else 'off'}"
                    entry = results.setdefault(key, {"qps": [], "qps_drained": [], "lat": [], "cpu_s": []})
                    entry["qps"].append(len(questions) / wall)
                    entry["qps_drained"].append(len(questions) / (wall + drain_s))
                    entry["lat"] += lat
                    entry["cpu_s"].append({"wall_s": round(wall, 2), "drain_s": round(drain_s, 2), **cpu})
                    result.add_run(system=name, learn=learn, round=round_index, questions=len(questions),
                                   wall_s=wall, questions_per_s=len(questions) / wall, drain_s=drain_s,
                                   questions_per_s_with_drain=len(questions) / (wall + drain_s),
                                   p50_s=statistics.median(lat), prompt_tokens=prompt, completion_tokens=completion,
                                   prompt_tokens_per_question=prompt / len(questions),
                                   completion_tokens_per_question=completion / len(questions),
                                   cpu_s=sum(cpu.values()), cpu_s_per_question=sum(cpu.values()) / len(questions),
                                   cpu_s_by_process=cpu)
                    print(f"round {round_index} {key}: {len(questions) / wall:.2f} q/s (learner drained in "
                          f"{drain_s:.1f} s after), CPU s by process {cpu}", flush=True)
        published = {name: read() - 1 for name, read in versions.items()}
        breakdown = metrics_breakdown(ours.metrics.registry)
    finally:
        for close in reversed(closers):
            result = close()
            if asyncio.iscoroutine(result):
                await result
        await ours.stop()
    summary: dict[str, Any] = {k: {"questions_per_s": statistics.median(v["qps"]),
                                   "questions_per_s_with_drain": statistics.median(v["qps_drained"]),
                                   "p50_s": statistics.median(v["lat"]),
                                   "p99_s": percentile(v["lat"], 0.99), "cpu_s_by_round": v["cpu_s"]}
                               for k, v in results.items()}
    for other in ("peer", "reference"):
        for learn in ("off", "on"):
            if f"{other}/learn={learn}" in summary:
                summary[f"speedup_vs_{other}/learn={learn}"] = (summary[f"ours/learn={learn}"]["questions_per_s"]
                                                                / summary[f"{other}/learn={learn}"]["questions_per_s"])
        if f"{other}/learn=on" in summary and other in drains:
            summary[f"speedup_vs_{other}/learn=on, with drain"] = (
                summary["ours/learn=on"]["questions_per_s_with_drain"]
                / summary[f"{other}/learn=on"]["questions_per_s_with_drain"])
    summary["adapter_versions_published"] = published
    if "peer" in args.systems:  # the headline says which engine settings the peer did not share
        summary["peer_settings_differ"] = [
            what for what, choice in (("LoRA ops: vLLM's own", args.peer_cpu_lora_ops),
                                      ("async scheduling: off (vLLM's CPU default)", args.peer_cpu_async_scheduling))
            if choice != "same"]
    summary["ours_breakdown"] = breakdown  # every round of ours, from the metrics /metrics serves
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", nargs="+", choices=["peer", "reference"], default=["peer", "reference"],
                        help="what ours is compared with (ours always runs)")
    parser.add_argument("--peer-cpu-lora-ops", choices=["vllm", "same"], default="same",
                        help="the peer's LoRA ops on CPU: ours (same, the default: the peer gets every engine "
                             "setting ours gets) or vLLM's own (what `vllm serve` users get)")
    parser.add_argument("--peer-cpu-async-scheduling", choices=["vllm", "same"], default="same",
                        help="the peer's scheduling on CPU: ours (same, the default; engines.*.cpu_async_scheduling) "
                             "or vLLM's (none ahead: its CPU platform turns async scheduling off, what `vllm serve` "
                             "users get)")
    parser.add_argument("--config", default="tiny",
                        help="configs/tiny.toml's name or a TOML file with the same engine name (tiny)")
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=32, metavar="QUESTIONS",
                        help="an untimed pass of this many questions per system first (0: none): the first "
                             "pass in the process paid one-time costs (encoder kernels, ...) that the "
                             "systems after it were spared")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--engine-set", action="append", default=[], metavar="--KEY=VALUE",
                        help="config override for every system, e.g. --engine-set=--engines.tiny.max_num_seqs=64")
    args = parser.parse_args()
    result = Result("research")
    report(asyncio.run(main_async(args, result)), args.out, result=result, args=args)


if __name__ == "__main__":
    main()
