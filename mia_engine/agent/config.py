"""Configuration of the research loop (``[agent]``; its tools' ``[tools]`` is ``tools/config.py``).

Every number of MIA's loop is a field here, defaulting to the paper or, where the paper is silent,
to the reference code (ECNU-SII/MIA); each field's docstring says which. Reading this file top to
bottom is a summary of the method: rollouts per question, the Executor's turn budget, one
reflection at most, Eq. 4's reward weights, the group advantage, the reviewers' weights.
"""

from __future__ import annotations

import math
from typing import Literal

from ..structs import Frozen, require


class RoleSampling(Frozen):
    """How the loop samples one role; ``max_tokens`` is capped by the context left after the prompt."""

    temperature: float = 0.0
    """Sampling temperature (the reference uses 0 everywhere but the reviewers)."""
    max_tokens: int = 1024
    """Completion budget of one call."""
    presence_penalty: float = 0.0
    """Penalty on tokens already present (the reference's Executor uses 1.1)."""

    def __post_init__(self) -> None:
        require(0.0 <= self.temperature <= 2.0, "temperature must be in [0, 2]")
        require(self.max_tokens >= 1, "max_tokens must be >= 1")


class AgentRoles(Frozen):
    """Model ids (roles of the root config) the loop addresses; roles sharing a base share an engine."""

    planner: str = "planner"
    """Writes plans, reflects (yes/no) and replans; the only role that learns at test time."""
    executor: str = "executor"
    """Runs the ReAct loop with the tools."""
    manager: str = "manager"
    """Writes workflow summaries for the memory."""
    captioner: str = "manager"
    """Captions a question's image (the reference's Manager). Its engine must take images; point it at
    a vision-language engine's base model when the Manager's is text-only (configs/8xgpu.toml)."""
    judge: str = "judge"
    """Grades answers (supervised grader, the three reviewers and the Area Chair)."""
    router: str = "router"
    """Picks one of the G plans using Meta Plan Memory."""


class RewardWeights(Frozen):
    """Eq. 4 as the reference code computes it (TTRL ``gt_reward_core``), and its unsupervised variant."""

    final: float = 0.7
    """Supervised: weight of the judged correctness of the final answer."""
    first: float = 0.2
    """Supervised: weight of the correctness of the first answer (before any replan)."""
    format: float = 0.05
    """Supervised: weight of the format reward (reflection is exactly yes/no, think tags balanced)."""
    decision: float = 0.05
    """Supervised: weight of the reflection decision reward (replanned iff the first answer was wrong)."""
    unsupervised_verdict: float = 0.9
    """Unsupervised: weight of the Area Chair's "correct" decision."""
    unsupervised_format: float = 0.1
    """Unsupervised: weight of the format reward."""

    def __post_init__(self) -> None:
        weights = (self.final, self.first, self.format, self.decision, self.unsupervised_verdict,
                   self.unsupervised_format)
        require(all(w >= 0 and math.isfinite(w) for w in weights), "reward weights must be finite and >= 0")


class ReviewWeights(Frozen):
    """Weights the Area Chair is told for the three reviewers (it weighs them, it does not average)."""

    logic: float = 0.5
    """Reasoning & logical consistency."""
    sourcing: float = 0.3
    """Information sourcing & credibility (misread sources, hallucinated facts)."""
    validity: float = 0.2
    """Result validity (is the task actually completed)."""

    def __post_init__(self) -> None:
        require(min(self.logic, self.sourcing, self.validity) >= 0, "review weights must be >= 0")


class RegexLimits(Frozen):
    """Bounds of the Executor's structured-output regex (bounded repeats keep xgrammar's automaton small)."""

    max_think_chars: int = 1500
    """Longest ``<think>`` body."""
    max_answer_chars: int = 400
    """Longest ``<answer>`` body."""
    max_query_chars: int = 200
    """Longest search query."""
    max_queries: int = 4
    """Most queries in one ``query_list``."""

    def __post_init__(self) -> None:
        require(min(self.max_think_chars, self.max_answer_chars, self.max_query_chars, self.max_queries) >= 1,
                 "regex limits must be >= 1")


