"""Past one box: an engine on vLLM's Ray executor (docs/DEPLOY_8GPU.md, "Past one box").

vLLM's CPU build has no Ray executor (its CPU platform declares no Ray device), so what runs here is
what the recipe rests on: the config refuses learner folders that the Ray workers on other nodes cannot
read, the dry run budgets the Ray engine on other nodes only and refuses tensor-parallel groups that
would straddle nodes, and the vLLM facts the recipe relies on still hold."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mia_engine.config import ConfigError, load_config
from mia_engine.deploy.budget import plan

FIXTURES = Path(__file__).parent / "fixtures"
CONFIG_8XGPU = str(Path(__file__).parents[2] / "configs" / "8xgpu.toml")
MODELS = {"engines.qwen3-8b.model": str(FIXTURES / "qwen3-8b"),
          "engines.qwen2_5-vl-7b.model": str(FIXTURES / "qwen2_5-vl-7b"),
          "engines.qwen3-32b.model": str(FIXTURES / "qwen3-32b")}
RAY_PLANNER = {"engines.tiny.executor_backend": "ray"}
"""configs/tiny.toml's Planner (it has an adapter, so the learner publishes) on a Ray engine."""


def _tiny(tmp_path: Path, **overrides: object):
    return load_config("tiny", {"data_dir": str(tmp_path / "data"), **overrides})


# --- the learner's folders when the Planner's engine runs on Ray workers on other nodes ---

@pytest.mark.parametrize("overrides, field", [
    ({}, "learner.publish_dir"),  # default: <data_dir>/adapters/published, on this machine
    ({"learner.publish_tmpfs": "/dev/shm"}, "learner.publish_tmpfs"),
    ({"learner.publish_tmpfs": "/dev/shm", "learner.shared_dirs": ["/dev/shm"]}, "learner.publish_tmpfs"),
    ({"learner.publish_dir": "{tmp}/local", "learner.shared_dirs": ["{tmp}/shared"]}, "learner.publish_dir"),
    ({"learner.publish_dir": "{tmp}/shared/published", "learner.shared_dirs": ["{tmp}/shared"]}, "data_dir"),
])
def test_a_ray_planner_engine_refuses_folders_other_nodes_cannot_read(tmp_path: Path, overrides: dict,
                                                                      field: str) -> None:
    overrides = {k: _at(v, tmp_path) for k, v in overrides.items()}
    with pytest.raises(ConfigError) as info:
        _tiny(tmp_path, **RAY_PLANNER, **overrides)
    assert str(info.value).startswith(f"{field}: the Planner's engine tiny runs on Ray workers"), str(info.value)
    assert "learner.shared_dirs" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("overrides", [
    {},  # a local engine: the default folders are fine
    {"learner.publish_tmpfs": "/dev/shm"},
    {**RAY_PLANNER, "roles.planner.adapter": ""},  # no adapter: nothing is learned or published
    {"engines.far.model": "embedded:tiny", "engines.far.executor_backend": "ray", "roles.manager.engine": "far"},
    {**RAY_PLANNER, "data_dir": "{tmp}/shared/data", "learner.shared_dirs": ["{tmp}/shared"]},
    {**RAY_PLANNER, "data_dir": "{tmp}/shared/data", "learner.publish_dir": "{tmp}/nfs/published",
     "learner.shared_dirs": ["{tmp}/shared", "{tmp}/nfs"]},
])
def test_local_engines_and_declared_shared_folders_pass(tmp_path: Path, overrides: dict) -> None:
    assert _tiny(tmp_path, **{k: _at(v, tmp_path) for k, v in overrides.items()})


def test_a_link_to_a_shared_folder_counts_where_it_points(tmp_path: Path) -> None:
    """The memory can stay on a local disk: only ``<data_dir>/adapters`` needs to be on the shared folder."""
    shared = tmp_path / "shared"
    (shared / "adapters").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    overrides = {**RAY_PLANNER, "learner.shared_dirs": [str(shared)]}
    with pytest.raises(ConfigError, match="^learner.publish_dir:"):
        _tiny(tmp_path, **overrides)
    (tmp_path / "data" / "adapters").symlink_to(shared / "adapters")
    assert _tiny(tmp_path, **overrides)


def test_shared_dirs_must_be_absolute(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="learner.shared_dirs must hold absolute paths"):
        _tiny(tmp_path, **{"learner.shared_dirs": ["nfs/mia"]})


def _at(value: object, tmp_path: Path) -> object:
    if isinstance(value, list):
        return [_at(v, tmp_path) for v in value]
    return value.replace("{tmp}", str(tmp_path)) if isinstance(value, str) else value


