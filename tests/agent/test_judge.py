"""Judge request builders, output → Verdict rules, the string matcher, and ``complete`` over a fake engine."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from mia_engine.config.agent import AgentConfig
from mia_engine.agent.judge import (
    LLMGrader,
    StringMatch,
    build_area_chair,
    build_grader,
    build_review,
    judge_supervised,
    judge_unsupervised,
    parse_grader,
    unsupervised_verdict,
)
from mia_engine.agent.answer_match import contains_match, exact_match, is_match, normalize_answer
from mia_engine.agent.llm import complete
from mia_engine.agent.verdicts import GRADER_REGEX, Review
from mia_engine.engines.client import CompletionDelta, SamplingOptions
from tests.fakes import RolesByName

CONFIG = AgentConfig()


class FakeClient(RolesByName):
    """Answers each prompt by the first rule whose key occurs in it; records what it was asked."""

    def __init__(self, rules: dict[str, str]) -> None:
        self.rules = rules
        self.calls: list[tuple[str, str, SamplingOptions]] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def render_chat(self, model: str, messages: list[dict[str, str]]) -> list[int]:
        return [ord(c) for c in messages[-1]["content"]]

    def max_tokens_for(self, model: str, prompt_len: int, requested: int | None) -> int:
        return min(requested or 10_000, 10_000)

    async def generate(self, model, prompt_ids, options, request_id, *, stream):
        prompt = "".join(map(chr, prompt_ids))
        self.calls.append((model, prompt, options))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        text = next((answer for key, answer in self.rules.items() if key in prompt), "???")
        yield [CompletionDelta(i, f"{text}", 3, finish_reason="stop") for i in range(options.n)]


def test_grader_request():
    messages, options = build_grader("Capital of Peru?", ["Lima", "Lima, Peru"], "It is Lima.", CONFIG)
    assert messages[0]["role"] == "user" and "Gold target: Lima | Lima, Peru" in messages[0]["content"]
    assert options.regex == GRADER_REGEX and options.temperature == 0.0 and options.max_tokens == 512
    _, free = build_grader("q", ["a"], "p", msgspec.structs.replace(CONFIG, structured_judges=False))
    assert free.regex is None


@pytest.mark.parametrize("text, correct, label, parsed", [
    ("A", True, "A", True), ("B", False, "B", True), ("C", False, "C", True), ("lol", False, "B", False),
])
def test_parse_grader(text, correct, label, parsed):
    verdict = parse_grader(text)
    assert (verdict.is_correct, verdict.label, verdict.source, verdict.is_parsed) == (correct, label, "supervised", parsed)


def test_review_and_area_chair_requests():
    messages, options = build_review("logic", "Q?", "### Round 1 ...", "Lima", CONFIG)
    assert "### Round 1" in messages[0]["content"] and options.json_schema["required"] == ["score", "reason"]
    assert options.temperature == 0.1
    validity, _ = build_review("validity", "Q?", "### Round 1 ...", "Lima", CONFIG)
    assert "### Round 1" not in validity[0]["content"]  # result validity sees question and output only
    reviews = [Review("logic", 8, "ok"), Review("sourcing", 2, "invented"), Review("validity", 9, "answers")]
    messages, options = build_area_chair("Q?", "### Round 1: search Peru -> Lima", "Lima", reviews, CONFIG)
    assert "0.5" in messages[0]["content"] and "invented" in messages[0]["content"]
    assert "### Round 1: search Peru -> Lima" in messages[0]["content"]  # the Area Chair reads the trajectory
    assert options.json_schema["properties"]["decision"]["enum"] == ["A", "B"] and options.temperature == 0.0


def test_unsupervised_verdict():
    reviews = [Review("logic", 8, "ok")]
    good = unsupervised_verdict(reviews, '{"reason": "sound", "decision": "A"}')
    assert good.is_correct and good.label == "A" and good.source == "unsupervised" and good.reviews == reviews
    bad = unsupervised_verdict(reviews, '{"reason": "hallucinated", "decision": "B"}')
    assert not bad.is_correct and bad.reason == "hallucinated"
    garbage = unsupervised_verdict(reviews, "hmm")
    assert not garbage.is_correct and not garbage.is_parsed


async def test_complete_fits_max_tokens_and_returns_n_texts():
    client = FakeClient({"": "hello"})
    options = SamplingOptions(n=3, temperature=1.0, max_tokens=None)
    texts = await complete(client.role("planner"), [{"role": "user", "content": "hi"}], options)
    assert texts == ["hello"] * 3
    assert client.calls[0][2].max_tokens == 10_000 and client.calls[0][0] == "planner"


async def test_judge_supervised_and_empty_answer():
    client = FakeClient({"Grade the predicted answer": "A"})
    verdict = await judge_supervised(client, LLMGrader(CONFIG), "Q?", ["Lima"], "Lima")
    assert verdict.is_correct and client.calls[0][0] == CONFIG.roles.judge
    empty = await judge_supervised(client, LLMGrader(CONFIG), "Q?", ["Lima"], "  ")
    assert empty.label == "C" and not empty.is_correct and len(client.calls) == 1  # no LLM call


async def test_judge_unsupervised_runs_reviewers_concurrently():
    client = FakeClient({"Area Chair": '{"reason": "fine", "decision": "A"}',
                         "reviewer": '{"score": 9, "reason": "good"}'})
    verdict = await judge_unsupervised(client, CONFIG, "Q?", "### Round 1", "Lima")
    assert verdict.is_correct and [r.kind for r in verdict.reviews] == ["logic", "sourcing", "validity"]
    assert all(r.score == 9 for r in verdict.reviews)
    assert len(client.calls) == 4 and client.max_in_flight == 3


def test_normalize_and_match():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffel tower"
    assert normalize_answer("Reykjavík") == "reykjavik"
    assert exact_match("the Eiffel Tower.", ["Eiffel Tower"])
    assert not exact_match("Eiffel Tower in Paris", ["Eiffel Tower"])
    assert contains_match("It is the Eiffel Tower in Paris", ["Eiffel Tower"])
    assert not contains_match("Eiffel Towers", ["Eiffel Tower"])  # whole words only
    assert is_match("Lima", ["Cusco", "lima"]) and not is_match("Cusco city", ["Lima"])
    assert not is_match(None, ["Lima"]) and not is_match("", ["Lima"]) and not is_match("x", [""])
    assert is_match("1889", ["1889"])


async def test_match_judge_grades_by_the_gold_answers_without_an_llm():
    client = FakeClient({"": "A"})  # an LLM grader that would say "correct" to anything
    right = await judge_supervised(client, StringMatch(), "Q?", ["Victor Hugo"], "It was victor hugo.")
    wrong = await judge_supervised(client, StringMatch(), "Q?", ["Victor Hugo"], "Alexandre Dumas")
    assert (right.is_correct, right.label, wrong.is_correct, wrong.label) == (True, "A", False, "B")
    assert client.calls == []  # no grader call
    assert (await judge_supervised(client, LLMGrader(CONFIG), "Q?", ["Victor Hugo"], "Alexandre Dumas")).is_correct
