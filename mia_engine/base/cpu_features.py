"""What this machine's CPU computes natively, read from ``/proc/cpuinfo`` when a component chooses its dtype.

Two components choose their dtype from it: the sentence encoder on a CPU device (``memory/embedder.py``)
and the engines on vLLM's CPU platform (``options.engine_dtype``). Without these flags oneDNN emulates
bfloat16 with float32 instructions plus conversions, which is slower than float32 itself.
"""

from __future__ import annotations

import platform
from pathlib import Path

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""CPU flags under which oneDNN computes bfloat16 in hardware; without them it is emulated (slower)."""
X86_MACHINES = ("x86_64", "amd64", "i386", "i686")
"""``platform.machine()`` names of an x86 CPU, as vLLM's ``Platform.get_cpu_architecture`` reads them."""


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo is absent, e.g. not Linux)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def has_native_bf16(flags: frozenset[str]) -> bool:
    return any(flag in flags for flag in NATIVE_BF16_FLAGS)


def emulates_bf16(flags: frozenset[str], machine: str | None = None) -> bool:
    """An x86 CPU (``machine``; None: this one) without native bfloat16, where oneDNN would emulate it."""
    machine = platform.machine() if machine is None else machine
    return machine.lower() in X86_MACHINES and not has_native_bf16(flags)
