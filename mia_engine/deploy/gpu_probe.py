"""What this box's GPUs are, read through NVML (``pynvml``, the ``nvidia-ml-py`` package of the ``gpu`` extra)
before any engine starts: per GPU its name, total and free memory and compute capability, and the driver.
NVML creates no CUDA context. Without NVML (a CPU box, no NVIDIA driver, the package absent) the probe
returns None and the budget goes by the config's ``[gpus]`` figures."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec


class GpuInfo(msgspec.Struct, frozen=True):
    """One GPU as NVML reports it."""

    index: int
    """The GPU's id as the config names it (``devices``, ``cuda:N``): the physical id, or the position in
    ``CUDA_VISIBLE_DEVICES`` when that is set."""
    name: str
    total_bytes: int
    free_bytes: int
    """What no process holds now (other users of the GPU included)."""
    compute_capability: tuple[int, int]


class Box(msgspec.Struct, frozen=True):
    """The GPUs this process can use, in the config's numbering, and the NVIDIA driver."""

    driver: str
    gpus: list[GpuInfo]


def nvml_module() -> Any | None:
    """The NVML bindings, or None where the package is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml




def probe_box(environ: Mapping[str, str]) -> Box | None:
    """This box's GPUs and driver through NVML, or None where NVML does not answer."""
    nvml = nvml_module()
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:  # no driver loaded, no libnvidia-ml.so
        return None
    try:
        handles = _visible_handles(nvml, environ.get("CUDA_VISIBLE_DEVICES"))
        gpus = [_gpu_info(nvml, index, handle) for index, handle in enumerate(handles)]
        return Box(_text(nvml.nvmlSystemGetDriverVersion()), gpus)
    except nvml.NVMLError:
        return None
    finally:
        nvml.nvmlShutdown()


def _visible_handles(nvml: Any, visible: str | None) -> list[Any]:
    """NVML handles in CUDA's numbering: every GPU, or ``CUDA_VISIBLE_DEVICES``'s ids and ``GPU-`` UUIDs in
    its order, up to the first entry CUDA would not accept (as CUDA does)."""
    count = nvml.nvmlDeviceGetCount()
    if visible is None:
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    handles = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.isdigit() and int(entry) < count:
            handles.append(nvml.nvmlDeviceGetHandleByIndex(int(entry)))
        elif entry.startswith("GPU-"):
            handles.append(nvml.nvmlDeviceGetHandleByUUID(entry))
        else:
            break
    return handles


def _gpu_info(nvml: Any, index: int, handle: Any) -> GpuInfo:
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    return GpuInfo(index, _text(nvml.nvmlDeviceGetName(handle)), int(memory.total), int(memory.free),
                   (int(major), int(minor)))


def _text(value: str | bytes) -> str:
    """NVML strings (bytes from bindings before nvidia-ml-py 11.515)."""
    return value.decode() if isinstance(value, bytes) else value
