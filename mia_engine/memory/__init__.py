"""Non-parametric memory of MIA: the experience store, its index and its retrieval score.

Where things live (request path top-down):
- ``routes`` / ``protocol``: the ``/v1/memory`` HTTP routes and their bodies.
- ``service``: ``MemoryService``, the async API the research loop and the routes share.
- ``store``: ``ExperienceStore``, the synchronous core (state, rules, durability glue).
- ``consolidation``: replacement, rollout selection and clearing rules (pure functions).
- ``buckets`` / ``index`` / ``meta_plans``: score matrices, FAISS indexes, Meta Plan Memory.
- ``journal`` / ``jsonl``: crash-safe on-disk format; export/import format.
- ``embedder``: the sentence encoder; ``entries``: the records; ``config``: every knob.
"""
