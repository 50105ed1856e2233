"""What the engine-level tests share: the tiny model's real tokenizer, and a tool and a call in Hermes's syntax."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from mia_engine.models.tiny import build_tiny

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """The tiny model's tokenizer (its vocabulary has the think and tool-call tags), one per module: a test may
    set its chat template."""
    out = tmp_path_factory.mktemp("tiny")
    build_tiny(out)
    return AutoTokenizer.from_pretrained(Path(out) / "base")