class AgentConfig(Frozen):
    """The research loop: Planner → Router → Executor (ReAct) → reflection → judge → reward → memory."""

    roles: AgentRoles = AgentRoles()
    """Which model id plays each role."""
    num_rollouts: int = 4
    """G: plans sampled per question at test time (paper algorithm 3)."""
    num_rollouts_low_latency: int = 1
    """Plans per question on the low-latency path (no learning, no Router)."""
    max_turns: int = 20
    """Executor assistant turns per trajectory (reference: 20 serving, 30 inference; paper: 10)."""
    tool_response_max_words: int = 0
    """Words of a tool response shown to the Executor; 0 = all of it (the reference cuts only the
    traces shown to the Planner and the Manager, ``trace_max_words``)."""
    trace_max_words: int = 1024
    """Words of each tool response kept in the traces shown to the Planner, reviewers and Manager."""
    max_replans: int = 1
    """Reflections that may trigger a replan per trajectory (paper: at most once)."""
    replan_max_turns: int = 0
    """Executor turns after a replan: a budget of its own, as in the reference (20 calls in its
    serving code); 0 = ``max_turns``."""
    answer_from: Literal["trajectory", "evidence"] = "trajectory"
    """Where the returned answer comes from. ``trajectory``: the Executor's own ``<answer>`` (paper and
    reference). ``evidence``: after the ReAct loop, one short Executor call that sees only the question
    and the passages its searches returned (no plan, no thinking), so a small model answers from the
    evidence instead of repeating a guess from its plan; falls back to the trajectory's answer when
    no search succeeded. The embedded 135M default uses it (bench/RESULTS.md, section 5)."""
    evidence_max_words: int = 600
    """Words of retrieved passages shown to the evidence answer (``answer_from = "evidence"``)."""
    plan_form: Literal["text", "searches"] = "text"
    """What the Planner writes. ``text``: a step-by-step plan in prose, shown to the Executor as its guide
    (paper, reference). ``searches``: the searches to make, one to ``max_plan_searches`` lines
    ``Search: <query>`` (always enforced by structured outputs, also when sampling G plans), which the
    Executor runs in order after its first search, then the answer (with ``answer_from = "evidence"``
    every turn is then fixed, so the loop runs the searches at once instead of generating the turns);
    a workflow memory of such a rollout is its searches in the same lines, so the Planner reuses a
    past success by copying them. For Planners too small to write prose a tiny Executor can follow (the
    embedded 135M default; bench/RESULTS.md section 5). A replan (``max_replans``) is written in the same
    form under the same regex: the loop runs the searches not made yet, and the final evidence answer
    reads their passages first. Plan and replan tokens sampled under the regex are not the policy's own
    samples, so the learner does not train on them: in this form test-time learning is the memory's
    (a reflection, if any, still trains)."""
    replay_min_similarity: float | None = None
    """Replay of verified plans. At inference (one greedy plan, no learning), when the best positive
    memory retrieved for the question is of a question with a raw cosine at least this to it, the
    Planner writes exactly that memory's plan (forced by structured outputs), so a success stored for
    the same question is reused as it was; learning passes still sample their G plans. None = never
    (paper, reference: the Planner writes every plan with the memories in its prompt). For Planners too
    small to copy a plan from their prompt (the embedded 135M one turned "SPINTAMORIL" into
    "SPARTAMORIL" and lost the answer; bench/RESULTS.md section 5)."""
    max_plan_searches: int = 2
    """Most searches a plan of the ``searches`` form may list (their queries are bounded by
    ``regex.max_query_chars``)."""
    planner_max_words: int = 400
    """Word limit the plan prompt asks for (reference: 400)."""
    planner_max_words_image: int = 300
    """Word limit of the plan prompt for a question with an image (reference: 300)."""
    caption_max_words: int = 60
    """Word limit of the Manager's caption of a question's image."""
    replan_max_words: int = 200
    """Word limit the replan prompt asks for."""
    summary_max_words: int = 300
    """Word limit of the Manager's workflow summary."""
    workflow_summary: Literal["manager", "extractive"] = "manager"
    """How a judged rollout becomes a workflow memory. ``manager``: the Manager summarises the
    trajectory (paper, reference). ``extractive``: the same numbered "**action** (input → output)"
    steps read off the trajectory itself (each call's queries → the titles it returned, then the
    answer), no model call: for Managers too small to summarise without inventing names (the 135M
    one summarised a correct "Harper Lee" trajectory as "The answer to the question is: Robert Falcon
    Scott", and the Planner copied it; bench/RESULTS.md section 5)."""
    review_reason_max_words: int = 50
    """Word limit of a reviewer's reason."""
    structured_executor: bool = True
    """Constrain Executor turns to ``executor_turn_regex`` (vLLM structured outputs)."""
    force_final_answer: bool = True
    """With structured outputs, the Executor's last allowed turn may only answer: a trajectory that
    reaches the turn cap still ends with its best answer instead of none (small models rarely stop
    searching by themselves); False = the reference's behaviour."""
    min_tool_calls: int = 0
    """With structured outputs, the Executor's first N turns may only call a tool (no answer yet): makes
    small models gather evidence before answering; 0 = the reference's free choice."""
    first_query: Literal["model", "question"] = "model"
    """With structured outputs, the query of the Executor's first search: ``model`` = its own (the
    reference); ``question`` = the question itself, enforced by the turn's regex (the model still writes
    its thinking). For models too small to write a search query (the embedded 135M default)."""
    first_image_search: bool = False
    """With structured outputs, an image question's first Executor turn is the image-to-image search
    (enforced by the turn's regex); False = the reference's free choice. For models too small to pick it."""
    supervised_judge: Literal["llm", "match"] = "llm"
    """How an answer is graded against ground truth: ``llm`` = the SimpleQA-style grader (paper,
    reference); ``match`` = normalised exact-or-contains string match, for judge models too small to
    grade (the embedded 135M model graded almost every answer correct: bench/RESULTS.md section 5).
    The verdict labels memories and drives the rewards."""
    structured_judges: bool = True
    """Constrain grader, reviewers, Area Chair and Router outputs (letter regex / JSON schema)."""
    regex: RegexLimits = RegexLimits()
    """Bounds of the Executor regex."""
    executor_stop: tuple[str, ...] = ("<tool_response>",)
    """Stop strings of an Executor turn: the model must not write the tool's answer itself."""
    planner: RoleSampling = RoleSampling(temperature=0.0, max_tokens=4096)
    """Planner sampling for the single plan, the reflection and the replan at inference (temperature 0;
    4096 tokens leave a thinking model room to think before it plans)."""
    planner_rollout_temperature: float = 1.0
    """Planner temperature when sampling G > 1 plans or learning: the plan, the reflection and the
    replan are then all sampled at it, unconstrained, from the policy the learner trains (its
    ``learner.temperature`` must be the same)."""
    reflection_max_tokens: int = 512
    """Budget of the yes/no reflection (a short think is allowed, as in the reference)."""
    answer: RoleSampling = RoleSampling(temperature=0.0, max_tokens=48)
    """Sampling of the evidence answer (``answer_from = "evidence"``)."""
    executor: RoleSampling = RoleSampling(temperature=0.0, max_tokens=2048, presence_penalty=1.1)
    """Executor sampling per turn (reference: temperature 0, presence penalty 1.1)."""
    router: RoleSampling = RoleSampling(temperature=0.0, max_tokens=1024)
    """Router sampling."""
    grader: RoleSampling = RoleSampling(temperature=0.0, max_tokens=512)
    """Supervised judge sampling (reference: temperature 0)."""
    reviewer: RoleSampling = RoleSampling(temperature=0.1, max_tokens=512)
    """Unsupervised reviewers' sampling (reference: temperature 0.1)."""
    area_chair: RoleSampling = RoleSampling(temperature=0.0, max_tokens=512)
    """Area Chair sampling (reference: temperature 0)."""
    manager: RoleSampling = RoleSampling(temperature=0.0, max_tokens=1024)
    """Workflow-summary sampling (reference: temperature 0)."""
    caption: RoleSampling = RoleSampling(temperature=0.0, max_tokens=160)
    """Sampling of the Manager's image caption (greedy: the caption is a retrieval key)."""
    rewards: RewardWeights = RewardWeights()
    """Eq. 4 weights."""
    review_weights: ReviewWeights = ReviewWeights()
    """Reviewer weights told to the Area Chair."""
    advantage_eps: float = 1e-6
    """ε of A_i = (R_i − mean R)/(std R + ε) (veRL's GRPO default, which the reference trains with)."""
    seed: int = 0
    """Seed of the RNG that picks the failed rollout kept as a negative memory."""

    def __post_init__(self) -> None:
        require(self.num_rollouts >= 1 and self.num_rollouts_low_latency >= 1, "num_rollouts must be >= 1")
        require(self.max_turns >= 1, "max_turns must be >= 1")
        require(self.max_plan_searches >= 1, "max_plan_searches must be >= 1")
        require(self.replay_min_similarity is None or -1.0 <= self.replay_min_similarity <= 1.0,
                "replay_min_similarity must be in [-1, 1]")
        require(self.max_replans >= 0, "max_replans must be >= 0")
        require(self.replan_max_turns >= 0 and self.tool_response_max_words >= 0,
                 "replan_max_turns and tool_response_max_words must be >= 0")
        require(self.reflection_max_tokens >= 1 and self.evidence_max_words >= 1,
                 "reflection_max_tokens and evidence_max_words must be >= 1")
        words = (self.trace_max_words, self.planner_max_words, self.planner_max_words_image, self.caption_max_words,
                 self.replan_max_words, self.summary_max_words, self.review_reason_max_words)
        require(min(words) >= 1, "word limits must be >= 1")
        require(0.0 < self.planner_rollout_temperature <= 2.0, "planner_rollout_temperature must be in (0, 2]")
        require(self.advantage_eps > 0, "advantage_eps must be > 0")
