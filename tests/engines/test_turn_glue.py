"""Continuing a chat in token space gives the tokens the chat template gives the whole conversation."""

from __future__ import annotations

from pathlib import Path

import pytest

from mia_engine.engines.role_handle import turn_glue


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


# A Qwen3-style template that thinks unless told not to: with enable_thinking=false the generation prompt
# carries an empty think block, so the model answers directly (the reference's Manager/judge/Router).
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


async def test_each_role_renders_with_its_own_template_kwargs(tokenizer) -> None:
    from mia_engine.config import load_config
    from mia_engine.engines.role_handle import RoleTarget
    from mia_engine.engines.roles import RoleServer
    from mia_engine.engines.vllm_engine import VLLMEngine

    tokenizer.chat_template = THINKING_TEMPLATE
    config = load_config("tiny", {"roles.manager.chat_template_kwargs": {"enable_thinking": False}})
    assert config.roles["manager"].chat_template_kwargs == {"enable_thinking": False}
    server = RoleServer(config)
    engine = VLLMEngine("tiny", config.engines["tiny"], Path(tokenizer.name_or_path))  # never started
    engine.tokenizer = tokenizer
    for name, role in config.roles.items():  # the targets start() builds, over a tokenizer-only engine
        canonical = role.alias_of or name
        server.serve(name, RoleTarget(engine, None, role.sampling, "role",
                                      dict(config.roles[canonical].chat_template_kwargs)))
    question = [{"role": "user", "content": "Is Lima the capital of Peru?"}]
    for quiet in ("manager", "judge", "router"):  # judge and router are aliases of the manager
        text = tokenizer.decode(await server.role(quiet).render_chat(question))
        assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), quiet
    planner = tokenizer.decode(await server.role("planner").render_chat(question))
    assert planner.endswith("<|im_start|>assistant\n")  # the Planner thinks
    glue = tokenizer.decode(await server.role("manager").extend_chat([], "and Quito?"))
    assert glue.endswith("<think>\n\n</think>\n\n")  # continued turns keep the role's kwargs
    engine.shutdown()
