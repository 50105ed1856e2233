"""Deployment planning: model shapes from ``config.json`` (``shapes.py``), the per-GPU memory budget of a
config and its refusals (``budget.py``), this box's GPUs read through NVML (``gpu_probe.py``) and whether
they hold that budget (``box.py``, with the driver each CUDA major needs in ``cuda_driver.py``), and the
dry-run report (``report.py``) that ``python -m mia_engine serve --dry-run`` prints."""
