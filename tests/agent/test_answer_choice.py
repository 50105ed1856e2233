"""The closed-book choice and the evidence-grounded judge: the string rules (``evidence_support.py``),
the rule between the two answers (``answer_choice.py``), and the loop that asks the candidate beside the
research (the fake engine of ``test_loop.py``: pure logic only)."""

from __future__ import annotations

import pytest

from mia_engine.agent.answer_choice import ClosedBookChoice, OwnAnswer
from mia_engine.agent.evidence_support import (QuestionTerms, is_degenerate, passages_of, relevance, salvage,
                                               support)
from mia_engine.agent.loop import ResearchRequest

from .test_loop import CALL, agent_with, role_script

HUGO = "Doc 1(Title: Les Misérables) Les Misérables is an 1862 novel by the French writer Victor Hugo."
MONET = "Doc 1(Title: Claude Monet) Claude Monet was a French painter, a founder of Impressionism."
QUESTION = 'Who wrote the 1862 novel "Les Misérables"?'


@pytest.mark.parametrize("answer", [
    "", "   ", "The answer is:", "The answer is: .", "The author of \"Les Misérables\" is not specified.",
    "The passage does not mention the author.", "Unknown", "I don't know", "Les Misérables",
    "The 1862 novel Les Misérables", "The original question asks who wrote Les Misérables.",
    "Victor Hugo is not explicitly mentioned in the passage.", None])
def test_an_answer_that_answers_nothing_is_degenerate(answer: str | None) -> None:
    assert is_degenerate(answer, QuestionTerms.of(QUESTION))


@pytest.mark.parametrize("answer", ["Victor Hugo", "The answer is: Victor Hugo", "victor hugo.",
                                    "Les Misérables was written by Victor Hugo in 1862."])
def test_an_answer_with_a_claim_is_not_degenerate(answer: str) -> None:
    assert not is_degenerate(answer, QuestionTerms.of(QUESTION))


@pytest.mark.parametrize(("question", "answer", "is_answer"), [
    ("In which year was Playboy founded?", "Playboy was founded in 1953 in Chicago.", True),
    ("In which year was Playboy founded?", "Playboy was founded by Hugh Hefner.", False),
    ("When was Playboy founded?", "1953", True),
    ("What nationality was the author of the novel \"Emma\"?", "She was English.", True),
    ("What nationality was the author of the novel \"Emma\"?", "The author of Emma is Jane Austen.", False),
])
def test_an_answer_without_what_the_question_asks_for_is_degenerate(question: str, answer: str,
                                                                    is_answer: bool) -> None:
    assert is_degenerate(answer, QuestionTerms.of(question)) is not is_answer


def test_a_long_answer_is_supported_by_the_passage_holding_one_of_its_claims() -> None:
    """A 135M model's answer names several things; the passage about the subject holds one of them."""
    terms = QuestionTerms.of(QUESTION)
    rambling = "Victor Hugo wrote it, and Gustave Flaubert wrote Madame Bovary in Rouen."
    assert support(rambling, passages_of([HUGO]), terms) > 0.8
    assert support("Gustave Flaubert", passages_of([HUGO]), terms) == 0.0
    assert support("Monsieur Victor Hugo", passages_of([HUGO]), terms) > 0.8  # most of one name is enough
    assert support("Monsieur Victor Flaubert", passages_of([HUGO]), terms) == 0.0


def test_a_hedged_answer_is_salvaged_to_the_name_a_relevant_passage_supports() -> None:
    terms = QuestionTerms.of(QUESTION)
    hedged = "Victor Hugo, the author of Les Misérables, is not explicitly mentioned in the passage."
    assert salvage(hedged, passages_of([HUGO]), terms, 0.5) == "Victor Hugo"
    assert salvage(hedged, passages_of([MONET]), terms, 0.5) == hedged      # nothing supports it: it stays
    assert salvage("Jules Verne", passages_of([HUGO]), terms, 0.5) == "Jules Verne"  # not hedged: unchanged
    choice = CHOICE.choose(QUESTION, hedged, "The original question asks who wrote it.", [HUGO])
    assert choice == ("Victor Hugo", "own")


def test_only_a_claim_of_the_kind_asked_for_supports_the_answer() -> None:
    """A year question's answer is supported by its year, not by another name the passage also holds."""
    question = "In which year was Recife founded?"
    recife = passages_of(["Doc 1(Title: Recife) Recife, in Brazil, was founded in 1537 by the Portuguese."])
    terms = QuestionTerms.of(question)
    assert support("Recife was founded in 1537 in Brazil.", recife, terms) > 0.5
    assert support("In 2022, Recife was founded in Recife, Brazil.", recife, terms) == 0.0


def test_a_claim_is_supported_by_most_of_its_words_not_by_one_common_word() -> None:
    dracula = passages_of(["Doc 1(Title: Dracula) Dracula is an 1897 Gothic horror novel by Bram Stoker."])
    terms = QuestionTerms.of('Who wrote the 1897 novel "Dracula"?')
    assert support("The answer is: Dr. Horror", dracula, terms) == 0.0
    assert support("Bram Stoker", dracula, terms) > 0.5


def test_a_choice_question_may_be_answered_with_its_own_words() -> None:
    terms = QuestionTerms.of("Which is older, Oxford or Cambridge?")
    assert not is_degenerate("Oxford", terms)
    assert is_degenerate("Paris", QuestionTerms.of("What is the capital of France? Paris")) is True


