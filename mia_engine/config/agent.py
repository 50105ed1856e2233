"""Configuration of the research loop (``[agent]``; its tools' ``[tools]`` is ``tools.py``).

Every number of MIA's loop is a field here, defaulting to the paper or, where the paper is silent,
to the reference code (ECNU-SII/MIA); each field's docstring says which. Reading this file top to
bottom is a summary of the method: rollouts per question, the Executor's turn budget, one
reflection at most, Eq. 4's reward weights, the group advantage, the reviewers' weights.

**Profiles.** The defaults run the paper's loop. A few fields are departures from it for models too
small to follow it (each documented where it is defined, and each a strategy that ``strategies.py``
chooses once). A profile names a set of them, so a config selects the set in one line and can still
set any of its fields itself, which wins::

    [agent]
    profile = "small_model"     # PROFILES["small_model"]: the departures below
    max_replans = 1             # a field the table sets wins over its profile

``load_config`` expands the profile (``resolve_table``) before it reads the table: an ``AgentConfig``
holds the resulting fields only (built in Python, ``AgentConfig.for_profile`` does the same).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

import msgspec

from ..base.structs import Frozen, require


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


class StageSampling(Frozen):
    """Sampling of each stage of the loop, keyed by stage (``[agent.sampling]``, e.g.
    ``planner = { max_tokens = 160 }``). A stage's table replaces that stage's default as a whole: the
    keys it leaves out take ``RoleSampling``'s defaults, not the stage's."""

    planner: RoleSampling = RoleSampling(temperature=0.0, max_tokens=4096)
    """The Planner's single plan, reflection and replan at inference (temperature 0; 4096 tokens leave a
    thinking model room to think before it plans)."""
    answer: RoleSampling = RoleSampling(temperature=0.0, max_tokens=48)
    """The evidence answer (``answer_from = "evidence"``)."""
    executor: RoleSampling = RoleSampling(temperature=0.0, max_tokens=2048, presence_penalty=1.1)
    """Each Executor turn (reference: temperature 0, presence penalty 1.1)."""
    router: RoleSampling = RoleSampling(temperature=0.0, max_tokens=1024)
    """The Router's pick of a plan."""
    grader: RoleSampling = RoleSampling(temperature=0.0, max_tokens=512)
    """The supervised grader (reference: temperature 0)."""
    reviewer: RoleSampling = RoleSampling(temperature=0.1, max_tokens=512)
    """The unsupervised reviewers (reference: temperature 0.1)."""
    area_chair: RoleSampling = RoleSampling(temperature=0.0, max_tokens=512)
    """The Area Chair (reference: temperature 0)."""
    manager: RoleSampling = RoleSampling(temperature=0.0, max_tokens=1024)
    """The Manager's workflow summary (reference: temperature 0)."""
    caption: RoleSampling = RoleSampling(temperature=0.0, max_tokens=160)
    """The Manager's image caption (greedy: the caption is a retrieval key)."""
    closed_book: RoleSampling = RoleSampling(temperature=0.0, max_tokens=64)
    """The Manager asked the question alone (``answer_choice = "closed_book"``, and the eval's ``bare``
    mode): greedy, one short answer."""


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
    """Reflections that may trigger a replan per trajectory (paper: at most once); 0 = no reflection,
    for Planners too small to judge a trajectory (``small_model``)."""
    replan_max_turns: int = 0
    """Executor turns after a replan: a budget of its own, as in the reference (20 calls in its
    serving code); 0 = ``max_turns``."""
    max_plan_searches: int = 2
    """Most searches a plan of the ``searches`` form may list (their queries are bounded by
    ``regex.max_query_chars``)."""
    evidence_max_words: int = 600
    """Words of retrieved passages shown to the evidence answer (``answer_from = "evidence"``)."""
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
    review_reason_max_words: int = 50
    """Word limit of a reviewer's reason."""

    # ---- departures from the paper: each a strategy (strategies.py); PROFILES names sets of them ----
    plan_form: Literal["text", "searches"] = "text"
    """What the Planner writes. ``text``: a step-by-step plan in prose, the Executor's guide (paper,
    reference). ``searches``: one to ``max_plan_searches`` lines ``Search: <query>``, always written
    under a regex, which the Executor runs in order after its first search, then answers (answering
    from the evidence, every turn is then fixed and the loop runs the searches at once); a replan is
    written in the same form, and a workflow memory of such a rollout is its searches, so a later
    Planner reuses a success by copying it. Tokens written under the regex are the policy's samples
    restricted to what the regex allows; the learner scores them under the same restriction (the
    grammar's mask replayed over them), so test-time learning updates the Planner in either form. For
    Planners too small to write prose a small Executor can follow (``small_model``)."""
    replay_min_similarity: float | None = None
    """At inference (one greedy plan, no learning), when the best positive memory retrieved is of a
    question with a raw cosine at least this to the question, that memory's plan is the Planner's plan,
    written in its tokens, not generated; learning still samples its G plans. None = never (paper,
    reference; TOML has no None: under ``small_model`` set ``profile = "paper"`` and its other fields).
    For Planners too small to copy a plan from their prompt without changing its names
    (``small_model``: 0.95)."""
    first_query: Literal["model", "question"] = "model"
    """With structured outputs, the query of the Executor's first search: ``model`` = its own (the
    reference); ``question`` = the question itself, enforced by the turn's regex (the model still writes
    its thinking). For Executors too small to write a search query (``small_model``)."""
    first_image_search: bool = False
    """With structured outputs, an image question's first Executor turn is the image-to-image search
    (enforced by the turn's regex); False = the reference's free choice. For Executors too small to
    pick it."""
    min_tool_calls: int = 0
    """With structured outputs, the Executor's first N turns may only call a tool (no answer yet), so
    a small model gathers evidence before it answers; 0 = the reference's free choice
    (``small_model``: 1)."""
    force_final_answer: bool = True
    """With structured outputs, the Executor's last allowed turn may only answer, so a trajectory that
    reaches the turn cap still ends with its best answer (small models rarely stop searching by
    themselves); False = the reference's behaviour (nothing forced at the cap), which configs/8xgpu.toml
    runs."""
    answer_from: Literal["trajectory", "evidence"] = "trajectory"
    """Where the returned answer comes from. ``trajectory``: the Executor's own ``<answer>`` (paper,
    reference). ``evidence``: after the ReAct loop, one short Executor call that sees only the question
    and the passages its searches returned (no plan, no thinking), falling back to the trajectory's
    answer when no search succeeded. For Executors too small not to repeat a guess from their plan
    (``small_model``)."""
    workflow_summary: Literal["manager", "extractive"] = "manager"
    """How a judged rollout becomes a workflow memory. ``manager``: the Manager summarises the
    trajectory (paper, reference). ``extractive``: the same numbered "**action** (input → output)"
    steps read off the trajectory itself (each call's queries → the titles it returned, then the
    answer; a ``searches`` plan's rollout as its searches), no model call. For Managers too small to
    summarise without inventing names (``small_model``)."""
    supervised_judge: Literal["llm", "match"] = "llm"
    """How an answer is graded against ground truth: ``llm`` = the SimpleQA-style grader (paper,
    reference); ``match`` = normalised exact-or-contains string match, for judge models too small to
    grade (``small_model``). The verdict labels memories and drives the rewards."""
    answer_choice: Literal["own", "closed_book"] = "own"
    """Which answer a rollout returns. ``own``: its own (paper, reference). ``closed_book``: beside the
    research, the Manager's model is asked the question alone (no tools), and that closed-book answer
    is returned instead of the rollout's when the model is confident in it (``closed_book_min_logprob``)
    or the rollout's is empty: adaptive retrieval by the model's confidence (Mallen et al., 2023; FLARE,
    Jiang et al., 2023; ``answer_choice.py`` states the rule). For readers small enough to be misled by
    an unrelated passage about facts the model knows (``small_model``). Text questions of the full loop
    only (not the plain-ReAct baseline)."""
    closed_book_confidence: Literal["mean", "min"] = "mean"
    """How the closed-book answer's token log-probs make one confidence: ``mean`` = the length-normalised
    sequence log-likelihood; ``min`` = the least likely token's (FLARE's test). Chosen with the threshold
    on a dev split (``bench/calibrate_choice.py``)."""
    closed_book_min_logprob: float = -0.25
    """Confidence (nats per token, <= 0) at or above which the closed-book answer is returned instead of
    the rollout's (``answer_choice = "closed_book"``); -0.25 is a mean token probability of about 0.78.
    The default is the value ``bench/calibrate_choice.py`` picks for the embedded default on its dev
    splits; a model's log-probs are its own scale, so recalibrate it for another model. -inf: always the
    closed-book answer; 0: only a certain one."""
    min_grounding: float = 0.61
    """Score in [0, 1] at or above which the ``grounded`` judge calls an answer correct: the relevance of
    the best passage to the question times the share of the answer it holds, both IDF-weighted shares of
    character n-grams (``evidence_support.py``). The default is the value ``bench/calibrate_choice.py``
    picks for the embedded default on its dev splits (the best agreement with gold there); lower it for
    more recall, raise it for more precision."""
    unsupervised_judge: Literal["reviewers", "grounded"] = "reviewers"
    """How an answer is judged without ground truth (test-time learning). ``reviewers``: three LLM
    reviewers and an Area Chair (paper, reference). ``grounded``: correct iff a retrieved passage about
    the question's subject states the answer (``min_grounding``), by string overlap in any script, no
    model call, and independent of the answer choice's confidence. For judge models whose reviews are
    near random (``small_model``)."""
    # ---- end of the departures ----

    structured_executor: bool = True
    """Constrain Executor turns to ``executor_turn_regex`` (vLLM structured outputs), so a small model's
    turns are always well formed; False = the paper's free-form turns, the tool call parsed from the text
    (configs/8xgpu.toml)."""
    structured_judges: bool = True
    """Constrain grader, reviewers, Area Chair and Router outputs (letter regex / JSON schema)."""
    regex: RegexLimits = RegexLimits()
    """Bounds of the Executor regex."""
    executor_max_context_share: float = 0.88
    """On the free-form path (``structured_executor = false``), the share of the Executor engine's
    ``max_model_len`` (tokens of the rendered prompt) past which its next turn is not generated: the
    final-answer request (``prompts.CONTEXT_FULL_ANSWER``) replaces the last message, one more
    unconstrained turn ends the trajectory, and no reflection follows, as in the reference. 0.88: the
    reference's threshold, 110·1024 tokens of its Executor's 128,000-token context (Qwen2.5-VL-7B); the
    rest holds the next turn (``sampling.executor.max_tokens``, the reference's 10,000) and the images,
    which a rendered prompt counts as a placeholder each. Unused with structured turns, where a full
    context ends the trajectory."""
    executor_stop: tuple[str, ...] = ("<tool_response>",)
    """Stop strings of an Executor turn: the model must not write the tool's answer itself."""
    sampling: StageSampling = StageSampling()
    """Sampling of each stage (``[agent.sampling]``)."""
    planner_rollout_temperature: float = 1.0
    """Planner temperature when sampling G > 1 plans or learning: the plan, the reflection and the
    replan are then all sampled at it from the policy the learner trains (its ``learner.temperature``
    must be the same); at 1, the engine's log-probs of the sampled tokens are the learner's old policy."""
    reflection_max_tokens: int = 512
    """Budget of the yes/no reflection (a short think is allowed, as in the reference)."""
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
        require(self.closed_book_min_logprob <= 0.0, "closed_book_min_logprob must be <= 0 (a log-prob)")
        require(0.0 <= self.min_grounding <= 1.0, "min_grounding must be in [0, 1]")
        require(0.0 < self.executor_max_context_share <= 1.0, "executor_max_context_share must be in (0, 1]")

    @classmethod
    def for_profile(cls, profile: str, **fields: Any) -> AgentConfig:
        """The config a ``[agent]`` table with ``profile`` and ``fields`` gives (raises ValueError)."""
        return msgspec.convert(resolve_table({"profile": profile, **fields}), cls)


PROFILES: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "paper": MappingProxyType({}),
    "small_model": MappingProxyType({
        "plan_form": "searches",
        "replay_min_similarity": 0.95,
        "max_replans": 0,
        "first_query": "question",
        "min_tool_calls": 1,
        "answer_from": "evidence",
        "workflow_summary": "extractive",
        "supervised_judge": "match",
        "answer_choice": "closed_book",
        "unsupervised_judge": "grounded",
    }),
})
"""Named sets of departures (``[agent] profile``). ``paper``: none, the default. ``small_model``: the
loop the embedded 135M default runs, each field's docstring saying what it changes and why."""

def resolve_table(table: Mapping[str, Any]) -> dict[str, Any]:
    """The ``[agent]`` table as ``AgentConfig`` reads it: its profile's fields, then the table's own.
    Raises ValueError with one line naming a profile that does not exist."""
    name = table.get("profile", "paper")
    if not isinstance(name, str) or name not in PROFILES:
        raise ValueError(f"agent.profile: unknown profile {name!r}; one of {', '.join(map(repr, PROFILES))}")
    return {**PROFILES[name], **{key: value for key, value in table.items() if key != "profile"}}
