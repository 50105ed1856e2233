"""The server's estimate of a structured-output schema's compile cost (``server.grammar_cost.schema_cost``),
run on every request with a schema before it reaches the engine: a few of ``bench/grammar_compile.py``'s
families at a size the default budget accepts."""

from __future__ import annotations

import pytest

from bench.grammar_compile import FAMILIES
from mia_engine.server.grammar_cost import schema_cost

CASES = {"k optional properties": 200, "k strings of maxLength 100": 50, "anyOf k objects": 50,
         "nested repeats ((.{0,k}){k}){k}": 4, "k required string properties": 200}


@pytest.mark.parametrize("family", list(CASES))
def test_grammar_cost(benchmark, family: str) -> None:  # noqa: ANN001
    schema = FAMILIES[family](CASES[family])
    assert benchmark(lambda: schema_cost(schema)) > 0
