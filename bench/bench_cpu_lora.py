"""Benchmark of the CPU LoRA ops (``mia_engine/engines/cpu/lora_ops.py``) at the shapes of the two models
this project serves on CPU, per batch size: where the per-token gather stops paying.

For each model's attention projection (tiny: hidden 128, rank 8; SmolLM2-135M: hidden 576, rank 16)
and each number of tokens in a step, it times, on the same tensors in the same run, the order
alternated round by round:
  gather    ``_gathered_delta``: vLLM's gather of one adapter matrix per token, then einsum
  grouped   ``_grouped_delta``: one matmul per adapter present in the batch
  chosen    ``_lora_delta``: what the ops run (the gather from 2 tokens up to ``GATHER_MAX_ELEMENTS``)
  vllm      vLLM's own ``torch_ops`` (what ``vllm serve`` runs on CPU; it also mis-reads index -1)
for a shrink (``in`` = hidden, ``out`` = rank) and an expand (``in`` = rank, ``out`` = hidden). Each
step's tokens are spread over three adapters (Planner, Executor, none) of four loaded slots, as in
the research loop.

With ``--layers`` it times a whole LoRA linear layer instead (``add_lora_linear`` of a q/k/v or a
gate/up projection, every slice), through three Punica wrappers (five variants), one decode step's
tokens each:
  vllm        vLLM's ``PunicaWrapperCPU`` on its own ops
  per-slice   vLLM's wrapper code on the grouped ops (a shrink and an expand per slice, each grouping
              the tokens again): what ran before the slices were fused
  fused       ``GroupedPunicaWrapperCPU`` (what the engines run): the layer's adapters stacked once per
              load, the tokens grouped once per step; one shrink and one expand for all slices and
              (up to ``cpu_lora.MASKED_MAX_MACS``) all adapters of the step, masked
  per-adapter the same wrapper forced to one shrink and one expand per adapter at every size
  masked      the same wrapper forced to the masked product at every size
Each timing repeats one token count, so oneDNN keeps the primitive it built for that shape: this
flatters the bf16 matmuls (``vllm``, ``per-slice``) against serving, where the count changes every
step and a bf16 matmul builds a new primitive (the fused layer computes in float32 for that reason,
``cpu_lora.StackedLayer``). ``--vary`` times what serving sees: each call a different token count
around the nominal one, more counts than the oneDNN caches keep (set their capacity as the engines do:
``ONEDNN_PRIMITIVE_CACHE_CAPACITY=128 LRU_CACHE_CAPACITY=128``). ``--threads 1`` is what vLLM's CPU
worker runs on a 2-core machine.

Run:  python bench/bench_cpu_lora.py --out bench/results/cpu_lora.json
      python bench/bench_cpu_lora.py --layers --threads 1 --vary --tokens 128 512 2048 --out bench/results/cpu_lora_layers.json
or:   python -m pytest bench/bench_cpu_lora.py --benchmark-only   (pytest-benchmark)
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from mia_engine.engines.cpu import lora_ops as cpu_lora  # noqa: E402

MODELS = {"tiny": (128, 8), "smollm2-135m": (576, 16)}
"""(hidden size, LoRA rank) of each model's adapters (configs/tiny.toml, configs/default.toml)."""
SLOTS = 4
LAYERS = {"tiny": {"qkv": (128, 64, 64), "gate_up": (256, 256)},
          "smollm2-135m": {"qkv": (576, 192, 192), "gate_up": (1536, 1536)}}
"""Output slices of each model's two multi-slice LoRA layers (the models' config.json: heads × head_dim,
intermediate size)."""


