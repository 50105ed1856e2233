"""``serve MODEL``: the config of one base model that serves every role, as ``vllm serve MODEL`` serves one
model. The Planner, Executor and Manager share its engine through multi-LoRA (the design card's layout):
the Planner on a zero-B adapter created in the data dir at the first start (``INIT_ADAPTER``), the
Executor and the Manager (judge, Router) on the bare model. Clients name it by MODEL as given (or
``--served-model-name``), besides ``mia`` and the role names.

The agent's profile follows the model's size (``SMALL_MODEL_PARAMS``): a model of 1B+ parameters runs the
paper's loop, a smaller one the embedded default's small-model profile and sizing (``configs/default.toml``).
On a GPU the engine takes vLLM's defaults (CUDA graphs, the model's context length); its memory share is
computed after what the serving process keeps on that GPU (``deploy/budget.py: engine_share``). With
``--config X`` the engine of X's Planner serves MODEL instead of X's model, and the rest of X stays."""

from __future__ import annotations

import re
from typing import Any

from ..base.structs import Frozen
from .roles import INIT_ADAPTER

SMALL_MODEL_PARAMS = 1_000_000_000
"""Parameters below which a model runs the small-model profile (the 135M default's): the paper's
budgets and free-form plans are for 7-8B models, which a model this small fills with repetition."""
CPU_MAX_MODEL_LEN = 8192
"""Context length on CPU when the model allows more (tokens): vLLM's CPU KV cache is a fixed space
(``engines.<name>.cpu.kv_cache_space_gib``) that must hold one whole sequence."""
_SMALL_ENGINE_FIELDS = ("max_model_len", "cpu", "max_num_seqs", "compact_json")
"""The embedded default's engine sizing that a small model keeps (``configs/default.toml``); not its warm-up,
which a ``--max-num-seqs`` below it would contradict."""


class ModelFacts(Frozen):
    """What the config takes from the model ``serve`` names, read from its ``config.json``."""

    model: str
    """MODEL as given: a local folder or a Hugging Face id."""
    num_params: int
    """Parameters of its text decoder (``deploy/shapes.py``)."""
    context_len: int
    """Its ``max_position_embeddings`` (tokens; 0 = unknown)."""
    on_gpu: bool
    """The engine runs on a GPU (vLLM's CUDA build on a machine with one, or a dry run planning GPUs)."""


def engine_name(model: str) -> str:
    """The engine's table name for MODEL: its last path part in lower case, other characters than
    letters, digits, ``-`` and ``_`` as ``-`` (``Qwen/Qwen2.5-7B`` -> ``qwen2-5-7b``), for
    ``--engines.NAME.<field>``."""
    last = model.rstrip("/").rsplit("/", 1)[-1].lower()
    return re.sub(r"[^a-z0-9_-]+", "-", last).strip("-") or "model"


def with_model(raw: dict[str, Any] | None, facts: ModelFacts, default: dict[str, Any],
               served_names: list[str] | None = None) -> dict[str, Any]:
    """The raw config (as TOML reads it) that serves ``facts.model``: ``raw`` (a ``--config`` file) with its
    Planner's engine on MODEL, or, for None, the one-model config of this module's docstring, which takes
    the small-model sizing from ``default`` (``configs/default.toml``). ``served_names``:
    ``--served-model-name`` (None: MODEL as given)."""
    names = served_names or [facts.model]
    if raw is not None:
        return _replace_model(raw, facts, names)
    small = facts.num_params < SMALL_MODEL_PARAMS
    name = engine_name(facts.model)
    if name in ("planner", "executor", "manager", "judge", "router"):
        name += "-base"
    engine: dict[str, Any] = {"model": facts.model, "served_model_name": names,
                              "structured_outputs_backend": "xgrammar"}
    if small:
        engine.update({k: v for k, v in next(iter(default["engines"].values())).items() if k in _SMALL_ENGINE_FIELDS})
    context = facts.context_len or engine.get("max_model_len", CPU_MAX_MODEL_LEN)
    if facts.on_gpu:
        engine.update(max_model_len=context, enforce_eager=False)
    else:
        engine["max_model_len"] = min(context, engine.get("max_model_len", CPU_MAX_MODEL_LEN))
    roles: dict[str, Any] = {
        "planner": {"engine": name, "adapter": INIT_ADAPTER},
        "executor": {"engine": name},
        "manager": {"engine": name, "sampling": {"temperature": 0.0}},
        "judge": {"alias_of": "manager"},
        "router": {"alias_of": "manager"},
    }
    config: dict[str, Any] = {"engines": {name: engine}, "roles": roles}
    if small:
        config.update(agent=default["agent"], memory=default["memory"])
        roles["executor"]["sampling"] = default["roles"]["executor"].get("sampling", {})
    return config


def _replace_model(raw: dict[str, Any], facts: ModelFacts, names: list[str]) -> dict[str, Any]:
    """``--config X`` with MODEL: the engine X's Planner runs on serves MODEL; that engine's roles drop the
    adapters built for X's own model (``embedded:``), the Planner taking a zero-B one instead."""
    roles = raw.get("roles", {})
    planner = roles.get("planner", {})
    planner = roles.get(planner.get("alias_of"), planner)
    engines = raw.get("engines", {})
    name = planner.get("engine") or next(iter(engines), None)
    if name is None or name not in engines:
        return raw  # the config's own checks name what is missing
    engines[name] = {**engines[name], "model": facts.model, "served_model_name": names}
    for role_name, role in roles.items():
        if role.get("engine") == name and str(role.get("adapter", "")).startswith("embedded:"):
            role = {k: v for k, v in role.items() if k != "adapter"}
            roles[role_name] = {**role, "adapter": INIT_ADAPTER} if role_name == "planner" else role
    return raw
