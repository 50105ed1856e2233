"""Non-parametric memory of MIA: the experience store, its index and its retrieval score.

Where things live (request path top-down; the ``/v1/memory`` routes and their bodies are in ``server/``):
- ``handle``: ``MemoryHandle``, the server's memory while the store opens (503 until it is open).
- ``service``: ``MemoryService``, the async API the research loop and the routes share.
- ``store``: ``ExperienceStore``, the synchronous core (rules, durability glue); ``store_devices``: its devices.
- ``contents``: ``StoreContents``, the state in memory, changed only by journaled changes.
- ``retrieval``: ``SearchQuery`` and the batched bucket search; ``capacity``: the ``max_num_stored`` rule.
- ``consolidation``: replacement, rollout selection and clearing rules (pure functions).
- ``buckets`` / ``index`` / ``meta_plans``: score matrices, FAISS indexes, Meta Plan Memory.
- ``framing``: the CRC frame every journal change and snapshot part is written in; ``journal``: the
  append-only change log and its sealed segments; ``snapshot``: snapshot generations, written in parts on
  their own thread; ``recovery``: what a start loads (the newest readable generation and the journal after
  it); ``legacy``: readers of the previous on-disk format.
- ``jsonl``: export/import format; ``import_chunks``: an import cut into journal changes.
- ``embedder``: the sentence encoder; ``entries``: the records; ``validation``: their checks;
  ``blas``: the CPU score's thread cap. Every knob is in ``config/memory.py``.
"""
