"""vLLM's CPU worker, with a model runner that can rewind a seeded request's random generator.

For a request whose prompt is still being prefilled in chunks, vLLM's model runner samples a token, drops
it, and rewinds the request's own generator (a request with a ``seed`` has one) as if nothing had been
drawn: ``GPUModelRunner._bookkeeping_sync`` calls ``gen.set_offset(gen.get_offset() - 4)``, arithmetic on
a CUDA generator's Philox offset. A CPU generator (Mersenne Twister) has no offset: ``get_offset`` raises
``RuntimeError: CPU Generator does not use offset`` in the worker, and the engine core dies. Any client
could end the server that way, with one sampled request carrying a ``seed`` and a prompt longer than one
step's token budget, or a shorter one that shares a step with others.

``SeedRewindingRunner`` saves those requests' generator states before sampling and puts them back before
vLLM's bookkeeping, which then finds no generator to rewind for them: the same rewind the offset
arithmetic does on a GPU, so a seeded request samples the same tokens however its prompt was chunked.
``platform.py`` names ``MIACPUWorker`` (by qualname: vLLM imports it in the worker process) as the worker
class of the engines this project starts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker


class SeedRewindingRunner(CPUModelRunner):
    """vLLM's CPU model runner; a seeded request whose sampled token is dropped (a prefill chunk) gets its
    generator back as it was before the draw. Its one attribute of its own, the states held between a
    step's sampling and its bookkeeping, is set by ``_sample`` and emptied by ``_bookkeeping_sync``."""

    _held_generator_states: dict[int, torch.Tensor] = {}

    def _sample(self, logits: torch.Tensor | None, spec_decode_metadata: Any) -> Any:
        self._held_generator_states = held_states(
            self.input_batch.generators, self.discard_request_mask.np[: self.input_batch.num_reqs])
        return super()._sample(logits, spec_decode_metadata)

    def _bookkeeping_sync(self, *args: Any, **kwargs: Any) -> Any:
        held, self._held_generator_states = self._held_generator_states, {}
        generators = self.input_batch.generators
        rewound = restore(generators, held)
        try:
            return super()._bookkeeping_sync(*args, **kwargs)
        finally:
            generators.update(rewound)


def held_states(generators: dict[int, torch.Generator], discard_mask: np.ndarray) -> dict[int, torch.Tensor]:
    """The state of each generator whose request's sampled token will be dropped, by batch index."""
    return {int(i): generators[int(i)].get_state() for i in np.nonzero(discard_mask)[0] if int(i) in generators}


def restore(generators: dict[int, torch.Generator], held: dict[int, torch.Tensor]) -> dict[int, torch.Generator]:
    """Set each held generator back to its saved state and take it out of ``generators`` (vLLM's rewind
    loop must not see it); returns them, for the caller to put back."""
    taken = {}
    for index, state in held.items():
        generator = generators.pop(index, None)
        if generator is not None:
            generator.set_state(state)
            taken[index] = generator
    return taken


class MIACPUWorker(CPUWorker):
    """vLLM's CPU worker, running ``SeedRewindingRunner`` instead of vLLM's CPU model runner."""

    def init_device(self) -> None:
        super().init_device()
        if type(self.model_runner) is CPUModelRunner:  # vLLM's V2 runner, if chosen, is left as it is
            self.model_runner.__class__ = SeedRewindingRunner
