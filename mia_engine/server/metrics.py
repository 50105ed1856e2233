"""Prometheus metrics of the endpoint, per model id (role), in a registry owned by the app."""

from __future__ import annotations

import asyncio
import bisect
import gc
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector,
                               ProcessCollector, generate_latest)
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric,
                                   SummaryMetricFamily)

if TYPE_CHECKING:
    from .admission import Admission
    from .connections import ConnectionLimits

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
LOOP_LAG_INTERVAL_S = 0.01
"""How often, in seconds, the event-loop lag probe wakes (10 ms: fine enough to see a 50 ms stall)."""
GC_PAUSE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
MAX_LAG_BACKFILL = 6000
"""Most missed probe ticks recorded for one stall (a minute at ``LOOP_LAG_INTERVAL_S``)."""


class Metrics:
    content_type = CONTENT_TYPE_LATEST
    """The media type of ``render``'s text (Prometheus' text exposition format)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        add_process_collectors(self.registry)
        self.requests = Counter("mia_requests", "Chat requests by model and outcome",
                                ["model", "status"], registry=self.registry)
        self.prompt_tokens = Counter("mia_prompt_tokens", "Prompt tokens by model", ["model"],
                                     registry=self.registry)
        self.completion_tokens = Counter("mia_completion_tokens", "Generated tokens by model", ["model"],
                                         registry=self.registry)
        self.latency = Histogram("mia_request_latency_seconds", "End-to-end chat latency by model",
                                 ["model"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.first_token = Histogram("mia_time_to_first_token_seconds", "Time to first token by model",
                                     ["model"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.in_flight = Gauge("mia_requests_in_flight", "Chat requests running by model", ["model"],
                               registry=self.registry)

        self.learner_updates = Counter("mia_learner_updates", "Test-time GRPO updates by outcome",
                                       ["outcome"], registry=self.registry)
        self.learner_step = Histogram("mia_learner_step_seconds", "GRPO step time", buckets=LATENCY_BUCKETS,
                                      registry=self.registry)
        self.learner_publish = Histogram("mia_learner_publish_seconds", "Step end to new adapter serving",
                                         buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
                                         registry=self.registry)

        self.stage_latency = Histogram("mia_research_stage_seconds", "Research-loop stage time (agent/stages.py)",
                                       ["stage"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.stage_in_flight = Gauge("mia_research_stage_in_flight", "Research-loop stages running", ["stage"],
                                     registry=self.registry)
        self.role_prompt_tokens = Counter("mia_role_prompt_tokens", "Prompt tokens sent to the engine by role "
                                          "(HTTP requests and the research loop's own calls)", ["role"],
                                          registry=self.registry)
        self.role_cached_tokens = Counter("mia_role_prefix_cached_tokens", "Prompt tokens served from the prefix "
                                          "cache by role (hit rate = this / mia_role_prompt_tokens)", ["role"],
                                          registry=self.registry)
        self.role_completion_tokens = Counter("mia_role_completion_tokens", "Generated tokens by role", ["role"],
                                              registry=self.registry)
        self.role_requests = Counter("mia_role_requests", "Engine requests by role", ["role"], registry=self.registry)
        self.role_images = Counter("mia_role_images", "Images sent to the engine by role", ["role"],
                                   registry=self.registry)
        self.loop_lag = Histogram("mia_event_loop_lag_seconds", "How late the event loop woke a 10 ms timer: "
                                  "time that requests waited behind blocking work, one sample per tick (ticks a "
                                  "stall swallowed included)", buckets=LOOP_LAG_BUCKETS, registry=self.registry)
        self.gc_pauses = GcPauses()
        self.registry.register(self.gc_pauses)
        self.heap_trim = Histogram("mia_malloc_trim_seconds", "How long each malloc_trim of the serving process "
                                   "took (server.malloc_trim_interval_s)", buckets=GC_PAUSE_BUCKETS,
                                   registry=self.registry)
        self.heap_trim_released = Counter("mia_malloc_trim_released_bytes", "RSS the serving process's "
                                          "malloc_trim calls gave back to the system", registry=self.registry)
        self._admission_collector: AdmissionCollector | None = None

    def stage_started(self, stage: str) -> None:
        self.stage_in_flight.labels(stage).inc()

    def stage_finished(self, stage: str, seconds: float) -> None:
        self.stage_in_flight.labels(stage).dec()
        self.stage_latency.labels(stage).observe(seconds)

    def record_usage(self, role: str, prompt_tokens: int, cached_tokens: int, completion_tokens: int,
                     num_images: int) -> None:
        """One finished engine request of ``role`` (an ``engines.roles.UsageObserver``)."""
        self.role_requests.labels(role).inc()
        self.role_images.labels(role).inc(num_images)
        self.role_prompt_tokens.labels(role).inc(prompt_tokens)
        self.role_cached_tokens.labels(role).inc(cached_tokens)
        self.role_completion_tokens.labels(role).inc(completion_tokens)

    def record_update(self, report: Any) -> None:
        """A ``learner.ttl.UpdateReport``."""
        self.learner_updates.labels("published" if report.is_published else "rejected").inc()
        self.learner_step.observe(report.step.step_seconds)
        if report.is_published:
            self.learner_publish.observe(report.publish_seconds)

    def record_heap_trim(self, seconds: float, released_bytes: int) -> None:
        """One ``base.heap_trim.trim_heap`` of this process."""
        self.heap_trim.observe(seconds)
        self.heap_trim_released.inc(released_bytes)

    def watch_admission(self, admission: Admission) -> None:
        """Export ``admission``'s queues (depth, running, wait, rejections per key) at each scrape."""
        if self._admission_collector is not None:
            self.registry.unregister(self._admission_collector)
        self._admission_collector = AdmissionCollector(admission)
        self.registry.register(self._admission_collector)

    def watch_connections(self, limits: ConnectionLimits) -> None:
        """Export ``limits``' counts (open connections, refusals by cap, late-header closes) at each scrape."""
        self.registry.register(ConnectionsCollector(limits))

    def watch_engines(self, engines: Mapping[str, Any]) -> None:
        """Export vLLM's own ``vllm:*`` series of every engine in ``engines`` (read at each scrape, so engines
        that come up later count; each has a ``metrics_registry``)."""
        self.registry.register(EngineSeriesCollector(engines))

    async def watch_loop_lag(self) -> None:
        """Sample the running loop's lag into ``loop_lag``, and time this process's garbage collections into
        ``gc_pauses``, until cancelled (the app's lifespan runs it)."""
        gc.callbacks.append(self.gc_pauses.on_gc)
        try:
            await probe_loop_lag(self.loop_lag.observe, LOOP_LAG_INTERVAL_S)
        finally:
            gc.callbacks.remove(self.gc_pauses.on_gc)

    def render(self) -> bytes:
        return generate_latest(self.registry)


