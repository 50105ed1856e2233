"""The batch commands: ``batch`` (``run`` and ``ttl`` over a dataset), ``evaluate`` (``eval``: the bare
model, ReAct, MIA and test-time learning on the same questions), ``judge`` (the paper's LLM judge that
``eval --metric judge`` grades with), ``results`` (their records) and ``report`` (the table, the paired
counts, the spread over seeds, the JSON and the plot)."""
