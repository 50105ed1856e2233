"""The research loop's strategies, one per concern, chosen once from the config (as vLLM chooses a
scheduler policy or a sampler): the loop (``loop.py``, ``rollout.py``) calls them and never reads the
fields that chose them.

    concern                 paper (default)       departure for small models (``small_model`` profile)
    what the Planner writes ProsePlan             SearchesPlan            (plan_form)
    verified-plan replay    PlanReplay(None)      PlanReplay(0.95)        (replay_min_similarity)
    Executor turns          free, well formed     fixed first query, tool calls first, ... (TurnPolicy)
    the returned answer     TrajectoryAnswer      EvidenceAnswer          (answer_from)
    workflow memory         ManagerSummary        ExtractiveWorkflow / SearchesWorkflow (workflow_summary)
    grading with gold       LLMGrader             StringMatch             (supervised_judge)
    the closed-book answer  OwnAnswer             ClosedBookChoice        (answer_choice, closed_book_min_logprob)
    judging without gold    ReviewersJudge        GroundedJudge           (unsupervised_judge, min_grounding)
"""

from __future__ import annotations

from dataclasses import dataclass

from .answer_choice import AnswerChooser, ClosedBookChoice, OwnAnswer
from .answers import AnswerStrategy, EvidenceAnswer, TrajectoryAnswer
from ..config.agent import AgentConfig
from .judge import GroundedJudge, LLMGrader, ReviewersJudge, StringMatch, SupervisedJudge, UnsupervisedJudge
from .plan_forms import PlanForm, PlanReplay, ProsePlan, SearchesPlan
from .turn_policy import TurnPolicy
from .workflows import ExtractiveWorkflow, ManagerSummary, SearchesWorkflow, WorkflowWriter
from ..tools.registry import Tools


@dataclass(frozen=True)
class Strategies:
    """What the loop does at each point where a config may depart from the paper."""

    plan: PlanForm
    replay: PlanReplay
    turns: TurnPolicy
    answer: AnswerStrategy
    workflow: WorkflowWriter
    supervised_judge: SupervisedJudge
    choice: AnswerChooser
    unsupervised_judge: UnsupervisedJudge

    def describe(self) -> dict[str, str]:
        """The class chosen for each concern (the startup log, and tests that a profile does not drift)."""
        turns = self.turns
        return {"plan": type(self.plan).__name__, "replay": str(self.replay.min_similarity),
                "turns": f"question_first={turns.is_question_first} image_first={turns.is_image_first} "
                         f"min_tool_calls={turns.min_tool_calls} final_answer_forced={turns.is_final_answer_forced}",
                "answer": type(self.answer).__name__, "workflow": type(self.workflow).__name__,
                "supervised_judge": type(self.supervised_judge).__name__, "choice": type(self.choice).__name__,
                "unsupervised_judge": type(self.unsupervised_judge).__name__}


def choose_strategies(config: AgentConfig, tools: Tools) -> Strategies:
    """The one place the departure fields of ``config`` are read."""
    return Strategies(_plan_form(config), PlanReplay(config.replay_min_similarity), TurnPolicy(config, tools),
                      EvidenceAnswer(config) if config.answer_from == "evidence" else TrajectoryAnswer(),
                      _workflow_writer(config),
                      StringMatch() if config.supervised_judge == "match" else LLMGrader(config),
                      _answer_chooser(config),
                      GroundedJudge(config.min_grounding) if config.unsupervised_judge == "grounded"
                      else ReviewersJudge(config))


def _answer_chooser(config: AgentConfig) -> AnswerChooser:
    if config.answer_choice == "closed_book":
        return ClosedBookChoice(config.closed_book_min_logprob, config.closed_book_confidence)
    return OwnAnswer()


def _plan_form(config: AgentConfig) -> PlanForm:
    if config.plan_form == "searches":
        return SearchesPlan(config.max_plan_searches, config.regex.max_query_chars,
                            is_question_searched=config.first_query == "question")
    return ProsePlan(config.planner_max_words, config.planner_max_words_image, config.replan_max_words)


def _workflow_writer(config: AgentConfig) -> WorkflowWriter:
    if config.workflow_summary == "manager":
        return ManagerSummary(config)
    if config.plan_form == "searches":
        return SearchesWorkflow(config.max_plan_searches)
    return ExtractiveWorkflow(config.summary_max_words)
