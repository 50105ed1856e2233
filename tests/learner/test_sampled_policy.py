"""The learner scores the policy that sampled: tokens written under a regex under the grammar's mask (the
chunked log-probs against a plain masked log-softmax; the replayed masks against an independent walk of
xgrammar), the sampling engine's log-probs as the old policy, and stale samples left out."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from mia_engine.agent.plan_searches import plan_searches_regex
from mia_engine.config.learner import LearnerConfig
from mia_engine.learner.batching import GrammarSpan, GRPOSample
from mia_engine.learner.grammar_mask import GrammarReplay, stop_token_ids
from mia_engine.learner.grpo import TokenMask, chunked_token_logprobs, unpack_bitmask
from mia_engine.learner.learner import PlannerLearner

REGEX = plan_searches_regex(2, 12)


def random_bitmask(rows: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """(rows, ⌈vocab/32⌉) packed int32 allowing a random ~third of the vocabulary, always token 0."""
    allowed = torch.rand(rows, vocab, generator=gen) < 0.3
    allowed[:, 0] = True
    padded = torch.zeros(rows, -(-vocab // 32) * 32, dtype=torch.int64)
    padded[:, :vocab] = allowed.long()
    words = (padded.view(rows, -1, 32) << torch.arange(32)).sum(-1)  # (rows, W) as unsigned 32-bit
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


# ----- the masked chunked log-probs against plain torch ---------------------------------------------


def test_unpack_bitmask_reads_xgrammars_layout() -> None:
    bitmask = torch.tensor([[0b101, -1], [-2 ** 31, 1]], dtype=torch.int32)  # bit j of word w = token 32w + j
    allowed = unpack_bitmask(bitmask, 40)
    assert allowed[0].nonzero().flatten().tolist() == [0, 2, *range(32, 40)]
    assert allowed[1].nonzero().flatten().tolist() == [31, 32]


@pytest.mark.parametrize("is_head_trainable", [False, True], ids=["frozen-head-fused", "trainable-head-checkpointed"])
@pytest.mark.parametrize("chunk", [1, 7, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_masked_chunked_logprobs_and_gradients_equal_a_masked_log_softmax(chunk: int, is_head_trainable: bool,
                                                                          temperature: float) -> None:
    """Rows under a grammar take −inf outside its bitmask before the log-softmax, the others none; the
    log-probs and their gradients equal torch's log_softmax of the masked logits (rows across chunks)."""
    gen = torch.Generator().manual_seed(0)
    vocab = 53
    hidden = torch.randn(30, 16, generator=gen, requires_grad=True)  # (N, H)
    head = torch.nn.Linear(16, vocab, bias=False).requires_grad_(is_head_trainable)
    rows = torch.tensor([0, 3, 4, 5, 6, 7, 8, 13, 14, 29])
    bitmask = random_bitmask(len(rows), vocab, gen)
    allowed = torch.ones(30, vocab, dtype=torch.bool)
    allowed[rows] = unpack_bitmask(bitmask, vocab)
    targets = torch.multinomial(allowed.float(), 1, generator=gen).squeeze(1)  # an allowed token each row
    got = chunked_token_logprobs(hidden, targets, head, temperature, chunk, TokenMask(rows, bitmask))
    logits = (head(hidden).float() / temperature).masked_fill(~allowed, -math.inf)
    want = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    unmasked = torch.log_softmax(head(hidden).float() / temperature, -1).gather(-1, targets[:, None]).squeeze(-1)
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got[rows], unmasked[rows])  # the mask matters
    weights = torch.randn(30, generator=gen)
    inputs = [hidden, head.weight] if is_head_trainable else [hidden]
    for a, b in zip(torch.autograd.grad((got * weights).sum(), inputs),
                    torch.autograd.grad((want * weights).sum(), inputs)):
        torch.testing.assert_close(a, b)


# ----- the grammar replayed over sampled tokens ----------------------------------------------------


def walk_grammar(tiny: Path, regex: str, seed: int) -> tuple[list[int], list[torch.Tensor]]:
    """Tokens drawn at random among those xgrammar allows (a stand-in for vLLM's constrained sampler),
    with the allowed set before each; ends with a stop token once the regex may end."""
    import xgrammar as xgr
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny / "base")
    vocab = len(tokenizer)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    stops = stop_token_ids(tiny / "base", tokenizer.eos_token_id)
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_regex(regex), override_stop_tokens=stops)
    rng, bitmask, tokens, allowed_sets = random.Random(seed), xgr.allocate_token_bitmask(1, vocab), [], []
    while not matcher.is_terminated():
        matcher.fill_next_token_bitmask(bitmask)
        allowed = unpack_bitmask(bitmask, vocab)[0]
        choices = allowed.nonzero().flatten().tolist()
        ending = [t for t in choices if t in stops]
        token = ending[0] if ending and (len(tokens) > 12 or len(ending) == len(choices)) else \
            rng.choice([t for t in choices if t not in stops])
        assert matcher.accept_token(token)
        tokens.append(token)
        allowed_sets.append(allowed)
    return tokens, allowed_sets


