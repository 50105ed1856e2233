"""Every role's LoRA adapter checked from its files before any engine starts (``serve`` and ``--dry-run``).

An adapter vLLM cannot load fails only inside its worker, after every engine has loaded, so each role's
adapter folder is checked here first, from ``adapter_config.json`` and the safetensors header (no tensor
is read): it exists, is a plain LoRA of a rank the engine serves (``max_lora_rank``), targets only the
decoder's linear layers (``models.lora.DECODER_LORA_TARGETS``), and each matrix has the shape the base
model's ``config.json`` gives that layer. A refusal is one line naming the role's ``adapter`` field and,
for a missing folder, the command that creates one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from ..config import ConfigError, MIAConfig
from ..config.roles import INIT_ADAPTER
from ..engines.adapters import AdapterError, read_adapter_config
from ..models.embedded import is_embedded
from ..models.lora import DECODER_LORA_TARGETS, lora_shapes

_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")
_LAYERS = ".layers."


def check_role_adapters(config: MIAConfig, model_dir: Callable[[str], Path],
                        adapter_dir: Callable[[str, str], Path], *, include_embedded: bool = True) -> list[str]:
    """A line per role adapter that passed; raises ``ConfigError`` naming ``roles.<role>.adapter``.
    ``model_dir`` maps an engine's ``model`` to its folder, ``adapter_dir`` a role's ``adapter`` and its
    engine's ``model`` to the adapter folder. ``include_embedded`` False skips the project's embedded
    models and adapters (built by it on first use; ``serve`` does not build them before it listens)."""
    lines = []
    for name, role in config.roles.items():
        if role.alias_of or not role.adapter or role.adapter == INIT_ADAPTER:  # init: made at the first start
            continue
        field, engine = f"roles.{name}.adapter", config.engines[role.engine]
        if not include_embedded and is_embedded(role.adapter):
            continue
        path = adapter_dir(role.adapter, engine.model)
        if not path.is_dir():
            raise ConfigError(f"{field}: {path} does not exist; create a zero-initialised adapter with "
                              f"`python -m mia_engine init-adapter --base {engine.model} --rank "
                              f"{engine.max_lora_rank} --out {path}`")
        base_dir = model_dir(engine.model) if include_embedded or not is_embedded(engine.model) else None
        try:
            lines.append(f"{field}: {check_adapter_files(path, engine.max_lora_rank, base_dir)}")
        except AdapterError as err:
            raise ConfigError(f"{field}: {err}") from None
    return lines


def check_adapter_files(path: Path, max_rank: int, base_dir: Path | None) -> str:
    """One adapter against its base model, from files alone; raises ``AdapterError``. ``base_dir`` None
    (an embedded base that is not built yet) skips the shapes, which need the base's ``config.json``."""
    adapter = read_adapter_config(path, max_rank)
    rank, targets = adapter["r"], adapter.get("target_modules")
    if not isinstance(targets, list) or not targets:
        raise AdapterError(f"{path}: target_modules must be a list of module names, got {targets!r}")
    unknown = sorted(set(targets) - set(DECODER_LORA_TARGETS))
    if unknown:
        raise AdapterError(f"{path}: targets {', '.join(unknown)}, which vLLM and the learner do not adapt "
                           f"(supported: {', '.join(DECODER_LORA_TARGETS)})")
    if adapter.get("modules_to_save") or adapter.get("bias", "none") != "none":
        raise AdapterError(f"{path}: modules_to_save and LoRA biases are not served by vLLM")
    shapes = _header_shapes(path / "adapter_model.safetensors")
    if base_dir is None:
        return f"{path} (rank {rank}, {len(targets)} target modules, {len(shapes)} matrices; shapes not checked)"
    expected = _expected_shapes(_text_config(base_dir), targets, shapes)
    for key, shape in shapes.items():
        match = _KEY.match(key)
        if match is None:
            raise AdapterError(f"{path}: {key} is not a LoRA A/B matrix")
        out_in = expected.get(match["module"])
        if out_in is None:
            raise AdapterError(f"{path}: {key} adapts a layer the base model {base_dir} does not have")
        want = (rank, out_in[1]) if match["ab"] == "A" else (out_in[0], rank)
        if tuple(shape) != want:
            raise AdapterError(f"{path}: {key} has shape {tuple(shape)}, the base model needs {want} (rank {rank})")
    return f"{path} (rank {rank}, {len(targets)} target modules, {len(shapes)} matrices)"


def _header_shapes(weights: Path) -> dict[str, list[int]]:
    """Tensor shapes from a safetensors header (8-byte length + JSON), no tensor read."""
    try:
        with weights.open("rb") as file:
            length = int.from_bytes(file.read(8), "little")
            if not 0 < length <= 100 * 2**20:
                raise ValueError(f"header length {length}")
            header = json.loads(file.read(length))
    except (OSError, ValueError) as err:
        raise AdapterError(f"{weights}: not a safetensors file ({err})") from None
    return {key: value["shape"] for key, value in header.items() if key != "__metadata__"}


def _text_config(base_dir: Path) -> dict:
    config = json.loads((base_dir / "config.json").read_text())
    return config.get("text_config", config)


def _expected_shapes(text_config: dict, targets: list[str], shapes: dict[str, list[int]]) -> dict[str, tuple[int, int]]:
    """(out, in) of each targeted layer, under the module prefix the adapter's keys use (``model`` for a
    causal LM, the language model's path inside a vision-language model)."""
    prefixes = {m["module"].partition(_LAYERS)[0] for key in shapes if (m := _KEY.match(key)) and _LAYERS in key}
    expected: dict[str, tuple[int, int]] = {}
    for prefix in prefixes or {"model"}:
        expected.update(lora_shapes(text_config, targets, prefix))
    return expected
