"""The closed-book choice: the model's confidence in its closed-book answer decides between it and the
rollout's own (``answer_choice.py``), for answers in any script and of any kind, and the loop that asks the
candidate with its log-probs beside the research (the fake engine of ``test_loop.py``: pure logic only)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec
import pytest

from mia_engine.agent.answer_choice import ClosedBookAnswer, ClosedBookChoice, OwnAnswer
from mia_engine.agent.answers import answer_lines
from mia_engine.agent.llm import Completion
from mia_engine.agent.loop import ResearchAgent, ResearchRequest
from mia_engine.config.agent import AgentConfig
from mia_engine.config.tools import ToolsConfig
from mia_engine.engines.client import TokenLogprob
from mia_engine.tools.registry import Tools

from .test_loop import CALL, FakeClient, FakeMemory, FakeSearch, role_script

CHOICE = ClosedBookChoice(min_logprob=-0.5)
SURE, UNSURE = math.log(0.9), math.log(0.2)


def closed_book(text: str, *logprobs: float) -> ClosedBookAnswer:
    return ClosedBookAnswer(text, list(logprobs))


@pytest.mark.parametrize(("question", "own", "candidate", "source"), [
    # a confident closed-book answer wins, in any script and of any kind
    ("Who wrote Les Misérables?", "Claude Monet", closed_book("Victor Hugo", SURE, SURE), "closed_book"),
    ("《悲惨世界》的作者是谁？", "莫奈", closed_book("维克多·雨果", SURE, SURE, SURE), "closed_book"),
    ("Кто написал роман «Война и мир»?", "Достоевский", closed_book("Лев Толстой", SURE, SURE), "closed_book"),
    ("Is Paris the capital of France?", "no", closed_book("yes", SURE), "closed_book"),
    ("Which is older, Oxford or Cambridge?", "Cambridge", closed_book("Oxford", SURE), "closed_book"),
    ("How many moons does Mars have?", "two", closed_book("2", SURE), "closed_book"),
    # an unsure one gives way to the evidence answer, whatever its words
    ("Which is older, Oxford or Cambridge?", "Oxford", closed_book("Stanford", UNSURE, SURE), "own"),
    ("Is Paris the capital of France?", "yes", closed_book("no", UNSURE), "own"),
    ("Is Lyon the capital of France?", "no", closed_book("yes", UNSURE), "own"),
    ("《悲惨世界》的作者是谁？", "维克多·雨果", closed_book("莫奈", UNSURE, UNSURE), "own"),
    ("Кто написал роман «Война и мир»?", "Лев Толстой", closed_book("Пушкин", UNSURE), "own"),
    ("How many moons does Mars have?", "2", closed_book("5", UNSURE), "own"),
    # an empty side leaves the other
    ("Is Paris the capital of France?", "", closed_book("yes", UNSURE), "closed_book"),
    ("Is Paris the capital of France?", None, closed_book("yes", UNSURE), "closed_book"),
    ("Is Paris the capital of France?", "yes", closed_book("", SURE), "own"),
    ("Is Paris the capital of France?", "yes", None, "own"),
    ("Is Paris the capital of France?", "yes", ClosedBookAnswer("no", None), "own"),  # no log-probs: unsure
])
def test_the_closed_book_answer_is_returned_when_the_model_is_confident(
        question: str, own: str | None, candidate: ClosedBookAnswer | None, source: str) -> None:
    choice = CHOICE.choose(question, own, candidate, [])
    assert choice.source == source
    assert choice.answer == (candidate.text if source == "closed_book" else own)
    assert OwnAnswer().choose(question, own, candidate, []) == (own, "own")


def test_the_passages_do_not_sway_the_choice() -> None:
    """The choice reads the model's confidence only: the grounded judge checks it against the passages."""
    hugo = "Doc 1(Title: Les Misérables) Les Misérables is an 1862 novel by the French writer Victor Hugo."
    for evidence in ([], [hugo]):
        assert CHOICE.choose("Who wrote it?", "Victor Hugo", closed_book("Jules Verne", SURE), evidence).source == \
            "closed_book"


def test_the_confidence_is_the_mean_or_the_least_token_log_prob() -> None:
    answer = closed_book("Victor Hugo", -0.1, -0.1, -1.0)
    assert answer.confidence("mean") == pytest.approx(-0.4) and answer.confidence("min") == -1.0
    assert ClosedBookChoice(-0.5, "mean").choose("q", "own", answer, []).source == "closed_book"
    assert ClosedBookChoice(-0.5, "min").choose("q", "own", answer, []).source == "own"
    assert ClosedBookAnswer("x", []).confidence("mean") == -math.inf


def test_a_closed_book_answer_is_read_after_its_thinking() -> None:
    completion = Completion("<think>hmm</think> Victor Hugo ", [1, 2, 3], logprobs=[-0.1, -0.2, -0.3])
    assert ClosedBookAnswer.of(completion) == ("Victor Hugo", [-0.1, -0.2, -0.3])


# ---- in the loop ---------------------------------------------------------------------------------


