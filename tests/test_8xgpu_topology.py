"""The 8-GPU topology (configs/8xgpu.toml) as a whole, on CPU: ``configs/8xgpu_cpu.toml`` mirrors it role for
role and engine for engine with the tiny models, and a real server started with it answers text and image
``mia`` questions with learning on until a new Planner adapter version is loaded on every data-parallel
replica of the Planner's engine."""

from __future__ import annotations

import collections
import fnmatch
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from mia_engine.agent.answer_match import normalize_answer
from mia_engine.config import MIAConfig, load_config, resolve_role
from tests.conftest import ServerHandle, _openai, server_fixture, start_server
from tests.server.test_image_inputs import data_url, encoded

CONFIGS = Path(__file__).parents[1] / "configs"  # this checkout's
GPU_CONFIG = str(CONFIGS / "8xgpu.toml")
CPU_CONFIG = str(CONFIGS / "8xgpu_cpu.toml")

ALLOWED_DIFFERENCES = {
    "engines.*.model": "the tiny models stand in for the paper's (the VL engine's is the tiny VL model)",
    "engines.*.devices": "no GPUs",
    "engines.*.enforce_eager": "no CUDA graphs on a CPU (compiling would only slow the start)",
    "engines.*.max_model_len": "the tiny models' context",
    "engines.*.max_lora_rank": "the tiny adapters' rank",
    "engines.*.cpu.kv_cache_space_gib": "seven tiny model workers share one machine's memory",
    "engines.*.structured_outputs_backend": "the tiny models write JSON only under compact_json (xgrammar)",
    "engines.*.compact_json": "the tiny models write JSON only under compact_json",
    "roles.planner.adapter": "the tiny model's embedded Planner adapter (presence is compared separately)",
    "server.host": "loopback: the CPU mirror needs no keys",
    "gpus.*": "the hardware the dry run plans for",
    "memory.score_device": "CPU",
    "memory.embedder.device": "CPU",
    "tools.embedder.device": "CPU",
    "learner.device": "CPU",
    "learner.lr": "a few tiny-model updates must be visible",
    "learner.batch_size": "a few questions publish",
    "tools.max_passages": "a slice of the corpus, built in seconds",
    "agent.supervised_judge": "the tiny judge grades every answer correct: rewards would never differ",
    "agent.structured_executor": "the random Executor writes a parseable turn only under structured outputs",
    "agent.force_final_answer": "the random Executor never stops searching by itself: the cap's last turn answers",
    **{f"agent.{field}": "the tiny models' budgets (configs/tiny.toml)" for field in (
        "max_turns", "replan_max_turns", "min_tool_calls", "tool_response_max_words", "trace_max_words",
        "summary_max_words", "sampling.*", "regex.*")},
}
"""Fields in which the CPU mirror may differ from 8xgpu.toml, with the reason: only device and model size."""


def flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """A config as ``{"engines.qwen3-8b.model": ..., ...}``: every leaf under its dotted path."""
    if isinstance(value, dict):
        items: dict[str, Any] = {}
        for key, child in value.items():
            items.update(flat(child, f"{prefix}{key}."))
        return items
    return {prefix.rstrip("."): value}


def differences(gpu: MIAConfig, cpu: MIAConfig) -> dict[str, tuple[Any, Any]]:
    """Every dotted field whose value differs (a field only one side has differs from a missing one)."""
    a, b = flat(msgspec.to_builtins(gpu)), flat(msgspec.to_builtins(cpu))
    missing = "<absent>"
    return {k: (a.get(k, missing), b.get(k, missing)) for k in sorted(a.keys() | b.keys())
            if a.get(k, missing) != b.get(k, missing)}


