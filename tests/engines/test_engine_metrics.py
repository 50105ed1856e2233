"""vLLM's stat logger per engine: each engine's ``vllm:*`` series live in its own registry, and /metrics
shows every engine's under one family per name."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import REGISTRY, CollectorRegistry, Gauge
from prometheus_client.parser import text_string_to_metric_families

from mia_engine.config import load_config
from mia_engine.engines.vllm_engine import VLLMEngine, stat_logger_for
from mia_engine.models.embedded import model_dir
from mia_engine.server.metrics import Metrics


def test_two_engines_in_one_process_keep_their_own_vllm_series(tmp_path: Path) -> None:
    """vLLM's logger clears every ``vllm:`` series of the global registry when it is built; bound to a
    registry of its own, the first engine's series survive the second engine's start."""
    from vllm.usage.usage_lib import UsageContext

    config = load_config("tiny")
    path = model_dir("embedded:tiny", tmp_path)
    registries = {}
    for name in ("first", "second"):
        engine = VLLMEngine(name, config.engines["tiny"], path)
        vllm_config = engine._engine_args().create_engine_config(UsageContext.ENGINE_CONTEXT)
        stat_logger_for(engine.metrics_registry)(vllm_config, [0])
        registries[name] = engine.metrics_registry
    for name, registry in registries.items():
        assert registry.get_sample_value("vllm:num_requests_running", {"model_name": name, "engine": "0"}) == 0
    assert REGISTRY.get_sample_value("vllm:num_requests_running", {"model_name": "first", "engine": "0"}) is None
    assert registries["first"].get_sample_value("vllm:estimated_flops_per_gpu_total",
                                                {"model_name": "first", "engine": "0"}) == 0
    assert _global_vllm_collectors() == []


def test_loggers_built_at_once_in_threads_all_come_up(tmp_path: Path) -> None:
    """Disjoint engines start at once on worker threads, each building its logger there: none of them
    fails on another's clearing of the global registry, and each keeps its own series."""
    from vllm.usage.usage_lib import UsageContext

    config = load_config("tiny")
    path = model_dir("embedded:tiny", tmp_path)
    engines = [VLLMEngine(f"e{i}", config.engines["tiny"], path) for i in range(8)]
    vllm_configs = [e._engine_args().create_engine_config(UsageContext.ENGINE_CONTEXT) for e in engines]
    with ThreadPoolExecutor(len(engines)) as pool:
        list(pool.map(lambda e, c: stat_logger_for(e.metrics_registry)(c, [0]), engines, vllm_configs))
    for engine in engines:
        assert engine.metrics_registry.get_sample_value(
            "vllm:estimated_flops_per_gpu_total", {"model_name": engine.name, "engine": "0"}) == 0
    assert _global_vllm_collectors() == []


def _global_vllm_collectors() -> list[object]:
    return [c for c in REGISTRY._collector_to_names if getattr(c, "_name", "").startswith("vllm:")]


def test_the_scrape_has_one_family_per_name_with_every_engines_samples() -> None:
    engines = {}
    for name in ("a", "b"):
        registry = CollectorRegistry()
        Gauge("vllm:num_requests_running", "running", ["model_name", "engine"], registry=registry).labels(name, "0").set(
            2 if name == "a" else 3)
        engines[name] = SimpleNamespace(metrics_registry=registry)
    metrics = Metrics()
    metrics.watch_engines(engines)
    text = metrics.render().decode()
    assert text.count("# TYPE vllm:num_requests_running gauge") == 1
    families = {f.name: f for f in text_string_to_metric_families(text)}
    values = {s.labels["model_name"]: s.value for s in families["vllm:num_requests_running"].samples}
    assert values == {"a": 2, "b": 3}
    assert families["process_resident_memory_bytes"].samples[0].value > 0
