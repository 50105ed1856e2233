"""Non-parametric memory of MIA: the experience store, its index and its retrieval score.

Where things live (request path top-down):
- ``route_bodies``: the bodies of the ``/v1/memory`` HTTP routes (the routes: ``server/memory_api.py``).
- ``service``: ``MemoryService``, the async API the research loop and the routes share.
- ``store``: ``ExperienceStore``, the synchronous core (state, rules, durability glue).
- ``consolidation``: replacement, rollout selection and clearing rules (pure functions).
- ``buckets`` / ``index`` / ``meta_plans``: score matrices, FAISS indexes, Meta Plan Memory.
- ``journal`` / ``jsonl``: crash-safe on-disk format; export/import format.
- ``embedder``: the sentence encoder; ``entries``: the records; ``config``: every knob.
"""
