"""The batch commands: ``batch`` (``run`` and ``ttl`` over a dataset), ``evaluate`` (``eval``: the bare
model, ReAct, MIA and test-time learning on the same questions), ``results`` (their records) and
``report`` (the table, the paired counts, the JSON and the plot)."""