def test_replay_gives_the_masks_the_tokens_were_sampled_under(tiny: Path) -> None:
    import json

    vocab = json.loads((tiny / "base" / "config.json").read_text())["vocab_size"]
    tokens, allowed = walk_grammar(tiny, REGEX, seed=1)
    replay = GrammarReplay(tiny / "base", vocab)
    bitmask = replay.bitmask(REGEX, tokens)
    assert bitmask is not None and bitmask.shape[0] == len(tokens)
    assert torch.equal(unpack_bitmask(bitmask, vocab), torch.stack(allowed)[:, :vocab])
    assert replay.bitmask(REGEX, [tokens[0], tokens[0], tokens[0]] + tokens) is None  # "SSS..." is off the regex


def test_the_learner_scores_regex_tokens_under_their_mask(tiny: Path) -> None:
    """A span sampled under a regex is scored with the model's logits masked as the sampler masked them;
    the free tokens after it with the full softmax."""
    learner = PlannerLearner(tiny / "base", tiny / "adapters" / "planner", LearnerConfig(logit_chunk_size=5))
    tokens, allowed = walk_grammar(tiny, REGEX, seed=2)
    free = [5, 6, 7]
    prompt = [11, 12, 13, 14]
    sample = GRPOSample(prompt_ids=prompt, completion_ids=tokens + free, reward=1.0, group_id="q",
                        grammar_spans=[GrammarSpan(0, len(tokens), REGEX)])
    other = GRPOSample(prompt_ids=prompt, completion_ids=free, reward=0.0, group_id="q")
    (batch, *_) = learner._micro_batches(_prepared([sample, other]))
    with torch.no_grad():
        got = learner._token_logprobs(batch)[0, len(prompt) - 1 - batch.start:]  # (C,) sample's scored positions
        ids = torch.tensor([prompt + tokens + free])
        logits = learner.model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()  # (C, V)
    mask = torch.ones_like(logits, dtype=torch.bool)
    mask[:len(tokens)] = torch.stack(allowed)[:, :logits.shape[1]]
    want = torch.log_softmax(logits.masked_fill(~mask, -math.inf), -1).gather(
        1, torch.tensor(tokens + free)[:, None]).squeeze(1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(learner.token_logprobs([sample])[0], want, rtol=1e-4, atol=1e-4)
    assert bool((got[:len(tokens)] > torch.log_softmax(logits, -1)[:len(tokens)].gather(
        1, torch.tensor(tokens)[:, None]).squeeze(1) + 1e-3).any())  # the mask raised them


def _prepared(samples: list[GRPOSample]):
    from mia_engine.learner.batching import prepare

    return prepare(samples, 1e-6)[0]


# ----- the sampler's log-probs as the old policy, and staleness -------------------------------------


def _group(policy_version: int | None, group: str, old: float | None = None) -> list[GRPOSample]:
    return [GRPOSample(prompt_ids=[3, 4, 5], completion_ids=[7, 8, 9], reward=float(i), group_id=group,
                       policy_version=policy_version, old_logprobs=None if old is None else [old, math.nan, old])
            for i in range(2)]


def test_sampler_logprobs_are_the_old_policy_and_nan_falls_back_to_the_learners(tiny: Path) -> None:
    """Given old log-probs (NaN for a token without one): the ratio moves off 1 by their gap to the
    learner's, and the step reports that gap over the tokens that had one."""
    learner = PlannerLearner(tiny / "base", tiny / "adapters" / "planner", LearnerConfig())
    result = learner.step(_group(None, "a", old=-3.0))
    assert result.is_accepted, result.reason
    assert result.num_sampler_tokens == 4  # two of each sequence's three tokens
    assert result.sampler_gap_mean > 0 and result.sampler_gap_max >= result.sampler_gap_mean
    assert result.ratio_mean != pytest.approx(1.0, abs=1e-3)
    own = PlannerLearner(tiny / "base", tiny / "adapters" / "planner", LearnerConfig()).step(_group(None, "a"))
    assert own.num_sampler_tokens == 0 and math.isnan(own.sampler_gap_mean)
    assert own.ratio_mean == pytest.approx(1.0, abs=1e-6)


def test_samples_older_than_the_staleness_bound_are_left_out(tiny: Path) -> None:
    learner = PlannerLearner(tiny / "base", tiny / "adapters" / "planner", LearnerConfig(max_sample_staleness=1))
    batch = _group(5, "fresh") + _group(4, "one_behind") + _group(3, "two_behind") + _group(None, "unknown")
    result = learner.step(batch, policy_version=5)
    assert result.is_accepted, result.reason
    assert result.num_skipped_stale == 2 and result.num_sequences == 6
    stale = learner.step(_group(1, "old"), policy_version=5)
    assert not stale.is_accepted and stale.num_skipped_stale == 2 and "stale" in stale.reason
    assert learner.step(_group(1, "any"), policy_version=None).num_skipped_stale == 0  # version unknown
    strict = PlannerLearner(tiny / "base", tiny / "adapters" / "planner", LearnerConfig(max_sample_staleness=0))
    assert strict.step(_group(4, "behind") + _group(5, "now"), policy_version=5).num_skipped_stale == 2


def test_max_sample_staleness_must_not_be_negative() -> None:
    from mia_engine.config.errors import ConfigError

    with pytest.raises((ValueError, ConfigError), match="max_sample_staleness"):
        LearnerConfig(max_sample_staleness=-1)