async def probe_loop_lag(observe: Callable[[float], None], interval_s: float) -> None:
    """Wake every ``interval_s`` and ``observe`` how late each tick ran. A stall of L seconds also records
    the ticks it swallowed (L - interval, L - 2 interval, ...), as a probe request sent every tick would
    have waited: one sample per stall would hide a long stall in a percentile."""
    loop = asyncio.get_running_loop()
    while True:
        start = loop.time()
        await asyncio.sleep(interval_s)
        lag = max(0.0, loop.time() - start - interval_s)
        observe(lag)
        for missed in range(1, min(int(lag / interval_s), MAX_LAG_BACKFILL) + 1):
            observe(lag - missed * interval_s)


class GcPauses:
    """``mia_gc_pause_seconds``: how long each garbage collection of this process took, by generation. A
    collection holds the interpreter, so the event loop and every thread wait it out: the lag probe shows the
    stall, this says whether a collection caused it. Counted in plain lists by a ``gc.callbacks`` hook (a
    Prometheus metric's lock is no place for code that runs inside any allocation) and read at scrape time."""

    def __init__(self) -> None:
        self._started = 0.0
        self._counts = [[0] * (len(GC_PAUSE_BUCKETS) + 1) for _ in range(3)]
        self._sums = [0.0, 0.0, 0.0]

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        seconds = time.perf_counter() - self._started
        generation = info["generation"]
        self._counts[generation][bisect.bisect_left(GC_PAUSE_BUCKETS, seconds)] += 1
        self._sums[generation] += seconds

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily("mia_gc_pause_seconds", "Garbage-collection pauses of the serving process "
                                       "by generation (every thread, the event loop's included, waits them out)",
                                       labels=["generation"])
        for generation, counts in enumerate(self._counts):
            cumulative, buckets = 0, []
            for bound, count in zip((*GC_PAUSE_BUCKETS, float("inf")), list(counts)):
                cumulative += count
                buckets.append((str(bound) if bound != float("inf") else "+Inf", cumulative))
            family.add_metric([str(generation)], buckets, self._sums[generation])
        yield family


