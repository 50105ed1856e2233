"""Judge request builders, output → Verdict rules, the string matcher, and ``complete`` over a fake engine."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from mia_engine.config.agent import AgentConfig
from mia_engine.agent.evidence_support import features, grounding, passages_of
from mia_engine.agent.judge import (
    GroundedJudge,
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
from mia_engine.agent import prompts
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
    assert messages[0] == {"role": "system", "content": prompts.GRADER_SYSTEM}
    assert messages[1]["role"] == "user" and "Gold target: ['Lima', 'Lima, Peru']" in messages[1]["content"]
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


@pytest.mark.parametrize(("prediction", "gold", "is_exact", "is_contained"), [
    ("北京", ["北京"], True, True),
    ("中国的首都是北京。", ["北京"], False, True),            # no spaces around the answer: still found
    ("中国的首都是南京。", ["北京"], False, False),
    ("Москва", ["москва"], True, True),                       # Cyrillic case folded, not dropped
    ("Столица России — Москва.", ["Москва"], False, True),
    ("Лев Толстой", ["Лев Толстой"], True, True),
    ("Толстой", ["Лев Толстой"], False, False),
    ("Москвабург", ["Москва"], False, False),                 # whole words where the script has spaces
    ("東京タワー", ["東京"], False, True),
    ("Ｔｏｋｙｏ　２０２０", ["Tokyo 2020"], True, True),      # full-width forms (NFKC)
    ("٢٠٢٠", ["2020"], True, True),                          # Arabic-Indic digits
])
def test_matching_in_any_script(prediction: str, gold: list[str], is_exact: bool, is_contained: bool) -> None:
    assert exact_match(prediction, gold) is is_exact and contains_match(prediction, gold) is is_contained


def test_normalisation_keeps_every_script() -> None:
    assert normalize_answer("Лев  Толстой!") == "лев толстои"    # accents (й's breve) dropped, as SQuAD does
    assert normalize_answer("北京，中国") == "北 京 中 国"
    assert normalize_answer("«Война и мир»") == "воина и мир"


# ---- the grounded judge (no model call) --------------------------------------------------------------

HUGO = "Doc 1(Title: Les Misérables) Les Misérables is an 1862 novel by the French writer Victor Hugo."
MONET = "Doc 2(Title: Claude Monet) Claude Monet was a French painter, a founder of Impressionism."
GROUNDED = GroundedJudge(min_grounding=0.2)


@pytest.mark.parametrize(("question", "evidence", "answer", "is_correct"), [
    ('Who wrote the 1862 novel "Les Misérables"?', [f"{HUGO}\n{MONET}"], "Victor Hugo", True),
    ('Who wrote the 1862 novel "Les Misérables"?', [f"{HUGO}\n{MONET}"], "It was written by Victor Hugo.", True),
    ('Who wrote the 1862 novel "Les Misérables"?', [f"{HUGO}\n{MONET}"], "Claude Monet", False),  # off-subject
    ('Who wrote the 1862 novel "Les Misérables"?', [f"{HUGO}\n{MONET}"], "Gustave Flaubert", False),
    ('Who wrote the 1862 novel "Les Misérables"?', [MONET], "Victor Hugo", False),  # the search missed it
    ('Who wrote the 1862 novel "Les Misérables"?', [f"{HUGO}\n{MONET}"], "", False),
    ("法国的首都是哪里？", ["Doc 1(Title: 巴黎) 巴黎是法国的首都和最大城市。"], "巴黎", True),
    ("法国的首都是哪里？", ["Doc 1(Title: 巴黎) 巴黎是法国的首都和最大城市。"], "柏林", False),
    ("Кто написал роман «Война и мир»?", ["Doc 1(Title: Война и мир) «Война и мир» — роман Льва Толстого."],
     "Лев Толстой", True),                                                  # inflected in the passage
    ("Кто написал роман «Война и мир»?", ["Doc 1(Title: Война и мир) «Война и мир» — роман Льва Толстого."],
     "Фёдор Достоевский", False),
    ("Which is older, the University of Oxford or the University of Cambridge?",
     ["Doc 1(Title: University of Oxford) The University of Oxford has taught since 1096."], "Oxford", True),
    ("Which is older, the University of Oxford or the University of Cambridge?",
     ["Doc 1(Title: University of Oxford) The University of Oxford has taught since 1096."], "Stanford", False),
    ("How many moons does Mars have?", ["Doc 1(Title: Mars) Mars has 2 moons, Phobos and Deimos."], "2", True),
    ("How many moons does Mars have?", ["Doc 1(Title: Mars) Mars has 2 moons, Phobos and Deimos."], "٢", True),
    ("How many moons does Mars have?", ["Doc 1(Title: Mars) Mars has 2 moons, Phobos and Deimos."], "5", False),
    ("Is Paris the capital of France?", ["Doc 1(Title: Paris) Paris is the capital of France."], "yes", False),
])
def test_the_grounded_judge_calls_correct_an_answer_a_passage_about_the_question_states(
        question: str, evidence: list[str], answer: str, is_correct: bool) -> None:
    """Any script, inflected names, the question's own alternatives, numbers in any digits; an answer no
    passage writes out (yes/no) cannot be grounded by overlap."""
    verdict = GROUNDED.verdict(question, answer, evidence)
    assert verdict.is_correct is is_correct and verdict.source == "unsupervised", verdict
    assert verdict.label == ("A" if is_correct else "B") and verdict.reason.startswith("grounded")


def test_frequent_words_weigh_little_without_a_word_list() -> None:
    """IDF over the passages' windows: a word every window holds ("located") barely counts, so a question
    that uses it is not kept from its passage."""
    filler = " ".join(f"Doc {i}(Title: Town {i}) Town {i} is located in a valley." for i in range(2, 6))
    evidence = [f"Doc 1(Title: Recife) Recife is located in Brazil.\n{filler}"]
    plain = grounding("In which country is Recife?", "Brazil", passages_of(evidence))
    located = grounding("In which country is Recife located?", "Brazil", passages_of(evidence))
    assert located.title == plain.title == "Recife" and located.score > 0.8 * plain.score


def test_features_are_character_n_grams_in_any_script() -> None:
    assert features(["hugo"]) == {" hu", "hug", "ugo", "go "} and features(["2"]) == {"2"}
    assert features(["巴", "黎", "是"]) == {"巴黎", "黎是"} and features(["京"]) == {"京"}


async def test_match_judge_grades_by_the_gold_answers_without_an_llm():
    client = FakeClient({"": "A"})  # an LLM grader that would say "correct" to anything
    right = await judge_supervised(client, StringMatch(), "Q?", ["Victor Hugo"], "It was victor hugo.")
    wrong = await judge_supervised(client, StringMatch(), "Q?", ["Victor Hugo"], "Alexandre Dumas")
    assert (right.is_correct, right.label, wrong.is_correct, wrong.label) == (True, "A", False, "B")
    assert client.calls == []  # no grader call
    assert (await judge_supervised(client, LLMGrader(CONFIG), "Q?", ["Victor Hugo"], "Alexandre Dumas")).is_correct
