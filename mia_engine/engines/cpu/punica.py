"""The grouped CPU LoRA ops (``lora_ops.py``) inside vLLM's own CPU Punica wrapper.

``PunicaWrapperCPU`` calls its ops by their module-level names. Rather than overwrite those names in
vLLM's module (every engine and vLLM program in the process would get them) or copy its methods, each
method that calls one of them is rebuilt from its own code object with a namespace in which those
names are ours: vLLM's wrapper logic, unchanged, on our ops, for this class only. If vLLM's wrapper no
longer calls every op we replace, building the class fails, and with it the engine's start, naming
them: grouped ops that are asked for are never silently not used (the version guard, ``with_ops``).

``upstream/vllm-punica-cpu-ops.patch`` proposes to vLLM that the wrapper call its ops through class
attributes a subclass may set; once vLLM has it, ``_OnOurOps`` becomes a subclass that sets them and
``_on_ops``/``_globals_read`` (the ``__code__`` rebinding) go (``upstream/README.md``).
"""

from __future__ import annotations

import dis
import types

import torch

from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

from .lora_ops import OPS, StackedLayer, StepTokens, ZeroWeights, lora_linear


def _on_ops(function: types.FunctionType, ops: dict[str, object]) -> types.FunctionType:
    rebound = types.FunctionType(function.__code__, {**function.__globals__, **ops}, function.__name__,
                                 function.__defaults__, function.__closure__)
    rebound.__kwdefaults__ = function.__kwdefaults__
    rebound.__qualname__, rebound.__doc__ = function.__qualname__, function.__doc__
    return rebound


def _globals_read(code: types.CodeType) -> set[str]:
    """The global names ``code`` (and the functions nested in it) load; attribute names do not count."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _globals_read(const)
    return names


def with_ops(base: type, ops: dict[str, object], name: str) -> type:
    """A subclass of ``base`` whose methods call ``ops`` wherever ``base``'s call the same global names."""
    functions = {attr: member for attr, member in vars(base).items() if isinstance(member, types.FunctionType)}
    calls = {attr: _globals_read(function.__code__) & set(ops) for attr, function in functions.items()}
    called = set().union(*calls.values())
    if called != set(ops):
        raise RuntimeError(f"{base.__qualname__} no longer calls {sorted(set(ops) - called)}: the grouped CPU "
                           "LoRA ops cannot be used with this vLLM; set engines.<name>.cpu.lora_ops = \"vllm\"")
    methods = {attr: _on_ops(functions[attr], ops) for attr, used in calls.items() if used}
    return type(name, (base,), {"__module__": __name__, "__doc__": f"{base.__qualname__} on {sorted(ops)}.",
                                **methods})


_OnOurOps = with_ops(PunicaWrapperCPU, OPS, "_OnOurOps")


class GroupedPunicaWrapperCPU(_OnOurOps):
    """vLLM's CPU wrapper on the grouped ops, and its linear layers' LoRA with every slice at once.

    The tokens are grouped by adapter once per step (``update_metadata``); ``add_lora_linear``, called
    for each LoRA layer (q/k/v, o, gate/up, down in every decoder layer), then costs one shrink and one
    expand for all slices (``lora_ops.lora_linear``), on the layer's adapters stacked once and kept
    until vLLM writes a slot (``lora_ops.StackedLayer``), instead of two grouped ops per slice. The
    embedding and logits LoRA stay on vLLM's code over the grouped ops, and are skipped while no slot
    has weights for them (``lora_ops.ZeroWeights``: no adapter served here targets them)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._step: StepTokens | None = None
        self._layers: dict[int, StackedLayer] = {}  # by the layer's first A tensor, kept across steps
        self._zeros = ZeroWeights()

    def update_metadata(self, *args: object, **kwargs: object) -> None:
        super().update_metadata(*args, **kwargs)
        self._step = StepTokens(self.token_lora_indices)

    def add_lora_linear(self, y: torch.Tensor, x: torch.Tensor, lora_a_stacked: tuple[torch.Tensor, ...],
                        lora_b_stacked: tuple[torch.Tensor, ...], scale: float, output_slices: tuple[int, ...],
                        *, buffer: tuple[torch.Tensor, ...] | None = None, **kwargs: object) -> None:
        x = x.view(-1, x.shape[-1])
        if self._step is None or x.shape[0] != self._step.indices.shape[0]:  # not this step's tokens
            super().add_lora_linear(y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, buffer=buffer,
                                    **kwargs)
            return
        layer = self._layers.get(id(lora_a_stacked[0]))
        if layer is None or not layer.current(lora_a_stacked, lora_b_stacked):
            layer = self._layers[id(lora_a_stacked[0])] = StackedLayer(lora_a_stacked, lora_b_stacked)
        lora_linear(y.view(-1, y.shape[-1]), x, layer, scale, self._step)

    def add_lora_embedding(self, y: torch.Tensor, x: torch.Tensor, lora_b_stacked: torch.Tensor,
                           add_inputs: bool = True, **kwargs: object) -> None:
        if add_inputs and self._zeros.all_zero(lora_b_stacked):
            return  # y + x @ 0 is y
        super().add_lora_embedding(y, x, lora_b_stacked, add_inputs, **kwargs)

    def add_lora_logits(self, y: torch.Tensor, x: torch.Tensor, lora_a_stacked: torch.Tensor,
                        lora_b_stacked: torch.Tensor, scale: float, *, buffer: torch.Tensor | None = None,
                        **kwargs: object) -> None:
        if self._zeros.all_zero(lora_b_stacked):
            return  # y + (x @ A) @ 0 is y
        super().add_lora_logits(y, x, lora_a_stacked, lora_b_stacked, scale, buffer=buffer, **kwargs)
