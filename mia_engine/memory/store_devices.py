"""The devices of the experience store: where its score runs and which GPU its thread is bound to."""

from __future__ import annotations

import torch

from ..config.memory import MemoryConfig
from ..devices import resolve_device


def score_device(name: str) -> torch.device:
    """The device of the score's key matrices (``memory.score_device``, resolved)."""
    return torch.device(resolve_device(name))


def store_device(config: MemoryConfig) -> str:
    """The GPU the store's thread is bound to (``devices.bind_thread``): the score's, else the FAISS
    index's (FAISS switches to its GPU and back to the thread's device for every call), else the CPU."""
    for name in (config.score_device, config.index_device):
        device = resolve_device(name)
        if device != "cpu":
            return device
    return "cpu"
