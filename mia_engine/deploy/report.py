"""The text ``serve --dry-run`` prints: placement, then each GPU's memory budget in GiB."""

from __future__ import annotations

from ..config import MIAConfig, resolve_role
from .box import BoxFit
from .budget import GIB, Plan


def render(config: MIAConfig, result: Plan, adapter_lines: list[str] = (), title: str = "MIA Engine dry run",
           fit: BoxFit | None = None) -> str:
    """The report; ``fit`` (this box's GPUs, read through NVML) adds their table and sets the GPUs' memory."""
    memory_gib = f"{config.gpus.memory_gib:g} GiB"
    if fit is not None and fit.memory_gib != config.gpus.memory_gib:
        memory_gib = f"{fit.memory_gib:.2f} GiB (this box's smallest GPU, read through NVML)"
    lines = [f"{title}: {len(result.gpus)} GPU budget(s) of {memory_gib} "
             "(from config.json files; no weights read)", "", "Models"]
    for name, shape in result.shapes.items():
        vision = f" (vision tower {shape.num_vision_params / 1e9:.3f} B)" if shape.num_vision_params else ""
        lines.append(f"  {name:<16} {shape.model_type:<12} {shape.num_params / 1e9:.3f} B params{vision}, "
                     f"{shape.num_layers} layers, roles: {', '.join(_roles_on(config, name)) or '-'}")
    lines += ["", "Placement"]
    for gpu in result.gpus:
        owners = ", ".join(c.owner for c in gpu.claims) or "idle"
        lines.append(f"  {_label(gpu.gpu):<10} {owners}")
    lines += ["", render_memory(result)]
    if fit is not None:
        lines += ["", render_box(fit)]
    if adapter_lines:
        lines += ["", "Adapters", *(f"  {line}" for line in adapter_lines)]
    if result.notes:
        lines += ["", "Notes", *(f"  {note}" for note in result.notes)]
    return "\n".join(lines)


def render_memory(result: Plan) -> str:
    """Each GPU's claims and their items, in GiB (also printed when ``serve`` refuses a config)."""
    lines = ["Memory per GPU (GiB)"]
    for gpu in result.gpus:
        capacity = f" of {gpu.capacity_bytes / GIB:.2f}" if gpu.capacity_bytes else " (host memory)"
        lines.append(f"  {_label(gpu.gpu)}: {gpu.used_bytes / GIB:.2f}{capacity} claimed")
        for claim in gpu.claims:
            lines.append(f"    {claim.owner}: {claim.share_bytes / GIB:.2f}")
            lines += [f"      {item.what:<62} {item.num_bytes / GIB:8.2f}" for item in claim.items]
    return "\n".join(lines)


def render_box(fit: BoxFit) -> str:
    """This box's GPUs against the plan, one row each (also printed when ``serve`` refuses a config)."""
    cuda = f"torch CUDA {fit.cuda}" if fit.cuda else "torch without CUDA"
    lines = [f"This box (NVML): {len(fit.box.gpus)} GPU(s); {cuda}; {fit.driver_line}",
             f"  {'GPU':<5} {'name':<28} {'free/total GiB':>15} {'needed GiB':>11} {'cc':>5}  verdict"]
    for row in fit.rows:
        gpu = row.gpu
        name, memory, cc = ("-", "-", "-") if gpu is None else (
            gpu.name, f"{gpu.free_bytes / GIB:.2f}/{gpu.total_bytes / GIB:.2f}", "%d.%d" % gpu.compute_capability)
        lines.append(f"  {row.index:<5} {name[:28]:<28} {memory:>15} {row.need_bytes / GIB:>11.2f} {cc:>5}  "
                     f"{row.verdict}")
    return "\n".join(lines)


def _roles_on(config: MIAConfig, engine: str) -> list[str]:
    return [name for name in config.roles if resolve_role(config, name)[1].engine == engine]


def _label(gpu: str) -> str:
    return f"GPU {gpu}" if gpu.isdigit() else gpu
