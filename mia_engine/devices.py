"""The GPU and CUDA stream of each of the serving process's own GPU components.

Besides the engines (which vLLM places in processes of its own), the serving process runs GPU work in
three components, each on a dedicated thread: the memory store (score kernel, key matrices, a GPU FAISS
index), the sentence encoders, and the test-time learner. CUDA's current device and torch's current
stream belong to a thread, and a thread that never sets them launches on GPU 0's default stream whatever
its tensors' device: a Triton kernel then runs on the wrong GPU, and FAISS's device switch restores
GPU 0 and opens a CUDA context there, on a GPU the budget gives to an engine.

So each component's thread is bound once, as it starts, to its configured GPU and to a stream of its
own (``bind_thread``): serving work (memory, encoders) on a high-priority stream, the learner on a
low-priority one, so the GPU's scheduler runs a search's kernels ahead of a learner step's instead of
queueing them behind it on one shared stream.

Device names are resolved once, before anything starts (``resolved_devices``): ``cuda`` and ``auto``
become an explicit ``cuda:N``, the same GPU the deployment budget (``deploy/budget.py``) counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import msgspec

if TYPE_CHECKING:
    from .config import MIAConfig

Priority = Literal["serving", "learning"]
"""``serving``: the GPU's highest stream priority; ``learning``: its lowest."""

STREAM_PRIORITY: dict[Priority, int] = {"serving": -100, "learning": 0}
"""torch stream priorities (a lower number runs first): torch maps -100 to the GPU's highest priority, and
0 is CUDA's lowest."""

DEFAULT_GPU = "cuda:0"
"""What ``cuda`` (torch's current device, GPU 0 in a fresh thread) and ``auto`` on a GPU machine mean."""


def resolve_device(name: str, has_gpu: bool | None = None) -> str:
    """``cpu`` or an explicit ``cuda:N``: ``cuda`` is GPU 0, ``auto`` is GPU 0 where there is a GPU
    (``has_gpu``; None = whether this machine has one, asked only for ``auto``)."""
    if name == "auto":
        return DEFAULT_GPU if (machine_has_gpu() if has_gpu is None else has_gpu) else "cpu"
    if name == "cuda":
        return DEFAULT_GPU
    return name


def gpu_index(name: str, has_gpu: bool | None = None) -> int | None:
    """The GPU a device name resolves to (None: the CPU)."""
    resolved = resolve_device(name, has_gpu)
    return int(resolved.removeprefix("cuda:")) if resolved.startswith("cuda:") else None


def serving_device_fields(config: MIAConfig) -> dict[str, str]:
    """The config fields that place the serving process's own components, with their values."""
    memory = config.memory
    return {"memory.embedder.device": memory.embedder.device, "memory.score_device": memory.score_device,
            "memory.index_device": memory.index_device, "tools.embedder.device": config.tools.embedder.device,
            "learner.device": config.learner.device}


def resolved_devices(config: MIAConfig, has_gpu: bool | None = None) -> MIAConfig:
    """``config`` with every component device explicit (``resolve_device``), so what runs is what the
    budget counted."""
    replace = msgspec.structs.replace
    memory = config.memory
    resolve = lambda name: resolve_device(name, has_gpu)  # noqa: E731
    return replace(
        config,
        learner=replace(config.learner, device=resolve(config.learner.device)),
        memory=replace(memory, score_device=resolve(memory.score_device),
                       embedder=replace(memory.embedder, device=resolve(memory.embedder.device))),
        tools=replace(config.tools, embedder=replace(config.tools.embedder,
                                                     device=resolve(config.tools.embedder.device))))


def machine_has_gpu() -> bool:
    """Whether torch sees a CUDA GPU here (counts devices; creates no CUDA context)."""
    import torch

    return torch.cuda.is_available()


def bind_device(device: str) -> str:
    """Make ``device`` (any name ``resolve_device`` takes: a bare ``cuda`` has no index, which torch's
    ``set_device`` refuses) the calling thread's CUDA device; nothing on the CPU. Returns the resolved
    name."""
    device = resolve_device(device)
    if device.startswith("cuda"):
        import torch

        torch.cuda.set_device(torch.device(device))
    return device


def bind_thread(device: str, priority: Priority) -> None:
    """Make ``device`` the calling thread's CUDA device and a new stream of ``priority`` its current
    stream; nothing on the CPU. Call it first thing in a component's own thread."""
    device = bind_device(device)
    if not device.startswith("cuda"):
        return
    import torch

    torch.cuda.set_stream(torch.cuda.Stream(device=torch.device(device), priority=STREAM_PRIORITY[priority]))


def thread_binder(device: str, priority: Priority) -> Callable[[], None]:
    """``bind_thread`` for a ``ThreadPoolExecutor(initializer=...)``."""
    return lambda: bind_thread(device, priority)
