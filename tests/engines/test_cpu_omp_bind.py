"""The cores of a tensor-parallel engine's model workers on vLLM's CPU platform (``engines/cpu/spawn.py``):
vLLM's own binding gives each worker a NUMA node and refuses to start with fewer nodes than workers, so
the engine is started with an explicit binding there (the 8-GPU mirror's judge, tensor-parallel 2 on one
socket: ``tests/test_8xgpu_topology.py`` starts it)."""

from __future__ import annotations

import pytest

from mia_engine.config import EngineConfig, load_config
from mia_engine.engines.cpu.spawn import OMP_BIND_ENV, host_cores, omp_threads_bind, spawn_env


def engine(tp: int = 1, dp: int = 1, pp: int = 1) -> EngineConfig:
    return EngineConfig(model="m", tensor_parallel_size=tp, data_parallel_size=dp, pipeline_parallel_size=pp)


@pytest.mark.parametrize(("config", "cores", "bind"), [
    (engine(tp=2), [0, 1], "0|1"),                           # a core each, none left over
    (engine(tp=2, dp=2), [0, 1], "0|1|0|1"),                  # every replica the same slices
    (engine(tp=2), list(range(8)), "0,1,2|4,5,6"),            # each worker's last core left to the schedulers
    (engine(tp=2, pp=2), list(range(8)), "0|2|4|6"),
    (engine(tp=3), [0, 1], "0|1|0"),                          # more workers than cores: they take turns
    (engine(tp=2), [4, 6], "4|6"),                            # the cores this process may use, not 0..n
], ids=["2-cores", "dp2", "8-cores", "tp2-pp2", "3-on-2", "affinity"])
def test_each_worker_of_a_replica_gets_its_own_slice_of_one_node(config, cores, bind) -> None:
    assert omp_threads_bind(config, cores, 1) == bind


@pytest.mark.parametrize(("config", "num_numa_nodes"), [(engine(), 1), (engine(dp=3), 1), (engine(tp=2), 2)],
                         ids=["one-worker", "replicas-of-one-worker", "a-node-per-worker"])
def test_vllm_binds_what_it_can_itself(config, num_numa_nodes: int) -> None:
    assert omp_threads_bind(config, [0, 1, 2, 3], num_numa_nodes) == ""


def test_the_mirror_judge_starts_with_its_workers_bound_and_an_operator_binding_stands(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OMP_BIND_ENV, raising=False)
    engines = load_config("8xgpu_cpu").engines
    cores, num_numa_nodes = host_cores()
    judge = spawn_env(engines["qwen3-32b"], 128).get(OMP_BIND_ENV, "")
    assert judge == omp_threads_bind(engines["qwen3-32b"], cores, num_numa_nodes)
    assert (judge.count("|") == 1) == (num_numa_nodes < 2)  # two workers, bound here unless vLLM can
    assert OMP_BIND_ENV not in spawn_env(engines["qwen3-8b"], 128)  # data-parallel replicas of one worker
    monkeypatch.setenv(OMP_BIND_ENV, "nobind")
    assert OMP_BIND_ENV not in spawn_env(engines["qwen3-32b"], 128)
