"""The garbage-collection pause histogram (``mia_gc_pause_seconds``) counts each collection under its
generation, in a process that runs no server (the hook and the collector are plain objects)."""

from __future__ import annotations

import gc

from prometheus_client import CollectorRegistry, generate_latest

from mia_engine.server.metrics import GcPauses


def test_a_full_collection_is_counted_under_generation_2() -> None:
    pauses = GcPauses()
    registry = CollectorRegistry()
    registry.register(pauses)
    gc.callbacks.append(pauses.on_gc)
    try:
        gc.collect(2)
    finally:
        gc.callbacks.remove(pauses.on_gc)
    text = generate_latest(registry).decode()
    assert 'mia_gc_pause_seconds_count{generation="2"} 1.0' in text
    assert 'mia_gc_pause_seconds_bucket{generation="2",le="+Inf"} 1.0' in text
    assert 'mia_gc_pause_seconds_count{generation="1"} 0.0' in text
    total = float(text.split('mia_gc_pause_seconds_sum{generation="2"} ')[1].split()[0])
    assert total > 0
