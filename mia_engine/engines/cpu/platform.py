"""vLLM's CPU platform, with four changes made through its extension points and only for an engine this
project starts (our keys in its ``additional_config``, ``options.py``): the Punica wrapper
(``Platform.get_punica_wrapper``), and the engine processes' allocator, async scheduling and worker class
(``Platform.check_and_update_config``, where vLLM's own CPU platform sets ``LD_PRELOAD`` for the
processes it is about to spawn, turns async scheduling off and names its worker). The first three follow
the engine's config; the worker (``worker.py``: seeded requests survive chunked prefills) is a fix, always
on. Any other vLLM program in this environment gets vLLM's CPU platform unchanged.

Loaded by qualname through ``engines/platforms.py: platform_plugin`` once vLLM has picked the platform,
never imported by this package otherwise.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from vllm.platforms.cpu import CpuPlatform

from .malloc import preload_tcmalloc
from .options import ASYNC_SCHEDULING_KEY, LORA_OPS_KEY, MALLOC_KEY, is_ours, read_option

if TYPE_CHECKING:
    from vllm.config import VllmConfig

log = logging.getLogger(__name__)

GROUPED_WRAPPER = "mia_engine.engines.cpu.punica.GroupedPunicaWrapperCPU"
WORKER_CLS = "mia_engine.engines.cpu.worker.MIACPUWorker"
"""Our engines' worker (``worker.py``), imported by vLLM in the worker process only."""
VLLM_WORKER_CLS = "vllm.v1.worker.cpu_worker.CPUWorker"
"""The worker vLLM's CPU platform chooses by itself; only that choice is replaced."""


class MIACpuPlatform(CpuPlatform):
    """vLLM's CPU platform but for three things an engine may ask for (the Punica wrapper on grouped ops,
    the system's TCMalloc, async scheduling) and the worker of ``worker.py``."""

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        """Runs in the process that builds the engine's config, before it spawns the engine core (which
        spawns the worker), so ``LD_PRELOAD`` set here reaches both. Without our keys (a plain ``vllm
        serve``) vLLM's own choices stand."""
        super().check_and_update_config(vllm_config)
        if is_ours(vllm_config.additional_config) and vllm_config.parallel_config.worker_cls == VLLM_WORKER_CLS:
            vllm_config.parallel_config.worker_cls = WORKER_CLS  # seeded requests survive chunked prefills
        if read_option(vllm_config.additional_config, MALLOC_KEY) == "tcmalloc":
            preload_tcmalloc(os.environ)
        if read_option(vllm_config.additional_config, ASYNC_SCHEDULING_KEY):
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
            log.warning("cpu.async_scheduling left off: vLLM does not schedule ahead with %s", ", ".join(refused))
            return
        vllm_config.scheduler_config.async_scheduling = True
        log.info("the engine schedules ahead: async scheduling on CPU (cpu.async_scheduling)")

    @classmethod
    def get_punica_wrapper(cls) -> str:
        """vLLM builds the wrapper while it loads the model, inside its config context: the config read
        here is the engine's own, so two engines in one environment may choose differently."""
        from vllm.config import get_current_vllm_config

        if read_option(get_current_vllm_config().additional_config, LORA_OPS_KEY) == "grouped":
            return GROUPED_WRAPPER
        return super().get_punica_wrapper()
