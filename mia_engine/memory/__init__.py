"""Non-parametric memory of MIA: the experience store, its index and its retrieval score.

Where things live (request path top-down; the ``/v1/memory`` routes and their bodies are in ``server/``):
- ``handle``: ``MemoryHandle``, the server's memory while the store opens (503 until it is open).
- ``service``: ``MemoryService``, the async API the research loop and the routes share.
- ``store``: ``ExperienceStore``, the synchronous core (state, rules, durability glue).
- ``consolidation``: replacement, rollout selection and clearing rules (pure functions).
- ``buckets`` / ``index`` / ``meta_plans``: score matrices, FAISS indexes, Meta Plan Memory.
- ``journal`` / ``jsonl``: crash-safe on-disk format; export/import format.
- ``embedder``: the sentence encoder; ``entries``: the records; ``config``: every knob.
"""
