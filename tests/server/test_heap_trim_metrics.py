"""The serving process trims its heap on schedule (``server.malloc_trim_interval_s``; every 2 s on the
shared server) and says so on ``/metrics``: how long each trim took and the RSS it gave back."""

from __future__ import annotations

import time

from mia_engine.base.heap_trim import glibc_malloc_trim

from tests.conftest import TRIM_INTERVAL_S, scrape_metrics


def _trim_series(server) -> dict[str, float]:
    return {sample.name: sample.value for sample in scrape_metrics(server) if sample.name.startswith("mia_malloc_trim")}


def test_the_server_trims_its_heap_on_schedule(tiny_server) -> None:
    first = _trim_series(tiny_server)
    assert {"mia_malloc_trim_seconds_count", "mia_malloc_trim_released_bytes_total"} <= first.keys()
    if glibc_malloc_trim() is None:
        return  # the server runs on this Python's C library: not glibc, nothing trimmed
    deadline = time.monotonic() + 3 * TRIM_INTERVAL_S  # the wait it allows: two trims, with one interval to spare
    while (later := _trim_series(tiny_server))["mia_malloc_trim_seconds_count"] < \
            first["mia_malloc_trim_seconds_count"] + 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert later["mia_malloc_trim_seconds_count"] >= first["mia_malloc_trim_seconds_count"] + 2
    assert later["mia_malloc_trim_seconds_sum"] < later["mia_malloc_trim_seconds_count"], "each trim under a second"
