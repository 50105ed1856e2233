"""Continuing a chat in token space gives the tokens the chat template gives the whole conversation."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from mia_engine.engines.roles import turn_glue
from mia_engine.models.tiny import build_tiny


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("tiny")
    build_tiny(out)
    return AutoTokenizer.from_pretrained(Path(out) / "base")


def _render(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("ends_with_eos", [True, False])
def test_extension_equals_the_re_rendered_conversation(tokenizer, ends_with_eos: bool) -> None:
    question = [{"role": "user", "content": "Plan how to find the river through Paris."}]
    plan, reply = "1. search for rivers in Paris", "Was the answer supported? Reply yes or no."
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    sampled = tokenizer.encode(plan, add_special_tokens=False) + ([eos] if ends_with_eos else [])
    glue = turn_glue(tokenizer, reply)
    assert glue[0] == eos  # the template closes the assistant turn first
    extended = _render(tokenizer, question) + sampled + (glue[1:] if ends_with_eos else glue)
    whole = _render(tokenizer, [*question, {"role": "assistant", "content": plan},
                                {"role": "user", "content": reply}])
    assert extended == whole
