"""The building blocks every layer may use (the bottom of ``scripts/layers.py``'s order, beside the
configs): ``structs`` (the frozen config-struct base and ``require``), ``files`` (atomic writes),
``readiness`` (the start-up handles' base), ``coalesce`` (concurrent calls batched), ``data`` (question
datasets and corpus rows from JSONL/parquet)."""