def unexplained(gpu: MIAConfig, cpu: MIAConfig) -> list[str]:
    """Differences no allow-list entry covers, and structure that must match whatever the values."""
    found = [f"{path}: {gpu_value!r} in 8xgpu.toml, {cpu_value!r} here"
             for path, (gpu_value, cpu_value) in differences(gpu, cpu).items()
             if not any(fnmatch.fnmatchcase(path, pattern) for pattern in ALLOWED_DIFFERENCES)]
    for name in gpu.roles.keys() & cpu.roles.keys():
        if bool(gpu.roles[name].adapter) != bool(cpu.roles[name].adapter):
            found.append(f"roles.{name}.adapter: present in one config only")
    for config, where in ((gpu, "8xgpu.toml"), (cpu, "the mirror")):
        planner_engine = config.engines.get(config.roles["planner"].engine)
        if planner_engine is None or planner_engine.data_parallel_size < 2:
            found.append(f"the Planner's engine has no data-parallel replicas in {where}")
    return found


@pytest.fixture(scope="module")
def configs() -> tuple[MIAConfig, MIAConfig]:
    return load_config(GPU_CONFIG), load_config(CPU_CONFIG)


def test_the_cpu_config_mirrors_8xgpu_but_for_device_and_size(configs) -> None:
    gpu, cpu = configs
    assert unexplained(gpu, cpu) == []
    stale = [p for p in ALLOWED_DIFFERENCES if not any(fnmatch.fnmatchcase(d, p) for d in differences(gpu, cpu))]
    assert stale == [], "allowed differences that no longer differ: drop them from the list"


@pytest.mark.parametrize("override", [
    {"engines.qwen3-14b.model": "embedded:tiny"},            # an engine only the mirror has
    {"roles.reviewer.alias_of": "manager"},                  # a role only the mirror has
    {"roles.executor.engine": "qwen3-32b"},                  # a role on another engine
    {"roles.judge.alias_of": "planner"},                     # an alias of another role
    {"roles.planner.adapter": ""},                           # an adapter dropped
    {"engines.qwen3-8b.data_parallel_size": 2},              # fewer Planner replicas
    {"engines.qwen2_5-vl-7b.data_parallel_size": 1},         # the Executor without replicas
    {"engines.qwen3-32b.tensor_parallel_size": 1},           # the judge unsharded
    {"engines.qwen3-32b.data_parallel_size": 2},             # the judge replicated
    {"engines.qwen3-8b.routing": "load"},
    {"engines.qwen2_5-vl-7b.language_model_only": True},
    {"engines.qwen3-32b.enable_lora": True},
    {"agent.roles.captioner": "manager"},
    {"learner.gradient_checkpointing": False},
], ids=lambda o: next(iter(o)))
def test_the_mirror_check_catches_a_topology_change(configs, override: dict[str, Any]) -> None:
    gpu, _ = configs
    assert unexplained(gpu, load_config(CPU_CONFIG, override)) != []


# ---- the topology, started and learning ----------------------------------------------------------------------

MAX_LEARNING_QUESTIONS = 24
"""The random tiny models' groups sometimes answer alike for several batches (no learning signal); a batch
takes a few seconds, and the loop ends at the first published version."""
PUBLISH_TIMEOUT_S = 120


TOPOLOGY_START_S = 1200
"""The topology's start: 15 vLLM processes (3 + 2 + 1 engine cores, 7 model workers, 2 data-parallel
coordinators), a few minutes alone on 2 cores, far longer on shared ones."""

own_server = server_fixture("own_server", lambda factory: start_server(factory.mktemp("topology"), CPU_CONFIG),
                            alone=True, timeout_s=TOPOLOGY_START_S)
"""The topology's server (named as conftest's ``own_server``, so a failure report carries its log)."""


def _planner_versions(server: ServerHandle) -> list[dict]:
    response = httpx.get(f"{server.openai_url}/adapters", headers={"Authorization": f"Bearer {server.api_key}"},
                         timeout=30)
    assert response.status_code == 200, response.text
    return [a for a in response.json()["data"] if a["role"] == "planner"]


