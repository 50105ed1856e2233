"""Deployment planning without GPUs: model shapes from ``config.json`` (``shapes.py``), the per-GPU
memory budget of a config and its refusals (``budget.py``), and the dry-run report (``report.py``) that
``python -m mia_engine serve --dry-run`` prints."""