@dataclass
class LogprobClient(FakeClient):
    """The fake engine, giving each sampled token the log-prob ``logprob`` when the options ask for them."""

    logprob: float = 0.0

    async def generate(self, model, prompt_ids, options, request_id, *, stream, images=None):
        async for deltas in super().generate(model, prompt_ids, options, request_id, stream=stream, images=images):
            for delta in deltas:
                if options.logprobs is not None:
                    delta.logprobs = [TokenLogprob("t", self.logprob) for _ in delta.token_ids]
            yield deltas


def _agent(evidence_answer: str, closed_book: str, logprob: float, **config: object):
    def executor(prompt: str) -> str:
        return evidence_answer if prompt.startswith("Answer the question using only the passages") else CALL
    base = role_script(executor=executor)

    def script(model: str, prompt: str, options) -> str:
        if model == "manager" and prompt.startswith("Answer with only the name or number."):
            return closed_book
        return base(model, prompt, options)
    client = LogprobClient(script, logprob=logprob)
    agent_config = msgspec.structs.replace(AgentConfig(), answer_from="evidence", max_replans=0, **config)
    return ResearchAgent(client, FakeMemory(), Tools(ToolsConfig(), local=FakeSearch()), agent_config), client


@pytest.mark.parametrize(("logprob", "answer", "source"), [(-0.1, "The Seine", "closed_book"), (-2.0, "Seine", "own")])
async def test_the_loop_asks_the_candidate_with_its_log_probs_and_chooses_by_them(logprob: float, answer: str,
                                                                                  source: str) -> None:
    agent, client = _agent("Seine", "The Seine", logprob, answer_choice="closed_book", closed_book_min_logprob=-0.5)
    result = await agent.research(ResearchRequest("Which river flows through Paris?"))
    assert result.answer == answer and result.rollouts[0].trajectory.answer_source == source
    assert result.closed_book == "The Seine" and "closed_book" in result.timings
    (asked,) = [p for m, p in client.calls if m == "manager"]
    assert asked == "Answer with only the name or number.\nQuestion: Which river flows through Paris?"
    assert [o.logprobs for m, o in client.options if m == "manager"] == [0]


@pytest.mark.parametrize(("reader", "answer"), [("The answer is:", "The Seine"), ("The answer is:\nSeine\nIt flows", "The answer is: Seine")])
async def test_a_reader_lead_in_is_read_with_its_next_line_and_alone_is_no_answer(reader: str, answer: str) -> None:
    """The reader's reply goes through ``answer_lines``: a lead-in ending in a colon takes the next line, and
    with nothing after it the rollout has no answer of its own, so the closed-book one is returned even at a
    low confidence."""
    agent, _ = _agent(reader, "The Seine", -2.0, answer_choice="closed_book", closed_book_min_logprob=-0.5)
    result = await agent.research(ResearchRequest("Which river flows through Paris?"))
    assert result.answer == answer


async def test_no_closed_book_call_for_plain_react_or_without_the_field() -> None:
    for request, fields in ((ResearchRequest("Which river flows through Paris?", use_planner=False),
                             {"answer_choice": "closed_book"}),
                            (ResearchRequest("Which river flows through Paris?"), {})):
        agent, client = _agent("Seine", "The Seine", 0.0, **fields)
        result = await agent.research(request)
        assert [m for m, _ in client.calls if m == "manager"] == [] and "closed_book" not in result.timings
        assert result.rollouts[0].trajectory.answer_source == "own" and result.closed_book is None


@pytest.mark.parametrize(("answer", "label"), [("Seine", "A"), ("Danube", "B"), ("", "B")])
async def test_the_grounded_judge_grades_learning_without_gold(answer: str, label: str) -> None:
    """Learning without gold under ``unsupervised_judge = "grounded"``: no reviewer is asked; "Seine" is in
    the Seine passage (correct), "Danube" is not (incorrect), an empty answer is not attempted."""
    agent, client = _agent(answer, "", 0.0, unsupervised_judge="grounded", min_grounding=0.3)
    result = await agent.research(ResearchRequest("Which river flows through Paris?", learn=True, use_memory=False))
    verdict = result.rollouts[0].verdict
    assert verdict is not None and verdict.label == label, verdict
    assert [m for m, _ in client.calls if m == "judge"] == []


@pytest.mark.parametrize("text, answer", [
    ("Jane Austen", "Jane Austen"),
    ("Jane Austen\nShe wrote six novels.", "Jane Austen"),  # a rambling second line is dropped
    ("The answer is:\nPuntland", "The answer is: Puntland"),  # a colon introduces the next line
    ("答案是：\n北京", "答案是： 北京"),  # a full-width colon as well
    ("Ответ:\nТолстой\nещё", "Ответ: Толстой"),
    ("\n\n  1915  \n", "1915"),
    ("The answer is:", ""),  # a lead-in with nothing after it states nothing
    ("答案是：", ""),
    ("", ""),
])
def test_the_evidence_answer_is_its_first_line_and_the_next_after_a_colon(text: str, answer: str) -> None:
    assert answer_lines(text) == answer
