"""vLLM's CPU platform, with the Punica wrapper chosen by each engine's config (the platform is vLLM's
extension point for it: ``Platform.get_punica_wrapper``).

Loaded by qualname through ``engines/cpu_lora.py: platform_plugin`` once vLLM has picked the platform,
never imported by this package otherwise.
"""

from __future__ import annotations

from vllm.platforms.cpu import CpuPlatform

from .cpu_lora import CONFIG_KEY

GROUPED_WRAPPER = "mia_engine.engines.cpu_punica.GroupedPunicaWrapperCPU"


class MIACpuPlatform(CpuPlatform):
    """Everything is vLLM's CPU platform but the Punica wrapper of an engine that asked for grouped ops."""

    @classmethod
    def get_punica_wrapper(cls) -> str:
        """vLLM builds the wrapper while it loads the model, inside its config context: the config read
        here is the engine's own, so two engines in one environment may choose differently."""
        from vllm.config import get_current_vllm_config

        extra = get_current_vllm_config().additional_config
        choice = extra.get(CONFIG_KEY, "vllm") if isinstance(extra, dict) else "vllm"
        if choice == "grouped":
            return GROUPED_WRAPPER
        if choice != "vllm":
            raise ValueError(f"additional_config[{CONFIG_KEY!r}] = {choice!r}: expected 'grouped' or 'vllm'")
        return super().get_punica_wrapper()
