"""Resolving ``embedded:<name>`` model and adapter references to folders in the model cache."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from .cache import build_once
from .smollm2 import build_smollm2
from .tiny import build_tiny
from .tiny_vl import build_tiny_vl

PREFIX = "embedded:"

# name -> (cache folder, builder). Bump the folder's suffix whenever a builder's output changes.
BUILDERS: dict[str, tuple[str, Callable[[Path], None]]] = {
    "tiny": ("tiny-v1", build_tiny),
    "tiny-vl": ("tiny-vl-v1", build_tiny_vl),
    "smollm2": ("smollm2-135m-instruct-v1", build_smollm2),
}


def is_embedded(spec: str) -> bool:
    return spec.startswith(PREFIX)


def embedded_root(spec: str, home: Path) -> Path:
    """The built folder (``base/`` + ``adapters/``) of an embedded model, building it on first use."""
    name = spec.removeprefix(PREFIX)
    if name not in BUILDERS:
        raise ValueError(f"unknown embedded model {spec!r}; known: {', '.join(PREFIX + n for n in BUILDERS)}")
    folder, build = BUILDERS[name]
    return build_once(home / "models" / folder, build)


def model_dir(spec: str, home: Path, *, download: Literal["", "config", "all"] = "") -> Path:
    """The Hugging Face folder an engine loads: an embedded model's, a local folder, or the snapshot of a
    Hugging Face model id in the local Hugging Face cache. ``download``: what to fetch from the Hub into
    that cache when the id's snapshot lacks it (``config``: its ``config.json``, ``all``: the files vLLM
    loads, with a progress bar), unless ``HF_HUB_OFFLINE=1``; empty = nothing."""
    if is_embedded(spec):
        return embedded_root(spec, home) / "base"
    path = Path(spec).expanduser()
    if (path / "config.json").is_file():
        return path
    if not is_hf_model_id(spec):
        raise FileNotFoundError(f"{spec}: not a local model folder (no config.json) nor a Hugging Face model id")
    if download and not hf_offline():
        try:
            return hf_download(spec, config_only=download == "config")
        except OSError as err:  # huggingface_hub's errors: not found, gated, no connection (after its retries)
            raise FileNotFoundError(f"{spec}: not in the Hugging Face cache, and fetching it from the Hub failed "
                                    f"({type(err).__name__}); check the id and the connection, or put the model in "
                                    "the cache first (`hf download`) and set HF_HUB_OFFLINE=1") from None
    cached = hf_cache_dir(spec)
    if cached is None:
        how = ("HF_HUB_OFFLINE=1 is set: unset it to download it, or run `hf download " f"{spec}` first"
               if download else f"the server downloads nothing here: run `hf download {spec}` first")
        raise FileNotFoundError(f"{spec}: neither a local model folder nor a model in the Hugging Face cache; {how}")
    return cached


def hf_offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub reads it."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
"""Weight files, in vLLM's order of preference: only the first kind a repository has is fetched."""


def hf_download(repo_id: str, *, config_only: bool = False) -> Path:
    """The snapshot folder of ``repo_id`` in the Hugging Face cache, after fetching what it lacks: its
    ``config.json`` alone, or the configs, tokenizer files and one kind of weights (as vLLM fetches a
    model), with huggingface_hub's progress bars. A file already cached is not fetched again."""
    import logging

    from huggingface_hub import HfApi, hf_hub_download, snapshot_download

    if config_only:
        return Path(hf_hub_download(repo_id, "config.json")).parent
    files = [sibling.rfilename for sibling in HfApi().model_info(repo_id).siblings or ()]
    weights = next((p for p in WEIGHT_PATTERNS if any(fnmatch.fnmatch(f, p) for f in files)), WEIGHT_PATTERNS[0])
    logging.getLogger(__name__).info("fetching %s from the Hugging Face Hub (%s weights) into its cache",
                                     repo_id, weights)
    return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken",
                                                           weights]))


def is_hf_model_id(spec: str) -> bool:
    """``name`` or ``org/name``, as the Hub spells repository ids (not a path that merely does not exist)."""
    return spec.count("/") <= 1 and not spec.startswith((".", "/", "~")) and "\\" not in spec


def hf_cache_dir(repo_id: str) -> Path | None:
    """The cached snapshot of ``repo_id`` (its ``main``) in the Hugging Face cache (``HF_HUB_CACHE``, or
    ``HF_HOME/hub``), when it holds a ``config.json``; None otherwise. Offline: never downloads."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, FileNotFoundError):
        return None
    return folder if (folder / "config.json").is_file() else None


def adapter_dir(spec: str, engine_model: str, home: Path) -> Path:
    """The PEFT folder of a role's adapter; ``embedded:<role>`` needs an embedded base model."""
    if not is_embedded(spec):
        return Path(spec).expanduser()
    if not is_embedded(engine_model):
        raise ValueError(f"adapter {spec!r} needs an embedded base model, not {engine_model!r}")
    path = embedded_root(engine_model, home) / "adapters" / spec.removeprefix(PREFIX)
    if not path.is_dir():
        raise FileNotFoundError(f"adapter {spec!r} is not part of {engine_model!r}")
    return path