def test_support_needs_the_claims_in_a_passage_about_the_subject() -> None:
    terms = QuestionTerms.of(QUESTION)
    hugo, monet = passages_of([HUGO]), passages_of([MONET])
    assert relevance(hugo[0], terms) > 0.8 and relevance(monet[0], terms) < 0.2
    assert support("Victor Hugo", hugo, terms) > 0.8
    assert support("Claude Monet", monet, terms) < 0.5      # in its passage, but that passage is about Monet
    assert support("Gustave Flaubert", hugo, terms) == 0.0   # not in any passage
    assert support("The answer is:", hugo, terms) == 0.0


def test_search_results_split_into_their_passages() -> None:
    passages = passages_of([f"{HUGO}\n{MONET.replace('Doc 1', 'Doc 2')}", "a text without doc lines"])
    assert [p.title for p in passages] == ["Les Misérables", "Claude Monet", ""]
    assert "hugo" in passages[0].words and "hugo" not in passages[1].words


CHOICE = ClosedBookChoice(min_support=0.5)


@pytest.mark.parametrize(("own", "closed_book", "evidence", "source"), [
    ("The answer is:", "Victor Hugo", [MONET], "closed_book"),             # 1. own degenerate
    ("Not specified", "Not specified", [HUGO], "own"),                     # both degenerate: own
    ("Victor Hugo", "The author is not mentioned.", [MONET], "own"),      # 2. closed book degenerate
    ("Claude Monet", "Victor Hugo", [MONET], "closed_book"),              # 3. the search missed
    ("Claude Monet", "Charles Dickens", [MONET], "closed_book"),          # 3. (both wrong: the model's)
    ("Victor Hugo", "Charles Dickens", [HUGO], "own"),                    # 4. own better supported
    ("Claude Monet", "Victor Hugo", [MONET, HUGO], "closed_book"),        # 4. closed book better supported
    ("It was Victor Hugo", "Victor Hugo, a French writer", [HUGO], "own"),  # 4. a tie: own
    ("Claude Monet", None, [MONET], "own"),                               # the candidate was not asked
])
def test_the_closed_book_rule(own: str, closed_book: str | None, evidence: list[str], source: str) -> None:
    choice = CHOICE.choose(QUESTION, own, closed_book, evidence)
    assert choice.source == source
    assert choice.answer == (closed_book if source == "closed_book" else own)
    assert OwnAnswer().choose(QUESTION, own, closed_book, evidence).answer == own


# ---- in the loop ---------------------------------------------------------------------------------


def _script(evidence_answer: str, closed_book: str):
    def executor(prompt: str) -> str:
        if prompt.startswith("Answer the question using only the passages"):
            return evidence_answer
        return CALL
    base = role_script(executor=executor)

    def script(model: str, prompt: str, options) -> str:
        if model == "manager" and prompt.startswith("Answer with only the name or number."):
            return closed_book
        return base(model, prompt, options)
    return script


async def test_a_degenerate_evidence_answer_gives_way_to_the_closed_book_one() -> None:
    """The fake search returns a passage about the Seine; the evidence answer says nothing."""
    agent, client, _ = agent_with(_script("The answer is:", "The Seine"), answer_from="evidence", max_replans=0,
                                  answer_choice="closed_book")
    result = await agent.research(ResearchRequest("Which river flows through Paris?"))
    assert result.answer == "The Seine" and result.rollouts[0].trajectory.answer_source == "closed_book"
    assert "closed_book" in result.timings
    (asked,) = [p for m, p in client.calls if m == "manager"]
    assert asked == "Answer with only the name or number.\nQuestion: Which river flows through Paris?"


async def test_a_supported_evidence_answer_stands_against_an_unsupported_guess() -> None:
    agent, _, _ = agent_with(_script("Seine", "The Loire"), answer_from="evidence", max_replans=0,
                             answer_choice="closed_book")
    result = await agent.research(ResearchRequest("Which river flows through Paris?"))
    assert result.answer == "Seine" and result.rollouts[0].trajectory.answer_source == "own"


async def test_no_closed_book_call_for_plain_react_or_without_the_field() -> None:
    for request, fields in ((ResearchRequest("Which river flows through Paris?", use_planner=False),
                             {"answer_choice": "closed_book"}),
                            (ResearchRequest("Which river flows through Paris?"), {})):
        agent, client, _ = agent_with(_script("The answer is:", "The Seine"), answer_from="evidence",
                                      max_replans=0, **fields)
        result = await agent.research(request)
        assert [m for m, _ in client.calls if m == "manager"] == [] and "closed_book" not in result.timings
        assert result.rollouts[0].trajectory.answer_source == "own"


async def test_the_grounded_judge_rewards_an_answer_a_relevant_passage_states() -> None:
    """Learning without gold under ``unsupervised_judge = "grounded"``: no reviewer is asked; "Seine" is in
    the Seine passage (correct), "Danube" is not (incorrect), "The answer is:" answers nothing (incorrect)."""
    for answer, label in (("Seine", "A"), ("Danube", "B"), ("The answer is:", "B")):
        agent, client, _ = agent_with(_script(answer, ""), answer_from="evidence", max_replans=0,
                                      unsupervised_judge="grounded")
        result = await agent.research(ResearchRequest("Which river flows through Paris?", learn=True,
                                                      use_memory=False))
        verdict = result.rollouts[0].verdict
        assert verdict is not None and verdict.label == label and verdict.reason.startswith("grounded"), verdict
        assert [m for m, _ in client.calls if m == "judge"] == []
