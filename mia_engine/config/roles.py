"""``[roles.<name>]``: a role (planner, executor, manager, ...) is an engine, an optional LoRA adapter and
sampling defaults; each role name is a model id of the OpenAI endpoint. Whether its engine exists is the
root's rule (``root.py``)."""

from __future__ import annotations

from ..base.structs import Frozen


INIT_ADAPTER = "init"
"""``adapter = "init"``: a zero-B adapter (``init-adapter``) of the engine's model at its ``max_lora_rank``,
created in the data dir at the first start and reused after: a Planner that learns on a model of one's own."""


class SamplingDefaults(Frozen):
    """A role's sampling defaults; a request's own values win."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    presence_penalty: float = 0.0
    max_tokens: int = 0
    """Default completion length; 0 = up to the context length."""

    def __post_init__(self) -> None:
        if not 0 <= self.temperature <= 2 or not 0 < self.top_p <= 1 or self.max_tokens < 0:
            raise ValueError("temperature in [0, 2], top_p in (0, 1], max_tokens >= 0")


class RoleConfig(Frozen):
    """A role (planner, executor, manager, ...) = an engine + an optional LoRA adapter + sampling."""

    engine: str = ""
    """Name of the engine in ``[engines]``."""
    adapter: str = ""
    """LoRA adapter folder (PEFT format), ``embedded:<name>`` for one built with the embedded model, ``init``
    for a zero-B adapter created in the data dir at the first start, or empty for the base."""
    alias_of: str = ""
    """Serve this role as another role (e.g. judge = manager); other fields must stay empty."""
    sampling: SamplingDefaults = SamplingDefaults()
    """Defaults of requests sent to this role's model id. The research agent (model ``mia``) sends
    its own per-stage sampling from ``[agent.sampling]`` (``agent.sampling.planner``, ...), which
    decides for every call the loop makes."""
    chat_template_kwargs: dict[str, bool | int | float | str] = {}
    """Extra variables of the chat template for every prompt of this role, e.g.
    ``{enable_thinking = false}`` on Qwen3 for the Manager, judge and Router (the reference runs them
    without thinking)."""

    def __post_init__(self) -> None:
        if self.alias_of and (self.engine or self.adapter or self.chat_template_kwargs):
            raise ValueError("an alias takes no engine, adapter or chat_template_kwargs")
