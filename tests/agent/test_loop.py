"""The research loop's control flow with scripted role outputs (a fake engine: pure logic only)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import msgspec

from mia_engine.config.agent import AgentConfig, RoleSampling, StageSampling
from mia_engine.agent.loop import NO_ANSWER, ResearchAgent, ResearchRequest
from mia_engine.agent.plan_searches import plan_searches_regex
from mia_engine.agent.executor_run import ExecutorRun
from mia_engine.agent.turns import parse_executor_turn, think_regex
from mia_engine.engines.client import CompletionDelta, SamplingOptions
from mia_engine.memory.entries import ConsolidationResult, MemoryEntry, MemoryHit, SearchResult
from mia_engine.config.tools import ToolsConfig
from mia_engine.tools.corpus import Passage
from mia_engine.tools.registry import Tools
from tests.fakes import RolesByName

Script = Callable[[str, str, SamplingOptions], str]

CALL = '<think>look it up</think>\n<tool_call>\n{"name": "search", "arguments": {"query_list": ["Seine"]}}\n</tool_call>'
ANSWER = "<think>found</think>\n<answer>Seine</answer>"


@dataclass
class FakeClient(RolesByName):
    """Answers each role from a script of (model, last user message, options) -> text.

    Stateless between calls: the fake chat template writes the last user message into the prompt ids
    (``user_ids``) and ``generate`` reads it back from the ids it is given (``last_user_text``), so
    concurrent rollouts, and awaits between rendering and generating, cannot mix up prompts."""

    script: Script
    calls: list[tuple[str, str]] = field(default_factory=list)
    options: list[tuple[str, SamplingOptions]] = field(default_factory=list)
    images: list[tuple[str, list]] = field(default_factory=list)
    """(model, images) of every generate call."""
    first_messages: list[tuple[str, object]] = field(default_factory=list)
    """(model, content of the first message) of every rendered chat."""
    encoded: list[tuple[str, str]] = field(default_factory=list)
    """(model, text) of every ``encode``."""

    async def render_chat(self, model: str, messages: list[dict]) -> list[int]:
        self.first_messages.append((model, messages[0]["content"]))
        return user_ids(message_text(messages[-1]["content"]))

    async def extend_chat(self, model: str, ids: list[int], user_text: str) -> list[int]:
        return [*ids, *GLUE, *user_ids(user_text)]

    async def encode(self, model: str, text: str) -> list[int]:
        self.encoded.append((model, text))
        return fake_ids(text)

    def max_tokens_for(self, model: str, prompt_len: int, requested: int | None) -> int:
        return requested or 100

    def models(self) -> list:
        return []  # no adapter versions (EngineClient.models: the loop reads the Planner's when learning)

    async def generate(self, model: str, prompt_ids: list[int], options: SamplingOptions, request_id: str, *,
                       stream: bool, images: list | None = None) -> AsyncIterator[list[CompletionDelta]]:
        prompt = last_user_text(prompt_ids)
        self.calls.append((model, prompt))
        self.images.append((model, list(images or [])))
        self.options.append((model, options))
        texts = [self.script(model, prompt, options) for _ in range(options.n)]
        yield [CompletionDelta(i, text, 1, token_ids=fake_ids(text)) for i, text in enumerate(texts)]


GLUE = [-7, -8, -9]
"""What the fake chat template puts between turns (before the next user message's ids)."""


def message_text(content: str | list[dict]) -> str:
    """The fake template's text of a message: an image part renders as ``[image]``."""
    if isinstance(content, str):
        return content
    return "".join("[image]" if part["type"] == "image" else part["text"] for part in content)


def user_ids(text: str) -> list[int]:
    """The fake template's ids of a user message: one (non-negative) id per character."""
    return [ord(c) for c in text]


def last_user_text(prompt_ids: list[int]) -> str:
    """The last user message of a fake prompt: the ids after the last ``GLUE`` (all of them without one)."""
    starts = [i + len(GLUE) for i in range(len(prompt_ids)) if prompt_ids[i:i + len(GLUE)] == GLUE]
    return "".join(map(chr, prompt_ids[starts[-1] if starts else 0:]))


def fake_ids(text: str) -> list[int]:
    return [1000 + ord(c) for c in text[:5]]


class FakeSearch:
    async def search(self, queries: list[str], top_k: int) -> list[list[Passage]]:
        return [[Passage("Seine", "The Seine flows through Paris.")] for _ in queries]


@dataclass
class FakeMemory:
    consolidated: list = field(default_factory=list)
    outcomes: list = field(default_factory=list)
    captions: list = field(default_factory=list)
    """The caption of every search and consolidation, in call order."""

    async def search(self, question: str, *, caption: str | None = None) -> SearchResult:
        self.captions.append(("search", caption))
        return SearchResult("text_image/others" if caption else "text/others", [], [])

    async def search_meta_plans(self, question: str) -> list:
        return []

    async def record_outcome(self, ids, success: bool) -> int:
        self.outcomes.append((list(ids), success))
        return 0

    async def consolidate_group(self, question: str, chosen, *, caption: str | None = None) -> ConsolidationResult:
        """Records what would be stored: the (success, failure) pair the loop chose, either may be None."""
        positive, negative = chosen
        assert (positive is None or positive.is_correct) and (negative is None or not negative.is_correct)
        self.captions.append(("consolidate", caption))
        self.consolidated.append([r for r in chosen if r is not None])
        return ConsolidationResult()


def agent_with(script: Script, **config: object) -> tuple[ResearchAgent, FakeClient, FakeMemory]:
    client, memory = FakeClient(script), FakeMemory()
    tools = Tools(ToolsConfig(), local=FakeSearch())
    agent_config = msgspec.structs.replace(AgentConfig(), **config) if config else AgentConfig()
    return ResearchAgent(client, memory, tools, agent_config), client, memory


def role_script(*, executor: Callable[[str], str], reflection: str = "no", grade: str = "A") -> Script:
    def script(model: str, prompt: str, options: SamplingOptions) -> str:
        if model == "planner":
            if "Reply with exactly one word" in prompt:
                return reflection
            return "1. search for the river" if "revised plan" not in prompt else "2. search again, better"
        if model == "executor":
            return executor(prompt)
        if model == "judge":
            return grade
        if model == "router":
            return '{"plan": 2}'
        return "1. **search** (question -> answer)"
    return script


async def test_answer_after_one_tool_call_low_latency_path() -> None:
    agent, client, memory = agent_with(role_script(executor=lambda p: ANSWER if p.startswith("<tool_response>") else CALL))
    result = await agent.research(ResearchRequest("Which river flows through Paris?"))
    assert result.answer == "Seine"
    trajectory = result.rollouts[0].trajectory
    assert trajectory.num_tool_calls == 1 and trajectory.num_successful_tool_calls == 1
    assert "Doc 1(Title: Seine)" in trajectory.observations[0].text
    assert not any(model == "judge" for model, _ in client.calls)  # no judge on the low-latency path
    assert memory.consolidated == []


async def test_replan_happens_at_most_once() -> None:
    agent, client, _ = agent_with(role_script(executor=lambda p: ANSWER, reflection="yes"))
    result = await agent.research(ResearchRequest("q"))
    trajectory = result.rollouts[0].trajectory
    assert trajectory.did_replan and trajectory.replan.startswith("2.")
    reflections = [p for m, p in client.calls if m == "planner" and "Reply with exactly one word" in p]
    assert len(reflections) == 1
    executor_prompts = [p for m, p in client.calls if m == "executor"]
    assert "I have a revised plan for you to follow" in executor_prompts[-1]


async def test_planner_tokens_hold_plan_reflection_and_replan_and_nothing_else() -> None:
    """The learner's sample: the Planner's sampled tokens (mask 1) with the template turns between them
    (mask 0); executor text, tool output and memories are not in it."""
    learned: list = []

    async def on_learn(rollouts) -> None:
        learned.append(rollouts)

    agent, client, _ = agent_with(role_script(executor=lambda p: ANSWER, reflection="yes"))
    agent.on_learn = on_learn
    result = await agent.research(ResearchRequest("q", ground_truth=["Seine"], learn=True))
    tokens = result.rollouts[0].trajectory.planner
    plan, decision, replan = fake_ids("1. search for the river"), fake_ids("yes"), fake_ids("2. search again, better")
    plan_prompt, reflect, revise = [user_ids(p) for m, p in client.calls if m == "planner"]
    assert tokens.prompt_ids == plan_prompt
    assert tokens.completion_ids == [*plan, *GLUE, *reflect, *decision, *GLUE, *revise, *replan]
    assert tokens.completion_mask == ([1] * len(plan) + [0] * (3 + len(reflect)) + [1] * len(decision)
                                      + [0] * (3 + len(revise)) + [1] * len(replan))
    assert learned == [result.rollouts]


async def test_without_a_replan_the_planner_tokens_end_at_the_decision() -> None:
    agent, client, _ = agent_with(role_script(executor=lambda p: ANSWER, reflection="no"))
    tokens = (await agent.research(ResearchRequest("q"))).rollouts[0].trajectory.planner
    reflect = user_ids([p for m, p in client.calls if m == "planner"][1])
    assert tokens.completion_ids == [*fake_ids("1. search for the river"), *GLUE, *reflect, *fake_ids("no")]
    assert sum(tokens.completion_mask) == len(fake_ids("1. search for the river")) + len(fake_ids("no"))


async def test_malformed_output_ends_gracefully_within_max_turns() -> None:
    agent, client, _ = agent_with(role_script(executor=lambda p: "<tool_call>{not json"), max_turns=3,
                                  max_replans=0)
    result = await agent.research(ResearchRequest("q"))
    assert result.answer == NO_ANSWER
    assert len(result.rollouts[0].trajectory.turns) == 3
    assert all(not turn.is_well_formed for turn in result.rollouts[0].trajectory.turns)


async def test_garbage_everywhere_still_returns_a_response() -> None:
    agent, _, memory = agent_with(lambda model, prompt, options: "\x00<<</answer>>{]", max_turns=2)
    result = await agent.research(ResearchRequest("q", ground_truth=["x"], num_rollouts=3))
    assert result.answer == NO_ANSWER  # no rollout answered: the fallback, not the garbage or nothing
    assert len(result.rollouts) == 3
    assert all(r.verdict is not None and not r.verdict.is_correct for r in result.rollouts)


async def test_g_plans_route_judge_reward_and_consolidate() -> None:
    def executor(prompt: str) -> str:
        return ANSWER if prompt.startswith("<tool_response>") else CALL

    def script(model: str, prompt: str, options: SamplingOptions) -> str:
        if model == "planner" and options.n > 1:
            assert options.temperature and options.temperature > 0  # G samples need sampling
        return role_script(executor=executor)(model, prompt, options)

    agent, client, memory = agent_with(script)
    result = await agent.research(ResearchRequest("q", ground_truth=["Seine"], num_rollouts=4, learn=True))
    assert len(result.rollouts) == 4 and result.chosen == 1  # the router said plan 2
    planner_calls = [p for m, p in client.calls if m == "planner" and "Reply with exactly" not in p]
    assert len(planner_calls) == 1  # one request, n = G
    assert all(r.verdict.is_correct for r in result.rollouts)
    # correct final and first answers, well-formed yes/no, no replan after a correct first answer
    assert all(abs(r.reward - (0.7 * 1 + 0.2 * 1 + 0.05 * 1 + 0.05 * 1)) < 1e-9 for r in result.rollouts)
    assert all(r.advantage == 0.0 for r in result.rollouts)  # equal rewards: no learning signal
    assert len(memory.consolidated) == 1 and len(memory.consolidated[0]) == 1  # shortest success only


async def test_extractive_workflows_are_read_off_the_trajectory_without_the_manager() -> None:
    """``workflow_summary = "extractive"``: the stored summaries hold only what the rollouts did (their
    queries, the titles returned, the answer, a failure's verdict), and no Manager call writes them."""
    def executor(prompt: str) -> str:
        return ANSWER if prompt.startswith("<tool_response>") else CALL

    grades = iter(["A", "B"])
    script = role_script(executor=executor)
    agent, client, memory = agent_with(
        lambda m, p, o: next(grades) if m == "judge" else script(m, p, o), workflow_summary="extractive")
    await agent.research(ResearchRequest("q", ground_truth=["Seine"], num_rollouts=2, learn=True))
    assert [m for m, _ in client.calls if m == "manager"] == []
    (stored,) = memory.consolidated
    summaries = sorted((r.is_correct, r.workflow_summary) for r in stored)
    assert summaries == [
        (False, "1. **search** (Seine → Seine)\n2. **answer** (the passages above → Seine)"
                " — judged incorrect: avoid this answer"),
        (True, "1. **search** (Seine → Seine)\n2. **answer** (the passages above → Seine)"),
    ]


async def test_last_turn_may_only_answer_and_first_turns_must_search() -> None:
    agent, client, _ = agent_with(role_script(executor=lambda p: CALL), max_turns=3, max_replans=0,
                                  min_tool_calls=1)
    await agent.research(ResearchRequest("q"))
    regexes = [o.regex for m, o in client.options if m == "executor"]
    assert len(regexes) == 3
    assert "<answer>" not in regexes[0] and "<tool_call>" in regexes[0]  # must gather evidence first
    assert "<tool_call>" in regexes[1] and "<answer>" in regexes[1]
    assert "<tool_call>" not in regexes[2] and "<answer>" in regexes[2]  # the turn cap: answer now


async def test_first_query_question_pins_the_first_search_to_the_question() -> None:
    agent, client, _ = agent_with(role_script(executor=lambda p: CALL), max_turns=3, max_replans=0,
                                  first_query="question")
    result = await agent.research(ResearchRequest("Which river flows through Paris?"))
    regexes = [o.regex for m, o in client.options if m == "executor"]
    assert regexes[0] == think_regex(AgentConfig().regex.max_think_chars)  # the think block alone: one grammar
    assert all("Which river" not in r for r in regexes)  # no grammar per query
    assert "<tool_call>" in regexes[1]  # later turns choose their own calls
    calls = [t.tool_call.arguments for t in result.rollouts[0].trajectory.turns]
    assert calls[0] == {"query_list": ["Which river flows through Paris?"]} and calls[1] == {"query_list": ["Seine"]}


async def test_the_answer_only_turn_is_told_so_and_restates_the_question() -> None:
    agent, client, _ = agent_with(role_script(executor=lambda p: ANSWER if "last turn" in p else CALL),
                                  max_turns=3, max_replans=0)
    result = await agent.research(ResearchRequest("Which river flows through Paris?"))
    executor_prompts = [p for m, p in client.calls if m == "executor"]
    assert len(executor_prompts) == 3 and "last turn" not in executor_prompts[1]
    assert executor_prompts[2].startswith("<tool_response>")
    assert "answer the question: Which river flows through Paris?" in executor_prompts[2]
    assert result.answer == "Seine"


async def test_ground_truth_alone_judges_but_writes_no_memory() -> None:
    agent, client, memory = agent_with(role_script(executor=lambda p: ANSWER if p.startswith("<tool_response>") else CALL))
    result = await agent.research(ResearchRequest("q", ground_truth=["Seine"]))
    assert result.rollouts[0].verdict is not None and result.rollouts[0].verdict.is_correct
    assert memory.consolidated == [] and memory.outcomes == [] and result.new_memory_ids == []


async def test_thinking_never_reaches_the_executor_the_answer_or_memory() -> None:
    """A thinking Planner and Manager: their <think> text is stripped wherever a plan, replan or summary
    is used (the reference's extract_after_think)."""
    def script(model: str, prompt: str, options: SamplingOptions) -> str:
        if model == "planner":
            if "Reply with exactly one word" in prompt:
                return "<think>PRIVATE-R</think>yes"
            if "revised plan" in prompt:
                return "<think>PRIVATE-2</think>2. search the river's name"
            return "<think>PRIVATE-1 the answer is surely Rhine</think>1. search for the river"
        if model == "manager":
            return "<think>PRIVATE-M</think>1. **search** (q -> Seine)"
        return role_script(executor=lambda p: ANSWER if p.startswith("<tool_response>") else CALL)(model, prompt, options)

    agent, client, memory = agent_with(script)
    result = await agent.research(ResearchRequest("q", ground_truth=["Seine"], num_rollouts=2, learn=True))
    executor_prompts = "\n".join(p for m, p in client.calls if m in ("executor", "router"))
    assert "1. search for the river" in executor_prompts and "2. search the river's name" in executor_prompts
    assert "PRIVATE" not in executor_prompts
    assert all("PRIVATE" not in r.plan and "PRIVATE" not in r.trajectory.replan for r in result.rollouts)
    assert result.answer == "Seine"  # the Executor's answer, with nothing of the thinking or plans
    stored = [record for group in memory.consolidated for record in group]
    assert stored and all("PRIVATE" not in record.workflow_summary and "PRIVATE" not in record.plan
                          for record in stored)


async def test_a_replan_gets_its_own_turn_budget_and_can_search() -> None:
    """The first pass uses its whole budget; the replan still gets max_turns turns of its own, keeps the
    last turn minus its answer, and searches again before it answers."""
    def executor(prompt: str) -> str:
        return CALL if prompt.startswith("<tool_response>") or "revised plan" in prompt else CALL

    agent, client, _ = agent_with(role_script(executor=executor, reflection="yes"), max_turns=3,
                                  force_final_answer=True)
    result = await agent.research(ResearchRequest("q"))
    trajectory = result.rollouts[0].trajectory
    assert trajectory.did_replan and trajectory.replan_turn == 3
    assert len(trajectory.turns) == 6  # 3 turns before the replan, 3 of its own after it
    after = trajectory.turns[trajectory.replan_turn:]
    assert after[0].tool_call is not None and trajectory.observations[trajectory.replan_turn] is not None
    regexes = [o.regex for m, o in client.options if m == "executor"]
    assert "<tool_call>" in regexes[3] and "<tool_call>" not in regexes[5]  # searches, then must answer


def test_the_continued_turn_keeps_its_reasoning_without_its_answer() -> None:
    turn = parse_executor_turn(ANSWER)
    run = ExecutorRun([{"role": "user", "content": "question"}, {"role": "assistant", "content": turn.text}], "q", [turn])
    run.continue_with("2. search again")
    assert run.messages[1] == {"role": "assistant", "content": "<think>found</think>"}  # reasoning kept, answer gone
    assert run.messages[2]["role"] == "user" and "2. search again" in run.messages[2]["content"]
    bare = parse_executor_turn("<answer>Seine</answer>")
    run = ExecutorRun([{"role": "user", "content": "question"}, {"role": "assistant", "content": bare.text}], "q", [bare])
    run.continue_with("2. search again")
    assert [m["role"] for m in run.messages] == ["user", "user"]  # nothing left of that turn: dropped


async def test_learning_samples_the_planner_as_the_learner_assumes() -> None:
    """Every Planner token the learner trains on (plan, reflection, replan) was sampled at the rollout
    temperature without a constraint; at inference the same calls are greedy and the yes/no is forced."""
    agent, client, _ = agent_with(role_script(executor=lambda p: ANSWER, reflection="yes"))
    await agent.research(ResearchRequest("q", ground_truth=["Seine"], learn=True))
    learned = [o for m, o in client.options if m == "planner"]
    assert len(learned) == 3  # plan, reflection, replan
    assert all(o.temperature == agent.config.planner_rollout_temperature and o.regex is None and
               o.json_schema is None for o in learned)
    client.options.clear()
    await agent.research(ResearchRequest("q"))
    served = [o for m, o in client.options if m == "planner"]
    assert all(o.temperature == 0.0 for o in served) and served[1].regex == "yes|no"


async def test_plain_react_has_no_planner_memory_or_guide() -> None:
    agent, client, memory = agent_with(role_script(executor=lambda p: ANSWER if p.startswith("<tool_response>") else CALL))
    result = await agent.research(ResearchRequest("q", ground_truth=["Seine"], learn=True, use_planner=False,
                                                  use_memory=False))
    assert result.answer == "Seine"
    assert not any(m == "planner" for m, _ in client.calls)
    assert "Here is a guide for your reference" not in [p for m, p in client.calls if m == "executor"][0]
    assert memory.consolidated == [] and result.rollouts[0].trajectory.planner is None


async def test_evidence_answers_come_from_the_passages_alone() -> None:
    """answer_from = evidence: the answer call sees the question and the retrieved passages, not the
    plan or the Executor's thinking; without a successful search the trajectory's answer stands."""
    def executor(prompt: str) -> str:
        if prompt.startswith("Answer the question using only the passages"):
            return "Seine"
        return "<think>it is the Rhine</think>\n<answer>Rhine</answer>" if prompt.startswith("<tool_response>") else CALL

    agent, client, _ = agent_with(role_script(executor=executor), answer_from="evidence", max_replans=0)
    result = await agent.research(ResearchRequest("Which river flows through Paris?"))
    assert result.answer == "Seine" and result.rollouts[0].trajectory.turns[-1].answer == "Rhine"
    (evidence_prompt,) = [p for m, p in client.calls if m == "executor" and p.startswith("Answer the question")]
    assert "Doc 1(Title: Seine) The Seine flows through Paris." in evidence_prompt
    assert "Which river flows through Paris?" in evidence_prompt
    assert "Rhine" not in evidence_prompt and "search for the river" not in evidence_prompt
    agent, _, _ = agent_with(role_script(executor=lambda p: ANSWER), answer_from="evidence", max_replans=0)
    assert (await agent.research(ResearchRequest("q"))).answer == "Seine"  # no search: its own answer


async def test_a_structured_turn_always_has_the_tokens_its_regex_allows() -> None:
    """A budget smaller than the longest turn the regex permits would cut a tool call mid-JSON."""
    question = 'Who wrote the 1862 novel "Les Misérables"? ' * 4
    agent, client, _ = agent_with(role_script(executor=lambda p: CALL), max_turns=2, max_replans=0,
                                  first_query="question",
                                  sampling=StageSampling(executor=RoleSampling(temperature=0.0, max_tokens=16)))
    client.max_tokens_for = lambda model, prompt_len, requested: 100_000  # a context with room to spare
    await agent.research(ResearchRequest(question))
    budgets = [o.max_tokens for m, o in client.options if m == "executor"]
    limits = agent.config.regex
    assert budgets[0] >= limits.max_think_chars + len(question) + 60  # the pinned question fits
    assert all(b >= limits.max_think_chars + limits.max_answer_chars for b in budgets)


async def test_one_rollout_keeps_to_one_replica_key() -> None:
    """Data-parallel routing: the G plans and the Planner turns that continue them share the question's
    key; each rollout's Executor turns share a key of their own."""
    agent, client, _ = agent_with(role_script(executor=lambda p: ANSWER if p.startswith("<tool_response>") else CALL,
                                              reflection="yes"))
    await agent.research(ResearchRequest("q", num_rollouts=2))
    planner_keys = {o.affinity_key for m, o in client.options if m == "planner"}
    executor_keys = {o.affinity_key for m, o in client.options if m == "executor"}
    (question_key,) = planner_keys
    assert question_key and executor_keys == {f"{question_key}/0", f"{question_key}/1"}


async def test_image_question_caption_keys_memory_plan_and_executor_sees_the_image() -> None:
    """The image variant of the loop: the Manager captions the image (and gets it), retrieval and the
    stored workflows carry the caption, the plan prompt has it and the image tool, and every Executor
    turn carries the image, whose first message holds the image part."""
    image = object()  # the loop passes the image through; only the engine decodes it

    def script(model: str, prompt: str, options: SamplingOptions) -> str:
        if model == "captioner" and prompt.startswith("[image]Describe this image"):
            return "<think>hmm</think>A stone bridge over a wide river"
        return role_script(executor=lambda p: ANSWER if p.startswith("<tool_response>") else CALL)(model, prompt,
                                                                                                  options)

    agent, client, memory = agent_with(script, max_replans=0,
                                       roles=msgspec.structs.replace(AgentConfig().roles, captioner="captioner"))
    result = await agent.research(ResearchRequest("Which river is this?", ["Seine"], learn=True, image=image))
    assert result.answer == "Seine"
    assert result.caption == "A stone bridge over a wide river"
    assert memory.captions == [("search", result.caption), ("consolidate", result.caption)]
    (plan_prompt,) = [p for m, p in client.calls if m == "planner"]
    assert result.caption in plan_prompt and "web_image_to_image_search" in plan_prompt
    assert "at most 300 words" in plan_prompt
    with_images = {m: imgs for m, imgs in client.images if imgs}
    assert with_images == {"captioner": [image], "executor": [image]}  # nobody else sees the image
    assert all(imgs == [image] for m, imgs in client.images if m == "executor")
    executor_first = [content for m, content in client.first_messages if m == "executor"]
    assert all(isinstance(c, list) and c[0] == {"type": "image"} for c in executor_first)
    assert '"web_image_to_image_search"' in executor_first[0][1]["text"]


async def test_text_question_sends_no_image_and_offers_no_image_tool() -> None:
    agent, client, memory = agent_with(role_script(executor=lambda p: ANSWER), max_replans=0)
    result = await agent.research(ResearchRequest("Which river flows through Paris?"))
    assert result.caption is None and memory.captions == [("search", None)]
    assert all(imgs == [] for _, imgs in client.images)
    assert not any("Describe this image" in p for _, p in client.calls)
    (executor_prompt,) = [content for m, content in client.first_messages if m == "executor"]
    assert isinstance(executor_prompt, str) and "web_image_to_image_search" not in executor_prompt
    plan_prompt = next(p for m, p in client.calls if m == "planner")
    assert "at most 400 words" in plan_prompt


async def test_first_image_search_then_the_question_as_the_first_query() -> None:
    """``first_image_search``: an image question's first Executor turn may only be the image search, its
    second (``first_query = "question"``) only a search for the question; a text question starts with
    the question search."""
    image_call = '<think>look</think>\n<tool_call>\n{"name": "web_image_to_image_search", "arguments": {"img_idx": "0"}}\n</tool_call>'

    def executor(prompt: str) -> str:
        return ANSWER if prompt.count("<tool_response>") >= 2 else (CALL if "<tool_response>" in prompt else image_call)

    for image in (object(), None):
        agent, client, _ = agent_with(role_script(executor=executor), max_replans=0, first_image_search=True,
                                      first_query="question", max_turns=4)
        result = await agent.research(ResearchRequest("Which river is this?", image=image))
        regexes = [o.regex for m, o in client.options if m == "executor" and o.regex]
        calls = [t.tool_call for t in result.rollouts[0].trajectory.turns if t.tool_call]
        question_search = {"query_list": ["Which river is this?"]}
        if image is not None:
            assert "web_image_to_image_search" in regexes[0] and '"name": "search"' not in regexes[0]
            assert regexes[1] == think_regex(AgentConfig().regex.max_think_chars)
            assert calls[1].arguments == question_search  # the first is the fake Executor's own
        else:
            assert regexes[0] == think_regex(AgentConfig().regex.max_think_chars)
            assert calls[0].arguments == question_search


SEARCH_PLAN = "Search: river of Paris\nSearch: Seine\n"


def searches_script(executor: Callable[[str], str], reflection: str = "no") -> Script:
    """``role_script`` with a Planner that answers the ``searches`` plan prompt with ``SEARCH_PLAN``."""
    base = role_script(executor=executor, reflection=reflection)

    def script(model: str, prompt: str, options: SamplingOptions) -> str:
        if model == "planner" and "choose the searches" in prompt:
            return SEARCH_PLAN
        return base(model, prompt, options)
    return script


def _evidence_or_call(prompt: str) -> str:
    return "Seine" if prompt.startswith("Answer the question using only") else CALL


async def test_a_search_the_plan_repeats_is_made_once() -> None:
    """A ``searches`` plan that repeats the question (already the first search) or one of its own queries:
    each search runs once, the budget counts it once."""
    def script(model: str, prompt: str, options: SamplingOptions) -> str:
        if model == "planner" and "choose the searches" in prompt:
            return "Search: Which river flows through Paris?\nSearch: Seine\nSearch: Seine\n"
        return searches_script(_evidence_or_call)(model, prompt, options)

    agent, _, _ = agent_with(script, plan_form="searches", first_query="question", answer_from="evidence",
                             max_replans=0, max_turns=5)
    result = await agent.research(ResearchRequest("Which river flows through Paris?"))
    assert [t.tool_call.arguments["query_list"] for t in result.rollouts[0].trajectory.turns] == [
        ["Which river flows through Paris?"], ["Seine"]]


async def test_a_searches_plan_is_run_in_order_then_answered_from_the_evidence() -> None:
    """``plan_form = "searches"``: the Planner writes its plan under the searches regex; the first search
    is the question, the next ones the plan's queries, in order. Answering from the evidence, every turn
    is pinned whole, so the loop writes them (no Executor generation, no per-query regex to compile)
    and the Executor's one call is the evidence answer, which reads every search's passages."""
    agent, client, _ = agent_with(searches_script(_evidence_or_call), plan_form="searches", first_query="question",
                                  answer_from="evidence", max_replans=0, max_turns=5)
    result = await agent.research(ResearchRequest("Which river flows through Paris?"))
    (plan_options,) = [o for m, o in client.options if m == "planner"]
    assert plan_options.regex == plan_searches_regex(2, AgentConfig().regex.max_query_chars)
    assert plan_options.temperature == 0.0
    (plan_prompt,) = [p for m, p in client.calls if m == "planner"]
    assert "already searched for the question itself" in plan_prompt
    (evidence_prompt,) = [p for m, p in client.calls if m == "executor"]
    assert evidence_prompt.startswith("Answer the question using only") and "Doc 1(Title: Seine)" in evidence_prompt
    trajectory = result.rollouts[0].trajectory
    assert [t.tool_call.arguments["query_list"] for t in trajectory.turns] == [
        ["Which river flows through Paris?"], ["river of Paris"], ["Seine"]]
    assert all(t.raw == "" and t.think is None for t in trajectory.turns)  # written, not generated
    assert trajectory.num_successful_tool_calls == 3 and all(o.is_success for o in trajectory.observations)
    assert result.answer == "Seine"

    agent, client, _ = agent_with(searches_script(_evidence_or_call), plan_form="searches", first_query="question",
                                  answer_from="evidence", max_replans=0, max_turns=2)
    result = await agent.research(ResearchRequest("Which river flows through Paris?"))
    assert len(result.rollouts[0].trajectory.turns) == 2  # max_turns still caps the searches


async def test_a_searches_plan_with_its_own_answers_ends_with_an_answer_turn_within_max_turns() -> None:
    agent, client, _ = agent_with(searches_script(lambda p: ANSWER if "last turn" in p else CALL),
                                  plan_form="searches", max_replans=0, max_turns=2)
    result = await agent.research(ResearchRequest("q"))
    regexes = [o.regex for m, o in client.options if m == "executor"]
    assert len(regexes) == 2 and "<tool_call>" not in regexes[0]  # a fixed search: the think block alone
    assert "<tool_call>" not in regexes[1] and "<answer>" in regexes[1]
    (turn, _) = result.rollouts[0].trajectory.turns  # max_turns cuts the plan's second search
    assert turn.tool_call.arguments == {"query_list": ["river of Paris"]}
    assert result.answer == "Seine"


async def test_searches_plans_are_sampled_under_their_regex_and_trained_on() -> None:
    """Learning: the G plans are written under the regex, at the rollout temperature: the policy's samples
    under that regex, which the learner gets with it (tests/agent/test_planner_samples.py has the rest);
    the stored workflow is the successful rollout's searches in the plan's form."""
    learned: list = []

    async def on_learn(rollouts) -> None:
        learned.extend(r.trajectory.planner for r in rollouts)

    agent, client, memory = agent_with(searches_script(_evidence_or_call), plan_form="searches", max_replans=0,
                                       answer_from="evidence", workflow_summary="extractive")
    agent.on_learn = on_learn
    result = await agent.research(ResearchRequest("q", ground_truth=["Seine"], num_rollouts=2, learn=True))
    assert [r.is_correct for r in result.rollouts] == [True, True]
    (plan_options,) = [o for m, o in client.options if m == "planner"]
    assert plan_options.n == 2 and plan_options.regex is not None
    assert plan_options.temperature == agent.config.planner_rollout_temperature
    assert [[s.regex for s in t.segments] for t in learned] == [[plan_options.regex]] * 2
    ((stored,),) = memory.consolidated
    assert stored.is_correct and stored.workflow_summary == SEARCH_PLAN

    agent, client, _ = agent_with(searches_script(_evidence_or_call, reflection="no"), plan_form="searches",
                                  answer_from="evidence")
    tokens = (await agent.research(ResearchRequest("q", ground_truth=["Seine"], learn=True))).rollouts[0].trajectory.planner
    plan_ids = fake_ids(SEARCH_PLAN)
    assert tokens.completion_ids[:len(plan_ids)] == plan_ids and tokens.completion_mask[:len(plan_ids)] == [1] * len(plan_ids)
    assert tokens.completion_mask[-len(fake_ids("no")):] == [1] * len(fake_ids("no"))  # the reflection trains too


class TitledSearch:
    """One passage per query, titled by the query: which search a passage came from is visible."""

    async def search(self, queries: list[str], top_k: int) -> list[list[Passage]]:
        return [[Passage(query, f"About {query}.")] for query in queries]


async def test_a_searches_replan_runs_only_new_searches_read_first_and_trained_on() -> None:
    """With a ``searches`` plan answered from the evidence, the reflection sees the answer the passages
    gave, a "yes" brings a replan in the plan's own form (same regex), the loop runs the searches it
    did not make yet, and the final evidence answer reads that latest round first. The plan, the
    reflection and the replan are all the policy's samples (the plan and replan under their regex)."""
    replan = "Search: Seine\nSearch: Paris river\n"
    base = searches_script(_evidence_or_call, reflection="yes")

    def script(model: str, prompt: str, options: SamplingOptions) -> str:
        return replan if model == "planner" and "new searches for the agent" in prompt else base(model, prompt, options)

    client, memory = FakeClient(script), FakeMemory()
    config = msgspec.structs.replace(AgentConfig(), plan_form="searches", first_query="question",
                                     answer_from="evidence", max_replans=1, max_turns=5)
    agent = ResearchAgent(client, memory, Tools(ToolsConfig(), local=TitledSearch()), config)
    result = await agent.research(ResearchRequest("Which river flows through Paris?", ground_truth=["Seine"],
                                                  learn=True, num_rollouts=1))
    trajectory = result.rollouts[0].trajectory
    assert [t.tool_call.arguments["query_list"][0] for t in trajectory.turns] == [
        "Which river flows through Paris?", "river of Paris", "Seine", "Paris river"]
    assert trajectory.did_replan and trajectory.replan_turn == 3 and trajectory.replan == replan.strip()
    planner_prompts = [p for m, p in client.calls if m == "planner"]
    assert "### Answer read off the passages: Seine" in planner_prompts[1]  # the reflection
    replan_options = [o for m, o in client.options if m == "planner"][2]
    assert replan_options.regex == plan_searches_regex(2, config.regex.max_query_chars)
    first, final = [p for m, p in client.calls if m == "executor"]
    assert "Title: Paris river" not in first
    assert final.index("Title: Paris river") < final.index("Title: Which river flows")
    tokens = trajectory.planner
    assert tokens is not None
    sampled = [i for i, m in zip(tokens.completion_ids, tokens.completion_mask) if m]
    assert sampled == [*fake_ids(SEARCH_PLAN), *fake_ids("yes"), *fake_ids(replan)]


def _hit(plan: str, sim: float) -> MemoryHit:
    entry = MemoryEntry("m1", "text", "others", "Which river flows through Paris?", "Search: Seine\n", "correct",
                        plan=plan)
    return MemoryHit(entry, score=1.0, sim=sim, sim_norm=1.0, value=0.0, freq=1.0)


async def test_a_verified_plan_of_the_same_question_is_replayed_at_inference_only() -> None:
    """``replay_min_similarity``: a positive memory of the same question (raw cosine at the floor or
    above) is the plan, written in the Planner's tokens (no generation, so no grammar per stored plan);
    learning still samples; below the floor, or without the setting, the Planner writes its own plan."""
    stored = "Search: Seine (river)\nSearch: Paris\n"
    runs = []

    async def run(sim: float, floor: float | None, **request: object) -> list[SamplingOptions]:
        agent, client, memory = agent_with(searches_script(_evidence_or_call), plan_form="searches",
                                           answer_from="evidence", max_replans=0, replay_min_similarity=floor)

        async def search(question: str, *, caption: str | None = None) -> SearchResult:
            return SearchResult("text/others", [_hit(stored, sim)], [])

        memory.search = search
        runs.append((client, await agent.research(ResearchRequest("Which river flows through Paris?", **request))))
        return [o for m, o in client.options if m == "planner"]

    assert await run(0.99, 0.95) == []  # replayed: the Planner generates nothing
    client, result = runs[-1]
    ((model, written),) = client.encoded
    assert model == "planner" and written.strip() == result.rollouts[0].plan.strip() == stored.strip()
    searched = [t.tool_call.arguments["query_list"] for t in result.rollouts[0].trajectory.turns]
    assert searched == [["Seine (river)"], ["Paris"]]  # the replayed plan's searches, in order
    general = plan_searches_regex(2, AgentConfig().regex.max_query_chars)
    assert [o.regex for o in await run(0.90, 0.95)] == [general]  # another question: the Planner's own plan
    assert [o.regex for o in await run(0.99, None)] == [general]  # the paper: never replayed
    (learning,) = await run(0.99, 0.95, ground_truth=["Seine"], num_rollouts=2, learn=True)
    assert learning.regex == general and learning.n == 2  # learning explores