# --- the dry run of the example in docs/DEPLOY_8GPU.md: the 32B Manager on two other 8-GPU nodes ---

def _plan_ray_manager(**overrides: object):
    ray = {"engines.qwen3-32b.executor_backend": "ray", "engines.qwen3-32b.devices": [],
           "engines.qwen3-32b.tensor_parallel_size": 8, "engines.qwen3-32b.pipeline_parallel_size": 2}
    return plan(load_config(CONFIG_8XGPU, {**MODELS, **ray, **overrides}), Path)


def test_the_ray_engine_is_budgeted_on_other_nodes_only() -> None:
    result = _plan_ray_manager()
    assert [g.gpu for g in result.gpus] == [str(g) for g in range(8)] + ["ray:qwen3-32b"]
    assert not result.gpus[5].claims and not result.gpus[6].claims  # freed; nothing of the Ray engine here
    assert all("qwen3-32b" not in c.owner for g in result.gpus[:8] for c in g.claims)
    assert any("16 GPUs on >= 2 node(s) of 8, none of them this box" in n and "--num-gpus=0" in n
               for n in result.notes)
    assert any(n.endswith(f"reads {FIXTURES / 'qwen3-32b'} at the same path") for n in result.notes)


@pytest.mark.parametrize("tp, pp, per_node, refused", [
    (8, 2, 8, False),
    (2, 4, 6, False),  # 2 divides 6: each pair stays on a node
    (4, 2, 6, True),   # ranks 4-7 would take 2 GPUs of the first node and 2 of the next
    (4, 1, 6, False),  # one node holds the whole replica
    (16, 1, 8, True),
])
def test_tensor_parallel_groups_that_would_straddle_nodes_are_refused(tp: int, pp: int, per_node: int,
                                                                      refused: bool) -> None:
    overrides = {"engines.qwen3-32b.tensor_parallel_size": tp, "engines.qwen3-32b.pipeline_parallel_size": pp,
                 "gpus.gpus_per_node": per_node}
    if not refused:
        assert _plan_ray_manager(**overrides)
        return
    with pytest.raises(ConfigError, match="^engines.qwen3-32b.tensor_parallel_size: a group of"):
        _plan_ray_manager(**overrides)


# --- the vLLM facts the recipe rests on (vLLM 0.32.0) ---

def test_vllm_cpu_build_has_no_ray_executor() -> None:
    """Why no engine runs on a local Ray cluster here: ``initialize_ray_cluster`` raises "current platform
    cpu does not support ray." When this fails, vLLM's CPU build gained a Ray executor: start the tiny
    engine on a local Ray cluster instead."""
    from vllm.platforms.cpu import CpuPlatform

    assert CpuPlatform.ray_device_key == ""


def test_vllm_ray_executor_needs_no_gpu_on_the_driver_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe starts this box's Ray node with no GPU: vLLM's default Ray executor (``RayExecutorV2``)
    must not ask for one on the node its engine core runs on (the legacy one does). Read from its source:
    the module imports only with ``ray`` installed."""
    import vllm
    import vllm.envs as envs

    monkeypatch.delenv("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", raising=False)
    assert envs.VLLM_USE_RAY_V2_EXECUTOR_BACKEND
    source = Path(vllm.__file__).parent / "v1" / "executor" / "ray_executor_v2.py"
    executor = next(n for n in ast.parse(source.read_text()).body
                    if isinstance(n, ast.ClassDef) and n.name == "RayExecutorV2")
    init = next(n for n in executor.body if isinstance(n, ast.FunctionDef) and n.name == "_init_executor")
    calls = [n for n in ast.walk(init) if isinstance(n, ast.Call)
             and getattr(n.func, "id", getattr(n.func, "attr", "")) == "initialize_ray_cluster"]
    assert [[(k.arg, ast.literal_eval(k.value)) for k in c.keywords] for c in calls] == \
        [[("require_gpu_on_driver", False)]]


def test_serve_refuses_a_ray_engine_without_a_cluster_address(capsys: pytest.CaptureFixture[str]) -> None:
    """Without RAY_ADDRESS, vLLM's ``ray.init()`` starts a private Ray instance that owns this box's GPUs."""
    from mia_engine.preflight import preflight

    config = load_config("tiny", {"engines.tiny.executor_backend": "ray", "learner.shared_dirs": ["/"]})
    assert preflight(config, environ={}) == 2
    assert capsys.readouterr().err.strip() == (
        "python -m mia_engine: error: engines.tiny.executor_backend: 'ray' needs the cluster's address: export "
        "RAY_ADDRESS=<head node>:6379 (docs/DEPLOY_8GPU.md, 'Past one box')")
    assert preflight(load_config("tiny"), environ={}) == 0
