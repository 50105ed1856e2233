"""The text ``serve --dry-run`` prints: placement, then each GPU's memory budget in GiB."""

from __future__ import annotations

from ..config import MIAConfig, resolve_role
from .budget import GIB, Plan


def render(config: MIAConfig, result: Plan, adapter_lines: list[str] = (), title: str = "MIA Engine dry run") -> str:
    lines = [f"{title}: {len(result.gpus)} GPU budget(s) of {config.gpus.memory_gib:g} GiB "
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


def _roles_on(config: MIAConfig, engine: str) -> list[str]:
    return [name for name in config.roles if resolve_role(config, name)[1].engine == engine]


def _label(gpu: str) -> str:
    return f"GPU {gpu}" if gpu.isdigit() else gpu