def case(hidden: int, rank: int, tokens: int, kind: str, dtype: torch.dtype,
         seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs, weights (slots, 1, out, in), indices in {-1, 0, 1}) of one shrink or expand."""
    g = torch.Generator().manual_seed(seed)
    size_in, size_out = (hidden, rank) if kind == "shrink" else (rank, hidden)
    inputs = torch.randn(tokens, size_in, generator=g).to(dtype)
    weights = torch.randn(SLOTS, 1, size_out, size_in, generator=g).to(dtype)
    indices = torch.randint(-1, 2, (tokens,), generator=g)
    return inputs, weights, indices


def variants(kind: str, dtype: torch.dtype) -> dict[str, Callable[..., object]]:
    from vllm.lora.ops import torch_ops

    def vllm(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> object:
        out = torch.zeros(inputs.shape[0], weights.shape[2], dtype=dtype)
        if kind == "shrink":
            return torch_ops.bgmv_shrink(inputs, weights, out, indices, 1.0)
        return torch_ops.bgmv_expand(inputs, weights, out, indices, True)

    return {
        "gather": lambda x, w, i: cpu_lora._gathered_delta(x, w.squeeze(1), i),
        "grouped": lambda x, w, i: cpu_lora._grouped_delta(x, w.squeeze(1), i),
        "chosen": lambda x, w, i: cpu_lora._lora_delta(x, w, i, dtype),
        "vllm": vllm,
    }


def time_us(fn: Callable[[], object], min_s: float) -> float:
    """Mean microseconds per call over at least ``min_s`` seconds (after a warm-up)."""
    for _ in range(3):
        fn()
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < min_s:
        fn()
        calls += 1
    return elapsed / calls * 1e6


def run(tokens: list[int], rounds: int, min_s: float, dtype: torch.dtype) -> list[dict[str, object]]:
    rows = []
    for model, (hidden, rank) in MODELS.items():
        for kind in ("shrink", "expand"):
            fns = variants(kind, dtype)
            for count in tokens:
                x, w, i = case(hidden, rank, count, kind, dtype)
                samples: dict[str, list[float]] = {name: [] for name in fns}
                for r in range(rounds):
                    names = list(fns) if r % 2 == 0 else list(reversed(fns))
                    for name in names:
                        samples[name].append(time_us(lambda: fns[name](x, w, i), min_s))
                us = {name: statistics.median(v) for name, v in samples.items()}
                rows.append({"model": model, "kind": kind, "tokens": count,
                             "gathered_elements": count * w.shape[2] * w.shape[3],
                             "chosen_path": "gather" if cpu_lora.gathers(count, w.shape[2], w.shape[3]) else "grouped",
                             "us": us, "gather_over_grouped": us["gather"] / us["grouped"],
                             "vllm_over_chosen": us["vllm"] / us["chosen"]})
                print(f"{model:13s} {kind:6s} {count:4d} tokens  gather {us['gather']:8.1f}  grouped "
                      f"{us['grouped']:8.1f}  chosen {us['chosen']:8.1f} ({rows[-1]['chosen_path']})  vllm "
                      f"{us['vllm']:8.1f} us   gather/grouped {rows[-1]['gather_over_grouped']:5.2f}", flush=True)
    return rows


def layer_wrappers() -> dict[str, type]:
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    from mia_engine.engines.cpu.punica import GroupedPunicaWrapperCPU, _OnOurOps

    wrappers = {"vllm": PunicaWrapperCPU, "per-slice": _OnOurOps, "fused": GroupedPunicaWrapperCPU}
    if hasattr(cpu_lora, "MASKED_MAX_MACS"):  # (a tree from before the stacked layers has one path)
        wrappers |= {"per-adapter": GroupedPunicaWrapperCPU, "masked": GroupedPunicaWrapperCPU}
    return wrappers


FORCED_MASKED_MAX_MACS = {"per-adapter": 0, "masked": 1 << 62}
"""``cpu_lora.MASKED_MAX_MACS`` while a forced variant runs: where the two stacked paths cross."""


def forced(name: str, fn: Callable[[], object]) -> Callable[[], object]:
    if name not in FORCED_MASKED_MAX_MACS:
        return fn

    def run_forced() -> object:
        chosen, cpu_lora.MASKED_MAX_MACS = cpu_lora.MASKED_MAX_MACS, FORCED_MASKED_MAX_MACS[name]
        try:
            return fn()
        finally:
            cpu_lora.MASKED_MAX_MACS = chosen

    return run_forced


VARIED_COUNTS = 256
"""With ``--vary``, each call takes the next of this many token counts around the nominal one (from
``max(1, tokens - 128)``, so the nominal count is their mean from 128 tokens up): more distinct shapes
than the engines' oneDNN caches keep (``cpu.onednn_cache_capacity``, 128), as in serving, where the
count changes every step."""


def layer_case(wrapper_class: type, hidden: int, rank: int, slices: tuple[int, ...], tokens: int,
               dtype: torch.dtype, vary: bool = False) -> Callable[[], object]:
    """One decode step's ``add_lora_linear`` through ``wrapper_class``, tokens spread over Planner,
    Executor and none (LoRA ids 11, 12, 0) as in ``case``; with ``vary``, a different token count per
    call (``VARIED_COUNTS`` steps, each with its own wrapper metadata, cycled)."""
    from vllm.lora.layers import LoRAMapping

    g = torch.Generator().manual_seed(0)
    a = tuple(torch.randn(SLOTS, 1, rank, hidden, generator=g).to(dtype) for _ in slices)
    b = tuple(torch.randn(SLOTS, 1, size, rank, generator=g).to(dtype) for size in slices)
    low = max(1, tokens - VARIED_COUNTS // 2)
    steps = []
    for count in (range(low, low + VARIED_COUNTS) if vary else [tokens]):
        ids = [(0, 11, 12)[i] for i in torch.randint(0, 3, (count,), generator=g).tolist()]
        wrapper = wrapper_class(max_num_batched_tokens=4096, max_batches=256, device="cpu")
        wrapper.update_metadata(LoRAMapping(ids, ids, is_prefill=False), [11, 12, 13, None], SLOTS, 1000)
        steps.append((wrapper, torch.randn(count, hidden, generator=g).to(dtype),
                      torch.zeros(count, sum(slices), dtype=dtype)))
    turns = itertools.cycle(steps)

    def one_call() -> object:
        wrapper, x, y = next(turns)
        return wrapper.add_lora_linear(y, x, a, b, 1.0, slices)

    for _ in steps:  # each wrapper's first call (the fused one stacks the adapters then)
        one_call()
    return one_call


def run_layers(tokens: list[int], rounds: int, min_s: float, dtype: torch.dtype,
               vary: bool = False) -> list[dict[str, object]]:
    rows = []
    wrappers = layer_wrappers()
    for model, (hidden, rank) in MODELS.items():
        for layer, slices in LAYERS[model].items():
            for count in tokens:
                fns = {name: forced(name, layer_case(cls, hidden, rank, slices, count, dtype, vary))
                       for name, cls in wrappers.items()}
                samples: dict[str, list[float]] = {name: [] for name in fns}
                for r in range(rounds):
                    for name in (list(fns) if r % 2 == 0 else list(reversed(fns))):
                        samples[name].append(time_us(fns[name], min_s))
                us = {name: statistics.median(v) for name, v in samples.items()}
                rows.append({"model": model, "layer": layer, "tokens": count, "varied": vary, "us": us,
                             "per_slice_over_fused": us["per-slice"] / us["fused"],
                             "vllm_over_fused": us["vllm"] / us["fused"]})
                print(f"{model:13s} {layer:7s} {count:4d} tokens  " + "  ".join(f"{k} {v:8.1f}" for k, v in us.items())
                      + f" us   per-slice/fused {rows[-1]['per_slice_over_fused']:5.2f}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-s", type=float, default=0.2, help="seconds per timing")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--layers", action="store_true", help="time whole LoRA layers through the wrappers")
    parser.add_argument("--vary", action="store_true",
                        help="with --layers: a different token count per call, as in serving (VARIED_COUNTS)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (0: torch's default); vLLM's CPU model worker runs one per core it holds")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from bench.results_io import Result

    result = Result("cpu_lora")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    rows = (run_layers(args.tokens, args.rounds, args.min_s, dtype, args.vary) if args.layers
            else run(args.tokens, args.rounds, args.min_s, dtype))
    for row in rows:  # one run per shape and token count, its rounds' timings inside
        result.add_run(**row)
    result.write(args.out, None, args, torch_threads=torch.get_num_threads(),
                 gather_max_elements=cpu_lora.GATHER_MAX_ELEMENTS,
                 masked_max_macs=getattr(cpu_lora, "MASKED_MAX_MACS", None))


# ---- pytest-benchmark entry points (python -m pytest bench/bench_cpu_lora.py --benchmark-only) ----------


@pytest.mark.parametrize("path", ["gather", "grouped", "vllm"])
@pytest.mark.parametrize("tokens", [4, 64])
def test_smollm2_expand(benchmark: object, path: str, tokens: int) -> None:
    x, w, i = case(*MODELS["smollm2-135m"], tokens, "expand", torch.bfloat16)
    fn = variants("expand", torch.bfloat16)[path]
    benchmark(lambda: fn(x, w, i))


@pytest.mark.parametrize("wrapper", ["vllm", "per-slice", "fused"])
def test_smollm2_qkv_layer(benchmark: object, wrapper: str) -> None:
    hidden, rank = MODELS["smollm2-135m"]
    benchmark(layer_case(layer_wrappers()[wrapper], hidden, rank, LAYERS["smollm2-135m"]["qkv"], 64, torch.bfloat16))


if __name__ == "__main__":
    main()