class AdmissionCollector:
    """The admission queues per key (``model:planner``, ``route:mia``, ``server:bodies``), read at scrape time."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission

    def collect(self) -> Iterator[Metric]:
        admission = self._admission
        queued = GaugeMetricFamily("mia_admission_queued", "Requests waiting for a slot by key", labels=["key"])
        running = GaugeMetricFamily("mia_admission_running", "Requests holding a slot by key", labels=["key"])
        wait = SummaryMetricFamily("mia_admission_wait_seconds", "Time admitted requests waited for a slot by key",
                                   labels=["key"])
        rejected = CounterMetricFamily("mia_admission_rejected", "Requests refused with 429 (queue_full, "
                                       "deadline) or gone while queued (disconnected), by key and reason",
                                       labels=["key", "reason"])
        for key in admission.keys():
            queued.add_metric([key], admission.queued(key))
            running.add_metric([key], admission.running(key))
            stats = admission.stats.get(key)
            if stats is not None:
                wait.add_metric([key], stats.num_admitted, stats.wait_seconds)
                for reason, count in stats.num_rejected.items():
                    rejected.add_metric([key, reason], count)
        yield from (queued, running, wait, rejected)


class ConnectionsCollector:
    """The server's connections under ``server.connections`` (``connections.ConnectionLimits``), counted in plain
    integers on the event loop as each connection opens, is refused or closed, and read at scrape time."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self._limits = limits

    def collect(self) -> Iterator[Metric]:
        limits = self._limits
        yield GaugeMetricFamily("mia_connections_open", "HTTP connections open now, refused ones not counted "
                                "(server.connections.max_connections caps them)", value=limits.num_open)
        refused = CounterMetricFamily("mia_connections_refused", "Connections answered 503 too_many_connections "
                                      "as they were accepted, by the cap that refused them: total_cap "
                                      "(server.connections.max_connections) or per_client_cap "
                                      "(max_connections_per_client)", labels=["reason"])
        for reason, count in limits.num_refused.items():
            refused.add_metric([reason], count)
        yield refused
        yield CounterMetricFamily("mia_connections_header_timeouts", "Connections closed because a request's line "
                                  "and headers took over server.connections.header_timeout_s",
                                  value=limits.num_late_headers)


def add_process_collectors(registry: CollectorRegistry) -> None:
    """This process's RSS, CPU time, open files (``process_*``) and Python version (``python_info``)."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)


class EngineSeriesCollector:
    """vLLM's ``vllm:*`` series of every engine, one family per name with every engine's samples (each engine
    fills its own registry: vLLM's stat logger keeps one set of series per engine)."""

    def __init__(self, engines: Mapping[str, Any]) -> None:
        self._engines = engines

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for engine in list(self._engines.values()):
            for family in engine.metrics_registry.collect():
                merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                                 family.unit))
                merged.samples.extend(family.samples)
        yield from families.values()
