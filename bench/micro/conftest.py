"""pytest-benchmark micro-benchmarks of the engine's hot pieces, each a few seconds (``bench/micro/``).

    python -m pytest bench/micro --benchmark-only --benchmark-storage=bench/results/micro --benchmark-autosave
    python -m pytest bench/micro --benchmark-only --benchmark-storage=bench/results/micro --benchmark-compare \
        --benchmark-compare-fail=median:25%
    pytest-benchmark --storage bench/results/micro compare      # every saved run side by side

Not collected by the test suite (``testpaths = ["tests"]``). Each saved run also carries this project's
``meta`` block (``bench/results_io.py``: commit, machine, versions, command, load), beside
pytest-benchmark's own ``machine_info`` and ``commit_info``; ``bench/make_results.py`` shows the latest.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.results_io import collect_meta, finish  # noqa: E402

_META = collect_meta("micro")


def pytest_benchmark_update_json(config, benchmarks, output_json) -> None:  # noqa: ANN001
    output_json["meta"] = finish(dict(_META))