def _live(server: ServerHandle) -> dict:
    (live,) = [a for a in _planner_versions(server) if a["is_live"]]
    return live


def _metrics(server: ServerHandle, name: str) -> dict[str, float]:
    """``name``'s samples by their first label's value."""
    samples = {}
    for line in httpx.get(f"{server.base_url}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + "{"):
            samples[line.split('"')[1]] = float(line.split()[-1])
    return samples


def _num_updates(server: ServerHandle) -> float:
    """Learner updates so far, published or rejected."""
    return sum(_metrics(server, "mia_learner_updates_total").values())


def _gold_word(answers: list[str]) -> str:
    """The word closest to occurring in half of ``answers``: graded by string match against it, a group
    answered like these most likely has rewards that differ, so an update has a signal to learn from."""
    words = [set(normalize_answer(a).split()) for a in answers if a]
    counts = collections.Counter(w for ws in words for w in ws)
    return min(counts, key=lambda w: (abs(counts[w] - len(words) / 2), w), default="unknown")


def _question(i: int) -> list[dict]:
    if i % 2:
        return [{"role": "user", "content": f"Which city is on river number {i}?"}]
    image = data_url(encoded(size=(90, 70), colour=(30 * i % 256, 120, 200)))
    return [{"role": "user", "content": [{"type": "text", "text": "Which tower is this?"},
                                         {"type": "image_url", "image_url": {"url": image}}]}]


@pytest.mark.slow
@pytest.mark.timeout(TOPOLOGY_START_S + 300)  # the server's start (the fixture) counts
def test_text_and_image_questions_learn_until_every_planner_replica_serves_the_new_version(own_server) -> None:
    admin = _openai(own_server, 300, own_server.admin_key)
    config = load_config(CPU_CONFIG)
    replicas = list(range(config.engines[config.roles["planner"].engine].data_parallel_size))  # 8xgpu.toml's 3
    first = _live(own_server)
    assert first["loaded_replicas"] == replicas and first["num_replicas"] == len(replicas), first

    probe = admin.chat.completions.create(model="mia", messages=_question(1), extra_body={
        "rollouts": 4, "return_trace": True})
    answers = [r["final_answer"] for r in probe.model_extra["mia"]["rollouts"]]

    captions, num_updates = [], _num_updates(own_server)
    for i in range(MAX_LEARNING_QUESTIONS):
        gold = _gold_word(answers)
        out = admin.chat.completions.create(model="mia", messages=_question(i), extra_body={
            "learn": True, "ground_truth": [gold], "rollouts": 4, "return_trace": True})
        trace = out.model_extra["mia"]
        answers += [r["final_answer"] for r in trace["rollouts"]]
        if i % 2 == 0:
            captions.append(trace["caption"])
            continue
        num_updates += 1  # learner.batch_size = 2: this question completed a batch
        deadline = time.monotonic() + PUBLISH_TIMEOUT_S
        while _num_updates(own_server) < num_updates and time.monotonic() < deadline:
            time.sleep(0.5)
        if (live := _live(own_server))["version"] > first["version"]:
            break

    assert live["version"] > first["version"], f"no update was published (gold {gold!r}, answers {answers[-8:]})"
    assert live["loaded_replicas"] == replicas and live["num_replicas"] == len(replicas), live
    assert captions and all(isinstance(c, str) and c.strip() for c in captions), captions
    # every engine of the topology answered: the Planner's, the VL one (Executor, captioner), the judge's
    requests = _metrics(own_server, "mia_role_requests_total")
    served = {name if name in config.engines else resolve_role(config, name)[1].engine
              for name, count in requests.items() if count > 0}
    assert served == set(config.engines), str(requests)
    # the replaced version is unloaded once its requests are done
    deadline = time.monotonic() + 30
    while len(_planner_versions(own_server)) > 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert [a["version"] for a in _planner_versions(own_server)] == [live["version"]]
