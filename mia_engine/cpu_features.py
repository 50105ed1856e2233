"""What this machine's CPU computes natively, read from ``/proc/cpuinfo`` when a component chooses its dtype.

Two components choose their dtype from it: the sentence encoder (``memory/embedder.py``) and the vLLM
engines (``engines/cpu_platform.py``). Without these flags oneDNN emulates bfloat16 with float32
instructions plus conversions, and that is slower than float32 itself (bench/RESULTS.md sections 0, 8).
"""

from __future__ import annotations

from pathlib import Path

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""CPU flags under which oneDNN computes bfloat16 in hardware; without them it is emulated (slower)."""


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
