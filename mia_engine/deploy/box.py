"""Whether this box (``gpu_probe.Box``, read through NVML) holds a config's plan (``budget.Plan``), GPU by GPU:
the GPU exists, its free memory covers what the plan claims on it, its compute capability runs the dtypes
placed on it, and the driver runs the CUDA torch was built for.

The plan is made with the box's memory (``on_box``): vLLM claims ``gpu_memory_utilization`` x the GPU's
total memory and refuses to start where less than that is free, so the need is computed from the real total
and compared with what is free now (another process's memory included).
"""

from __future__ import annotations

import msgspec

from ..config import ConfigError, MIAConfig
from ..devices import gpu_index, serving_device_fields
from .budget import GIB, Claim, Plan, device_fields, engine_gpus
from .cuda_driver import driver_verdict
from .gpu_probe import Box, GpuInfo

BF16_CAPABILITY = (8, 0)
"""bfloat16 needs Ampere or later (vLLM refuses an explicit ``dtype = "bfloat16"`` below it; ``auto``
falls back to float16 there)."""
COMPONENT_DTYPES = {"learner.device": "learner.dtype", "memory.embedder.device": "memory.embedder.dtype",
                    "tools.embedder.device": "tools.embedder.dtype"}
"""The serving process's components that compute in a configured dtype: device field -> dtype field."""


class GpuFit(msgspec.Struct, frozen=True):
    """One row of the box's table."""

    index: int
    gpu: GpuInfo | None
    """None: the config places something on a GPU this box does not have."""
    need_bytes: int
    bf16_fields: list[str]
    """The dtype fields that put bfloat16 on this GPU."""
    verdict: str
    """``ok``, ``unused``, or what does not fit, in a few words."""


class BoxFit(msgspec.Struct, frozen=True):
    box: Box
    memory_gib: float
    """What each GPU was planned with (``on_box``)."""
    cuda: str | None
    """The CUDA torch was built for (None: a CPU build, nothing to check the driver against)."""
    driver_line: str
    rows: list[GpuFit]


class BoxMisfit(ConfigError):
    """The config does not fit this box; ``fit`` holds every GPU's row, to show the table."""

    def __init__(self, message: str, fit: BoxFit) -> None:
        super().__init__(message)
        self.fit = fit


def on_box(config: MIAConfig, box: Box | None) -> MIAConfig:
    """The config planned with this box's memory: ``gpus.memory_gib`` = the total of the smallest GPU the
    config uses (one figure sizes every GPU of the plan). Not with a Ray engine: ``gpus.memory_gib`` then also
    sizes the other nodes' GPUs, which NVML does not see here."""
    if box is None or not box.gpus or any(e.executor_backend == "ray" for e in config.engines.values()):
        return config
    used = [gpu for gpu in box.gpus if gpu.index in _used_gpus(config)] or box.gpus
    memory_gib = min(gpu.total_bytes for gpu in used) / GIB
    return msgspec.structs.replace(config, gpus=msgspec.structs.replace(config.gpus, memory_gib=memory_gib))


def _used_gpus(config: MIAConfig) -> set[int]:
    """The GPUs of this node the config places an engine or a component of the serving process on."""
    engines = {gpu for e in config.engines.values() if e.executor_backend != "ray" for gpu in engine_gpus(e)}
    return engines | {g for v in serving_device_fields(config).values() if (g := gpu_index(v)) is not None}


