"""The engines' start-up warm-up: the plan (pure), its config bounds, and its run in the shared tiny server
(``configs/tiny.toml`` warms up with rounds of 1, 2 and 4)."""

from __future__ import annotations

import re

import pytest

from mia_engine.config import ConfigError, load_config
from mia_engine.engines.warmup import DECODE_TOKENS, MIN_PROMPT_TOKENS, batch_sizes, plan, sampling


def test_batch_sizes_double_up_to_the_bound() -> None:
    assert batch_sizes(0) == []
    assert batch_sizes(1) == [1]
    assert batch_sizes(4) == [1, 2, 4]
    assert batch_sizes(128) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert batch_sizes(100) == [1, 2, 4, 8, 16, 32, 64, 100]


@pytest.mark.parametrize("max_model_len", [64, 4096])
def test_one_whole_step_then_rounds_of_varied_prompts_that_fit_the_context(max_model_len: int) -> None:
    rounds = plan(128, 2048, max_model_len, seed=3)
    assert [len(r.prompt_lens) for r in rounds] == batch_sizes(128)
    assert rounds[0].prompt_lens == [min(2048, max_model_len - DECODE_TOKENS)]  # the largest step the engine runs
    for round_ in rounds:
        assert all(MIN_PROMPT_TOKENS <= n <= max_model_len - DECODE_TOKENS for n in round_.prompt_lens), round_
    if max_model_len == 4096:  # room for every share: each later round prefills about half a step
        assert all(0.2 * 2048 < sum(r.prompt_lens) < 1.1 * 2048 for r in rounds[1:]), rounds
    assert plan(128, 2048, max_model_len, seed=3) == rounds  # seeded: every start warms up alike
    assert len({n for r in rounds for n in r.prompt_lens}) > min(50, max_model_len // 2)  # varied step sizes


def test_the_rounds_mix_greedy_sampled_and_penalised_requests() -> None:
    params = [sampling(i) for i in range(6)]
    assert {p.temperature for p in params} == {0.0, 1.0}
    assert {p.presence_penalty for p in params} == {0.0, 1.1}
    assert all(p.ignore_eos and p.max_tokens == DECODE_TOKENS for p in params)


@pytest.mark.parametrize("value, message", [(-1, "must be >= 0"), (257, "more than max_num_seqs (256)")])
def test_a_warmup_bound_outside_the_engine_is_refused(value: int, message: str) -> None:
    with pytest.raises(ConfigError, match=r"engines\.tiny\.warmup_max_seqs: .*" + re.escape(message)):
        load_config("tiny", {"engines.tiny.warmup_max_seqs": value, "engines.tiny.max_num_seqs": 256})


def test_the_served_engine_warmed_up_before_it_was_ready(tiny_server) -> None:
    log = tiny_server.log_path.read_text(errors="replace")
    assert "engine tiny: warming up with rounds of 1, 2, 4 requests at once" in log, tiny_server.log_tail()
    warmed, ready = log.index("engine tiny: warmed up: 7 requests"), log.index("ready: serving")
    assert warmed < ready
