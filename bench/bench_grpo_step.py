"""Time one GRPO step of the Planner learner (forward + backward + AdamW on the LoRA weights).

Shapes:
  tiny              the 2-layer tiny Qwen3 (``mia_engine.models.tiny``), fp32, rank-8 adapter.
  qwen3-8b-layers   a Qwen3-8B-shaped stack (hidden 4096, intermediate 12288, 32 heads, 8 KV heads,
                    head_dim 128, vocab 151936) cut to ``--num-layers`` layers (default 4, to fit memory),
                    random bf16 weights, LoRA of ``--rank`` (default 64) on all linear layers.
The batch is the test-time-learning batch: ``--num-groups`` groups of G = ``--group-size`` rollouts with
``--completion-len``-token completions after a ``--prompt-len``-token prompt; rewards 0/1 alternate in
each group so no group is skipped. Each model is written to a temp folder and loaded by
``PlannerLearner`` exactly as the server does. Also times ``save_adapter`` into /dev/shm (the publish cost).

Run:  python bench/bench_grpo_step.py                                   (tiny, CPU)
      python bench/bench_grpo_step.py --device cuda --shape qwen3-8b-layers --num-layers 4 --rank 64

Needs torch, transformers, peft, safetensors, numpy (tokenizers for the tiny shape); nothing from vLLM.
Where msgspec is missing (the GPU image), a dataclass stand-in for ``msgspec.Struct`` is installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096,
    "intermediate_size": 12288, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "hidden_act": "silu", "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
    "bos_token_id": 151643, "eos_token_id": 151645, "pad_token_id": 151643,
}
"""Qwen3-8B's published config; ``num_hidden_layers`` comes from ``--num-layers``."""


def _ensure_msgspec() -> None:
    """The learner only needs ``msgspec.Struct``; stand in with a dataclass where msgspec is absent."""
    if importlib.util.find_spec("msgspec") is None:
        shim = types.ModuleType("msgspec")

        class Struct:
            def __init_subclass__(cls, frozen: bool = False, kw_only: bool = False, **_: object) -> None:
                super().__init_subclass__()
                dataclasses.dataclass(frozen=frozen, kw_only=kw_only)(cls)

        shim.Struct = Struct
        shim.ValidationError = ValueError
        sys.modules["msgspec"] = shim


def build_model(args: argparse.Namespace, out: Path) -> int:
    """Write base + planner adapter under ``out``; returns the vocabulary size."""
    if args.shape == "tiny":
        from mia_engine.models.tiny import build_tiny

        build_tiny(out)
        return json.loads((out / "base" / "config.json").read_text())["vocab_size"]
    return _build_qwen3_8b_layers(out, args.num_layers, args.rank, args.device)


def _build_qwen3_8b_layers(out: Path, num_layers: int, rank: int, device: str) -> int:
    """Random bf16 weights from the config (initialised on ``device``), saved as an HF folder."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from mia_engine.models.lora import write_lora_adapter
    from mia_engine.models.tiny import LORA_TARGETS

    config = {**QWEN3_8B, "num_hidden_layers": num_layers}
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(Qwen3Config(**config), dtype=torch.bfloat16)
    model.save_pretrained(out / "base")
    del model
    write_lora_adapter(out / "adapters" / "planner", config, rank=rank, alpha=2 * rank,
                       target_modules=LORA_TARGETS, seed=1, b_std=0.01, base_model_name="qwen3-8b-layers")
    return config["vocab_size"]


def make_samples(args: argparse.Namespace, vocab_size: int) -> list:
    from mia_engine.learner.batching import GRPOSample

    rng = random.Random(0)
    samples = []
    for g in range(args.num_groups):
        prompt = [rng.randrange(vocab_size) for _ in range(args.prompt_len)]
        for i in range(args.group_size):
            completion = [rng.randrange(vocab_size) for _ in range(args.completion_len)]
            samples.append(GRPOSample(prompt_ids=prompt, completion_ids=completion, reward=float(i % 2),
                                      group_id=f"q{g}"))
    return samples


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _publish_root() -> str | None:
    """A tmpfs publish dir (``learner.publish_tmpfs = "/dev/shm"``) when writable, else the temp dir."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def time_steps(learner: object, samples: list, args: argparse.Namespace) -> dict[str, float | None]:
    """Warm-up step, then ``--steps`` timed steps; then one timed ``save_adapter``."""
    learner.step(samples)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        _sync(args.device)
        started = time.perf_counter()
        result = learner.step(samples)
        _sync(args.device)
        times.append(time.perf_counter() - started)
        if not result.is_accepted:
            raise RuntimeError(f"step rejected: {result.reason}")
    with tempfile.TemporaryDirectory(prefix="bench-publish-", dir=_publish_root()) as publish:
        started = time.perf_counter()
        learner.save_adapter(Path(publish) / "v1")
        save_s = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else None
    return {"median": statistics.median(times), "min": min(times), "save": save_s, "peak_gib": peak}


def report(args: argparse.Namespace, timing: dict[str, float | None], dtype: str, rank: int, layers: int) -> str:
    num_seqs = args.num_groups * args.group_size
    tokens = num_seqs * (args.prompt_len + args.completion_len)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else \
        f"{platform.machine()} CPU, {torch.get_num_threads()} thread(s)"
    peak = "–" if timing["peak_gib"] is None else f"{timing['peak_gib']:.1f}"
    rows = [
        "| shape | device | dtype | layers | LoRA rank | sequences (G×groups) | tokens/seq (prompt+completion) "
        "| micro-batch | step median (s) | step min (s) | tokens/s | save_adapter (ms) | peak GPU mem (GiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {args.shape} | {device} | {dtype} | {layers} | {rank} | {num_seqs} ({args.group_size}×{args.num_groups}) "
        f"| {args.prompt_len}+{args.completion_len} | {args.micro_batch_size} | {timing['median']:.3f} "
        f"| {timing['min']:.3f} | {tokens / timing['median']:.0f} | {timing['save'] * 1e3:.1f} "
        f"| {peak} |",
    ]
    return "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", choices=["tiny", "qwen3-8b-layers"], default="tiny")
    parser.add_argument("--num-layers", type=int, default=4, help="layers of the qwen3-8b-layers stack")
    parser.add_argument("--rank", type=int, default=64, help="LoRA rank of the qwen3-8b-layers stack")
    parser.add_argument("--group-size", type=int, default=4, help="G rollouts per question")
    parser.add_argument("--num-groups", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--completion-len", type=int, default=64)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5, help="timed steps (after one warm-up step)")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    _ensure_msgspec()
    from mia_engine.config.learner import LearnerConfig
    from mia_engine.learner.learner import PlannerLearner

    dtype = "float32" if args.shape == "tiny" else "bfloat16"
    rank, layers = (8, 2) if args.shape == "tiny" else (args.rank, args.num_layers)
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as tmp:
        out = Path(tmp)
        vocab_size = build_model(args, out)
        config = LearnerConfig(device=args.device, dtype=dtype, micro_batch_size=args.micro_batch_size)
        learner = PlannerLearner(out / "base", out / "adapters" / "planner", config)
        timing = time_steps(learner, make_samples(args, vocab_size), args)
    print(f"command: python bench/bench_grpo_step.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"torch {torch.__version__}, {platform.platform()}, {args.steps} timed steps after 1 warm-up\n")
    print(report(args, timing, dtype, rank, layers))


if __name__ == "__main__":
    main()
