"""A fake of the few NVML calls ``mia_engine/deploy/gpu_probe.py`` makes, for CPU tests of what ``serve`` and
``--dry-run`` read from a GPU box. In-process, ``FakeNvml`` stands in for the ``pynvml`` module; for a
subprocess, ``shim`` writes a ``pynvml.py`` that builds one from ``$FAKE_NVML`` (put its folder first on
``PYTHONPATH``). Standard library only: the shim imports this file by path."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

GIB = 1024**3
H100 = {"name": "NVIDIA H100 80GB HBM3", "total_gib": 79.6474609375, "free_gib": 79.1, "cc": [9, 0]}
"""What NVML reports for an idle H100 80GB (81,559 MiB total)."""


class NVMLError(Exception):
    pass


class FakeNvml:
    """``gpus``: physical GPUs as dicts (name, total_gib, free_gib, cc, and optionally uuid)."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[dict], driver: str = "580.95.05", is_loaded: bool = True) -> None:
        self.gpus, self.driver, self.is_loaded = gpus, driver, is_loaded
        self.num_open = 0

    @classmethod
    def from_json(cls, text: str) -> FakeNvml:
        spec = json.loads(text)
        return cls(spec["gpus"], spec.get("driver", "580.95.05"), spec.get("is_loaded", True))

    def nvmlInit(self) -> None:
        if not self.is_loaded:
            raise NVMLError("Driver Not Loaded")
        self.num_open += 1

    def nvmlShutdown(self) -> None:
        self.num_open -= 1

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return self.driver.encode()  # bytes, as bindings before nvidia-ml-py 11.515 return

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict:
        if not 0 <= index < len(self.gpus):
            raise NVMLError("Invalid Argument")
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> dict:
        return next(gpu for gpu in self.gpus if gpu.get("uuid") == uuid)

    def nvmlDeviceGetName(self, handle: dict) -> str:
        return handle["name"]

    def nvmlDeviceGetMemoryInfo(self, handle: dict) -> SimpleNamespace:
        total, free = int(handle["total_gib"] * GIB), int(handle["free_gib"] * GIB)
        return SimpleNamespace(total=total, free=free, used=total - free)

    def nvmlDeviceGetCudaComputeCapability(self, handle: dict) -> tuple[int, int]:
        return tuple(handle["cc"])


def shim(folder: Path) -> Path:
    """A folder with a ``pynvml.py`` that is a ``FakeNvml`` of ``$FAKE_NVML`` (JSON: gpus, driver, is_loaded)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pynvml.py").write_text(
        "import importlib.util, os\n"
        f"_spec = importlib.util.spec_from_file_location('fake_nvml', {str(Path(__file__).resolve())!r})\n"
        "_module = importlib.util.module_from_spec(_spec)\n"
        "_spec.loader.exec_module(_module)\n"
        "_fake = _module.FakeNvml.from_json(os.environ['FAKE_NVML'])\n"
        "NVMLError = _module.NVMLError\n"
        "globals().update({name: getattr(_fake, name) for name in dir(_fake) if name.startswith('nvml')})\n")
    return folder
