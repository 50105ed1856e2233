"""Why a bf16 model's vLLM worker grows on CPU: oneDNN's primitive cache, per capacity.

    python bench/onednn_cache.py --out bench/results/onednn_cache.json

vLLM's CPU linear layers run ``onednn_mm`` (``vllm/model_executor/layers/utils.py``), which builds one
oneDNN primitive per number of tokens in the step and keeps the latest 32 per layer; oneDNN keeps every
primitive again in its own process-wide cache of ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` entries (default
1024), read once per process. For each capacity, a fresh child process builds SmolLM2-135M's four
linear shapes (three layers each, bf16) and runs them over the same random sequence of step sizes
(half decode-sized, half up to 1024 tokens, as a serving engine's steps), reporting the RSS before,
halfway and at the end, and the seconds of each half. The engines' setting is the root field
``cpu.onednn_cache_capacity`` (``mia_engine/engines/cpu/spawn.py: spawn_env``).

``--op encoder`` runs the sentence encoder itself (bf16, batches of 1-64 dev-set questions and README
lines), ``--op linear`` torch's own bf16 ``F.linear``, on all-MiniLM-L6-v2's shapes (the sentence
encoder's, in the serving process), over 1..``--max-rows`` rows. torch keeps each primitive in ideep's LRU
cache (``LRU_CACHE_CAPACITY``, 1024) as well as in oneDNN's; ``--bound onednn`` sets only oneDNN's, as the
engines did before, ``--bound both`` both (``mia_engine/base/onednn.py``, the setting now).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from mia_engine.base.onednn import ONEDNN_CACHE_ENV, onednn_cache_env  # noqa: E402

SHAPES = [(576, 1728), (576, 576), (576, 3072), (1536, 576)]
"""SmolLM2-135M's (in, out) linear shapes: qkv, o, gate_up, down."""
DEVSET = Path(__file__).resolve().parent / "devset_wiki.jsonl"
ENCODER_SHAPES = [(384, 1152), (384, 384), (384, 1536), (1536, 384)]
"""all-MiniLM-L6-v2's (in, out) linear shapes: q, k and v together, o, intermediate, output."""


def measured(steps: int, step: Callable[[int], object]) -> dict[str, float]:
    """RSS before, halfway through and after ``step(0) .. step(steps - 1)``, and the seconds of each half."""
    import psutil

    process = psutil.Process()

    def mark() -> tuple[float, float]:
        return time.perf_counter(), process.memory_info().rss / 2**20

    marks = [mark()]
    for i in range(steps):
        if i == steps // 2:
            marks.append(mark())
        step(i)
    marks.append(mark())
    return {"rss_mb_start": marks[0][1], "rss_mb_half": marks[1][1], "rss_mb_end": marks[2][1],
            "seconds_first_half": marks[1][0] - marks[0][0], "seconds_second_half": marks[2][0] - marks[1][0]}


def child_encoder(steps: int, seed: int) -> dict[str, float]:
    """The sentence encoder itself in bf16: ``steps`` encodes of 1-64 random dev-set questions and README
    lines each, as memory searches and the index build send them (batch size and length vary, so the
    row count of every matmul does)."""
    from mia_engine.config.memory import EmbedderConfig
    from mia_engine.memory.embedder import Embedder

    texts = [json.loads(line)["question"] for line in DEVSET.read_text().splitlines() if line.strip()]
    texts += [line for line in (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines()
              if len(line) > 40]
    encoder = Embedder(EmbedderConfig(dtype="bfloat16"))
    rng = random.Random(seed)
    batches = [rng.sample(texts, rng.randint(1, 64)) for _ in range(steps)]
    try:
        return measured(steps, lambda i: encoder.encode(batches[i]))
    finally:
        encoder.close()


def child_linear(steps: int, layers_per_shape: int, seed: int, max_rows: int) -> dict[str, float]:
    """torch's bf16 ``F.linear`` (not vLLM's op) over random row counts, in a fresh process."""
    import torch

    weights = [torch.randn(out, k, dtype=torch.bfloat16) for k, out in ENCODER_SHAPES for _ in range(layers_per_shape)]
    rng = random.Random(seed)
    sizes = [rng.randint(1, max_rows) for _ in range(steps)]

    def step(i: int) -> None:
        for weight in weights:
            torch.nn.functional.linear(torch.randn(sizes[i], weight.shape[1], dtype=torch.bfloat16), weight)

    return {"distinct_step_sizes": len(set(sizes)), **measured(steps, step)}


def child(steps: int, layers_per_shape: int, seed: int) -> dict[str, float]:
    """Runs in a fresh process: oneDNN reads its cache capacity once, at its first primitive."""
    import torch
    import vllm._custom_ops as ops

    handlers = [ops.create_onednn_mm(torch.randn(out, k, dtype=torch.bfloat16).t(), 32)
                for k, out in SHAPES for _ in range(layers_per_shape)]
    rng = random.Random(seed)
    sizes = [rng.choice((rng.randint(1, 48), rng.randint(1, 1024))) for _ in range(steps)]

    def step(i: int) -> None:
        for handler in handlers:
            ops.onednn_mm(handler, torch.empty(sizes[i], handler.k, dtype=torch.bfloat16), None)

    return {"distinct_step_sizes": len(set(sizes)), **measured(steps, step)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacities", type=int, nargs="+", default=[1024, 128, 0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--layers-per-shape", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--op", choices=("onednn_mm", "linear", "encoder"), default="onednn_mm")
    parser.add_argument("--bound", choices=("onednn", "both"), default="onednn",
                        help="the caches each capacity applies to: oneDNN's only, or ideep's too")
    parser.add_argument("--max-rows", type=int, default=2048, help="largest row count of --op linear")
    parser.add_argument("--threads", type=int, default=0, help="torch threads in the child (0: torch's default)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        ops = {"onednn_mm": lambda: child(args.steps, args.layers_per_shape, args.seed),
               "linear": lambda: child_linear(args.steps, args.layers_per_shape, args.seed, args.max_rows),
               "encoder": lambda: child_encoder(args.steps, args.seed)}
        print(json.dumps(ops[args.op]()))
        return
    from bench.results_io import Result

    result = Result("onednn_cache")
    results = []
    for capacity in args.capacities:
        cmd = [sys.executable, __file__, "--child", "--steps", str(args.steps), "--op", args.op,
               "--max-rows", str(args.max_rows), "--threads", str(args.threads),
               "--layers-per-shape", str(args.layers_per_shape), "--seed", str(args.seed)]
        bound = onednn_cache_env(capacity) if args.bound == "both" else {ONEDNN_CACHE_ENV: str(capacity)}
        done = subprocess.run(cmd, env={**os.environ, **bound}, capture_output=True, text=True, check=True)
        row = {"capacity": capacity, **json.loads(done.stdout.strip().splitlines()[-1])}
        results.append(row)
        print(f"capacity {capacity:5d}: RSS {row['rss_mb_start']:.0f} -> {row['rss_mb_half']:.0f} -> "
              f"{row['rss_mb_end']:.0f} MB, {row['seconds_first_half']:.1f} + {row['seconds_second_half']:.1f} s")
    for row in results:
        result.add_run(**row)
    result.write(args.out, None, args)


if __name__ == "__main__":
    main()
