"""The grouped CPU LoRA ops (``engines/cpu_lora.py``) inside vLLM's own CPU Punica wrapper.

``PunicaWrapperCPU`` calls its ops by their module-level names. Rather than overwrite those names in
vLLM's module (every engine and vLLM program in the process would get them) or copy its methods, each
method that calls one of them is rebuilt from its own code object with a namespace in which those
names are ours: vLLM's wrapper logic, unchanged, on our ops, for this class only. If vLLM's wrapper no
longer calls every op we replace, building the class fails, and with it the engine's start, naming
them: grouped ops that are asked for are never silently not used.
"""

from __future__ import annotations

import dis
import types

from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

from .cpu_lora import OPS


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
                           "LoRA ops cannot be used with this vLLM; set engines.<name>.cpu_lora_ops = \"vllm\"")
    methods = {attr: _on_ops(functions[attr], ops) for attr, used in calls.items() if used}
    return type(name, (base,), {"__module__": __name__, "__doc__": f"{base.__qualname__} on {sorted(ops)}.",
                                **methods})


GroupedPunicaWrapperCPU = with_ops(PunicaWrapperCPU, OPS, "GroupedPunicaWrapperCPU")
