"""The oldest NVIDIA driver each CUDA major runs on, and the one-line verdict on a driver: read by
``serve``'s preflight (``deploy/box.py``) and by ``scripts/cuda_stack.py driver`` (``install.sh``). Standard
library only: the install script imports it before anything else of the package need import."""

from __future__ import annotations

MIN_DRIVER = {12: "525.60.13", 13: "580"}
"""Oldest Linux x86_64 driver each CUDA major runs on (minor version compatibility): NVIDIA's CUDA
Compatibility guide, "Minor Version Compatibility", table 1 (CUDA 13.x >= 580, 12.x >= 525), and the
CUDA Toolkit release notes' driver table for 12.x (>= 525.60.13);
https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html"""

SKIP_DRIVER_CHECK_ENV = "MIA_SKIP_DRIVER_CHECK"
"""Set to 1, install.sh and ``serve`` let an older driver pass: NVIDIA's CUDA forward compatibility
package (``cuda-compat``) runs a newer CUDA on it, which the driver version alone does not show."""


def driver_verdict(driver: str, cuda: str) -> tuple[bool, str]:
    """(can driver ``driver`` run CUDA ``cuda``?, one line saying so or what driver is needed)."""
    major = int(cuda.split(".")[0])
    needed = MIN_DRIVER.get(major)
    if needed is None:
        return False, (f"NVIDIA driver {driver}; no known minimum for CUDA {cuda}: see NVIDIA's compatibility "
                       f"table, and set {SKIP_DRIVER_CHECK_ENV}=1 where it runs")
    if driver_tuple(driver) >= driver_tuple(needed):
        return True, f"NVIDIA driver {driver} runs CUDA {cuda} (needs >= {needed}): OK"
    return False, (f"NVIDIA driver {driver} is too old for CUDA {cuda}, which needs >= {needed}: update the "
                   f"driver (or, with NVIDIA's CUDA forward compatibility package, set {SKIP_DRIVER_CHECK_ENV}=1)")


def driver_tuple(version: str) -> tuple[int, ...]:
    """``"580.95.05"`` as ``(580, 95, 5)``; ValueError for anything that is not dotted numbers."""
    return tuple(int(part) for part in version.strip().split("."))


def torch_cuda() -> str | None:
    """The CUDA version this environment's torch was built for (``"13.0"``); None for a CPU build or no torch
    (imported here, not at the top: ``scripts/cuda_stack.py check`` runs where torch is not installed)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.version.cuda