def check_box(config: MIAConfig, result: Plan, box: Box, cuda: str | None, *, is_driver_checked: bool) -> BoxFit:
    """This box's fit for ``result``, the plan of ``config`` (``on_box``'s). Raises ``BoxMisfit`` with the first problem
    in one line naming the field: a GPU the box lacks, one with too little free memory, one whose compute
    capability cannot run a bfloat16 placed on it, or (``is_driver_checked``) a driver too old for ``cuda``."""
    gpus = {gpu.index: gpu for gpu in box.gpus}
    needs = {int(b.gpu): b.used_bytes for b in result.gpus if b.gpu.isdigit() and b.claims}
    problems = [f"{_field_naming(config, i)}: GPU {i} is not on this box, which has {len(gpus)} GPU(s) "
                f"({_owners(result, i)})" for i in sorted(needs.keys() - gpus.keys())]
    bf16 = bf16_fields(config)
    rows = [_row(result, i, gpus.get(i), needs.get(i, 0), bf16.get(i, []), problems)
            for i in sorted(gpus.keys() | needs.keys())]
    is_ok, driver_line = driver_verdict(box.driver, cuda) if cuda else (True, f"NVIDIA driver {box.driver}")
    if not is_ok and is_driver_checked:
        problems.append(driver_line)
    fit = BoxFit(box, config.gpus.memory_gib, cuda, driver_line, rows)
    if problems:
        more = f" (and {len(problems) - 1} more: see the table)" if len(problems) > 1 else ""
        raise BoxMisfit(problems[0] + more, fit)
    return fit


def bf16_fields(config: MIAConfig) -> dict[int, list[str]]:
    """The dtype fields that place bfloat16 on each GPU of this node."""
    by_gpu: dict[int, list[str]] = {}
    for name, engine in config.engines.items():
        if engine.dtype == "bfloat16" and engine.executor_backend != "ray":
            for gpu in engine_gpus(engine):
                by_gpu.setdefault(gpu, []).append(f"engines.{name}.dtype")
    devices = serving_device_fields(config)
    dtypes = {"learner.device": config.learner.dtype, "memory.embedder.device": config.memory.embedder.dtype,
              "tools.embedder.device": config.tools.embedder.dtype}
    for field, dtype in dtypes.items():
        if dtype == "bfloat16" and (gpu := gpu_index(devices[field])) is not None:
            by_gpu.setdefault(gpu, []).append(COMPONENT_DTYPES[field])
    return by_gpu


def _row(result: Plan, index: int, gpu: GpuInfo | None, need: int, bf16: list[str], problems: list[str]) -> GpuFit:
    """One GPU's row; a GPU of the box that does not fit appends one line naming the field to ``problems``."""
    if gpu is None:
        return GpuFit(index, None, need, bf16, "not on this box")
    if need > gpu.free_bytes:
        problems.append(f"{_biggest_claim_field(result, index)}: GPU {index} ({gpu.name}) has "
                        f"{gpu.free_bytes / GIB:.2f} GiB free of {gpu.total_bytes / GIB:.2f} GiB, the config needs "
                        f"{need / GIB:.2f} GiB there ({_owners(result, index)})")
        return GpuFit(index, gpu, need, bf16, f"short by {(need - gpu.free_bytes) / GIB:.2f} GiB")
    if bf16 and gpu.compute_capability < BF16_CAPABILITY:
        cc = ".".join(map(str, gpu.compute_capability))
        problems.append(f"{bf16[0]}: bfloat16 needs compute capability >= 8.0, GPU {index} ({gpu.name}) has "
                        f"{cc}: use float16 there")
        return GpuFit(index, gpu, need, bf16, f"bfloat16 needs cc >= 8.0 ({bf16[0]})")
    return GpuFit(index, gpu, need, bf16, "ok" if need else "unused")


def _claims(result: Plan, index: int) -> list[Claim]:
    return next(b.claims for b in result.gpus if b.gpu == str(index))


def _owners(result: Plan, index: int) -> str:
    return ", ".join(c.owner for c in _claims(result, index))


def _biggest_claim_field(result: Plan, index: int) -> str:
    """The field to change: the biggest claim's (an engine's share, or the serving process's biggest user)."""
    return max(_claims(result, index), key=lambda c: c.share_bytes).field


def _field_naming(config: MIAConfig, index: int) -> str:
    """The field that names GPU ``index``; ``gpus.num_gpus`` where only an engine's default devices reach it."""
    return next((f for f, ids in device_fields(config).items() if index in ids), "gpus.num_gpus")
