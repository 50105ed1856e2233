"""The CPU worker's rewind of a seeded request's generator (``engines/cpu/worker.py``), on real torch CPU
generators; the served engine's side is in ``tests/server/test_openai_api.py``
(``test_a_seeded_prompt_longer_than_one_step_samples_as_if_in_one``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from mia_engine.engines.cpu.worker import SeedRewindingRunner, held_states, restore


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def test_a_cpu_generator_has_no_offset_to_rewind() -> None:
    """What vLLM's own rewind (``gen.set_offset(gen.get_offset() - 4)``) meets on a CPU."""
    with pytest.raises(RuntimeError, match="does not use offset"):
        _seeded(1).get_offset()


def test_a_dropped_draw_is_undone_and_a_kept_one_is_not() -> None:
    generators = {0: _seeded(1), 2: _seeded(2), 3: _seeded(3)}
    first_draws = {i: torch.rand(4, generator=_seeded(seed)) for i, seed in ((0, 1), (2, 2), (3, 3))}
    held = held_states(generators, np.array([True, True, False, True]))  # index 1: a request without a seed
    assert sorted(held) == [0, 3]
    for generator in generators.values():  # the step's sampling draws from every generator
        torch.rand(4, generator=generator)
    taken = restore(generators, held)
    assert sorted(taken) == [0, 3] and sorted(generators) == [2]  # vLLM's rewind loop sees neither
    generators.update(taken)
    assert torch.equal(torch.rand(4, generator=generators[0]), first_draws[0])  # as if never drawn
    assert torch.equal(torch.rand(4, generator=generators[3]), first_draws[3])
    assert not torch.equal(torch.rand(4, generator=generators[2]), first_draws[2])  # its draw was kept


def test_the_runner_overrides_methods_vllm_still_has() -> None:
    """A vLLM that renamed either method would leave the runner's override unused: fail here instead."""
    assert issubclass(SeedRewindingRunner, CPUModelRunner)
    for name in ("_sample", "_bookkeeping_sync"):
        assert name in vars(GPUModelRunner) and name in vars(SeedRewindingRunner), name
