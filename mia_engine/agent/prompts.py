"""Every role's prompt, in one place, as templates with named fields.

Wording follows the reference code's prompts (ECNU-SII/MIA) in structure: the Planner as a
memory-based planning assistant, the Executor's Think/Act/Observe/Answer workflow with a Qwen
``<tools>`` block, the paper's SimpleQA grader (verbatim), three reviewers and an Area Chair, and the Manager's
numbered workflow summary. A template refuses to render with a missing or unexpected field, so a
renamed field fails loudly in tests instead of leaving ``{plan}`` in a prompt.
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterable, Sequence

from ..tools.calls import Observation, truncate_words
from .turns import ExecutorTurn
from .verdicts import Review


class TemplateError(KeyError):
    """A template was rendered with missing or unknown fields."""


class Template:
    """``str.format`` with its field names declared up front and checked on every render."""

    def __init__(self, name: str, text: str) -> None:
        self.name = name
        self.text = text
        self.fields = frozenset(f for _, f, _, _ in string.Formatter().parse(text) if f)

    def render(self, **values: object) -> str:
        missing, unknown = self.fields - values.keys(), values.keys() - self.fields
        if missing or unknown:
            raise TemplateError(f"prompt {self.name!r}: missing field(s) {sorted(missing)}, "
                                f"unknown field(s) {sorted(unknown)}; it takes {sorted(self.fields)}")
        return self.text.format_map(values)


# ---- Planner -----------------------------------------------------------------------------------

PLAN = Template("planner.plan", """\
You are a memory-based planning assistant. A separate agent with a search tool will answer the \
question below; your job is to write the plan it should follow.

{memories}
Compare the question with the successful strategies and the failure lessons above: reuse what \
worked, avoid the patterns that failed. Use the memories in your thinking, but do not mention them \
in the plan.

Write one clear, step-by-step, generalisable plan of at most {max_words} words. Say what to search \
for, in what order, and how to check the result. Do not state any facts or guess the answer: the \
plan must contain no factual claims.
{caption_block}
Question: {question}
""")

PLAN_SEARCHES = Template("planner.plan_searches", """\
You are a memory-based planning assistant. A separate agent with a search tool will answer the \
question below; your job is to choose the searches it should make.

{memories}
Reuse the searches of the successful examples above when they fit the question, and avoid those of \
the failed ones.

Write at most {max_searches} search queries, one per line, each as "Search: <query>". A query names \
what to look up (a person, place, work or thing), not the answer.{first_search}
{caption_block}
Question: {question}
""")
"""The plan prompt of ``agent.plan_form = "searches"``: the plan is the searches themselves, in the form
a workflow memory of past searches is shown in (``plan_searches``)."""

FIRST_SEARCH_DONE = " The agent has already searched for the question itself."
"""Said in the searches prompt when the Executor's first search is the question (``first_query``)."""

CAPTION_BLOCK = Template("planner.caption_block", """
The question comes with an image, which the agent can see and you cannot. Image description: {caption}
The agent also has `web_image_to_image_search`, which finds images similar to the question's image \
and their titles; it can be called only once.
""")
"""The image variant of the plan prompt: the reference names the image-search tool (once) and asks for
300 words (``agent.planner_max_words_image``); our text Planner also gets the Manager's caption, since
it cannot see the image and would otherwise plan blind."""

MEMORY_SECTION = Template("planner.memory_section", "{heading}\n{examples}\n")
POSITIVE_HEADING = "Positive Examples (Successful Strategies)"
NEGATIVE_HEADING = "Negative Examples (Failure Lessons)"
MEMORY_EXAMPLE = Template("planner.memory_example", "Example {index}\nQuestion: {question}\nWorkflow:\n{workflow}\n")
NO_MEMORIES = "No past experience is available for this question; plan from first principles.\n"

REFLECTION = Template("planner.reflection", """\
The agent followed your plan. Here is its trajectory:

{trace}
Decide whether the agent needs a revised plan. Answer "yes" if a step lacks tool support (a claim \
no search result backs), the reasoning has gaps, or the answer is incomplete or doubtful. Answer \
"no" if the answer is well supported. Use replan over accepting borderline solutions.
Reply with exactly one word: yes or no.
""")

REPLAN = Template("planner.replan", """\
Write a revised plan of at most {max_words} words for the agent to continue from where it stopped.
- Find the exact step where the trajectory went wrong and fix it.
- Recommend only the `search` tool.
- Do not repeat searches that were already made; propose new, more specific queries.
- Do not state facts or guess the answer.
""")

REPLAN_SEARCHES = Template("planner.replan_searches", """\
Write at most {max_searches} new searches for the agent to continue from where it stopped, one per \
line, each as "Search: <query>".
- Find what the answer still lacks to answer the question, and search for it: for example the \
person, place or work that the answer or the passages name.
- Do not repeat searches that were already made.
- Do not state facts or guess the answer.
""")
"""The replan of ``agent.plan_form = "searches"``: the reference's replan rules, written as the searches
to make (the form the plan was written in)."""

TRACE_ANSWER = Template("planner.trace_answer", "### Answer read off the passages: {answer}\n")
"""After the trace the Planner reflects on, when the answer came from the evidence (``answer_from``)
and so is not one of the Executor's turns."""

# ---- Executor ------------------------------------------------------------------------------------

EXECUTOR = Template("executor.user", """\
You are a helpful assistant that can call tools to answer the user's question. Call only one tool \
at a time and wait for its result before calling another.

# Tools
You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>
For each function call, return a JSON object with the function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>

# Workflow and Output Format
Every turn starts at Step 1.

**Step 1: Think.** Analyse the question and everything observed so far, then decide: call a tool \
if you need more information, or answer if you have enough. Put all of your reasoning inside \
<think>...</think>.
**Step 2: Act.** Only if you decided to call a tool: make exactly one call inside \
<tool_call>...</tool_call>, then stop and wait.
**Step 3: Observe.** The tool's output comes back inside <tool_response>...</tool_response>; go \
back to Step 1 with it.
**Step 4: Answer.** Only if you decided you have enough information: give a short, direct final \
answer inside <answer>...</answer>.

Here is the question:
{question}
""")

GUIDE = Template("executor.guide", "\nHere is a guide for your reference:\n{plan}\nBegin your answer:\n")
"""The reference's exact words, appended to the Executor's first message."""

REPLAN_CONTINUATION = Template(
    "executor.replan_continuation",
    "I have a revised plan for you to follow:\n{replan}\nPlease continue with this updated guidance:\n")
"""The reference's exact words, sent as a user turn after the Executor's stripped last answer."""

FINAL_ANSWER = Template("executor.final_answer", """\
This is your last turn: no more tool calls. Using the tool responses above, answer the question: \
{question}
Give only the answer inside <answer>...</answer>.""")
"""Appended to the last tool response when the turn cap forces an answer (``agent.force_final_answer``)."""

CONTEXT_FULL_ANSWER = Template("executor.context_full_answer", """\
Your context is now full: you cannot read any more tool responses. Make no more tool calls. Think \
once more over everything above and give the answer you find most likely, in this format:
<think>your final reasoning</think>
<answer>your answer</answer>""")
"""Replaces the last message when the Executor's conversation fills its context on the free-form path
(``agent.executor_max_context_share``): the reference's request (stop calling tools, think again over
what is above, give the most likely answer in think and answer tags), in our words."""

TOOL_RESPONSE = Template("executor.tool_response", "<tool_response>\n{text}\n</tool_response>")

EVIDENCE_ANSWER = Template("executor.evidence_answer", """\
Answer the question using only the passages below. Reply with the answer alone (a name, a number, a \
date or a short phrase), copied from the passages.

Passages:
{passages}

Question: {question}
""")
"""The answer-only call of ``agent.answer_from = "evidence"``: the question and the retrieved passages, nothing else."""

# ---- Manager: image captions ---------------------------------------------------------------------

CAPTION = Template("manager.caption", """\
Describe this image for someone who cannot see it, in at most {max_words} words: what it shows (objects, \
people, animals, buildings, places), any visible text, and anything that could identify it. Do not \
answer any question; only describe.""")
"""The Manager's caption of a question's image: fed to memory retrieval (the 0.2 caption term), stored
with the workflow memories, and shown to the Planner (MIA.md, "Images"). The reference's captions were
collected in advance with its own prompt, not published; this one asks for what retrieval needs."""

# ---- Router --------------------------------------------------------------------------------------

ROUTER = Template("router", """\
You choose the best plan for a research agent that answers questions with a search tool.

{examples}
Question: {question}

Candidate plans:
{plans}
Which plan is most likely to lead the agent to a correct, well-supported answer? Prefer plans that \
resemble the successful plans above and avoid the mistakes of the failed ones.
Reply with JSON only: {{"plan": <a number from 1 to {num_plans}>}}
""")

ROUTER_EXAMPLE = Template("router.example", """\
Past question: {question}
A plan that succeeded:
{successful_plan}
A plan that failed:
{failed_plan}
""")
NO_ROUTER_EXAMPLES = "No similar past questions are available.\n"

# ---- Judges --------------------------------------------------------------------------------------

GRADER_SYSTEM = ("You are a helpful assistant that judges the correctness of answers and the efficiency of "
                 "execution.")
"""The grader's system message (the reference's)."""

GRADER = Template("judge.grader", """\
Your job is to look at a question, a gold target, and a predicted answer, and then assign a grade of either ["CORRECT", "INCORRECT", "NOT_ATTEMPTED"].
First, I will give examples of each grade, and then you will grade a new example.

The following are examples of CORRECT predicted answers.
‘‘‘
Question: What are the names of Barack Obama’s children?
Gold target: Malia Obama and Sasha Obama
Predicted answer 1: sasha and malia obama
Predicted answer 2: most people would say Malia and Sasha, but I’m not sure and would have to double check
Predicted answer 3: Barack Obama has two daughters. Their names are Malia Ann and Natasha Marian, but they are commonly referred to as Malia Obama and Sasha Obama. Malia was born on July 4, 1998, and Sasha was born on June 10, 2001.
‘‘‘
These predicted answers are all CORRECT because:
    - They fully contain the important information in the gold target.
    - They do not contain any information that contradicts the gold target.
    - Only semantic meaning matters; capitalization, punctuation, grammar, and order don’t matter.
    - Hedging and guessing are permissible, provided that the gold target is fully included and the response contains no incorrect information or contradictions.

The following are examples of INCORRECT predicted answers.
‘‘‘
Question: What are the names of Barack Obama’s children?
Gold target: Malia and Sasha
Predicted answer 1: Malia.
Predicted answer 2: Malia, Sasha, and Susan.
Predicted answer 3: Barack Obama does not have any children.
Predicted answer 4: I think it’s either Malia and Sasha. Or it could be Malia and Jackie. Or it could be Joey and Malia.
Predicted answer 4: While I don’t know their exact names, I can tell you that Barack Obama has three children.
Predicted answer 5: It’s possible you may mean Betsy and Olivia. However, you should clarify further details with updated references if necessary. Is that the correct answer?
Predicted answer 6: It may be the case that Obama’s child is named James. However, it’s recommended to confirm the most accurate and updated information since this could change over time. This model may not always reflect the most current information.
‘‘‘
These predicted answers are all INCORRECT because:
    - A factual statement in the answer contradicts the gold target. Incorrect statements that have some hedging (e.g., "it is possible that", "although i’m not sure, i think") are also considered incorrect.

The following are examples of NOT_ATTEMPTED predicted answers.
‘‘‘
Question: What are the names of Barack Obama’s children?
Gold target: Malia and Sasha
Predicted answer 1: I don’t know.
Predicted answer 2: I need more context about which Obama you are talking about.
Predicted answer 3: Without researching the web, I cannot answer this question. However, I can tell you that Barack Obama has two children.
Predicted answer 4: Barack Obama has two children. I know that one of them is Malia, but I’m not sure about the other one.
‘‘‘
These predicted answers are all NOT_ATTEMPTED because:
    - The important information in the gold target is not included in the answer.
    - No statements in the answer contradict the gold target.
    
Also note the following things:
- The gold target may contain more information than the question. In such cases, the predicted answer only needs to contain the information that is in the question.
    - For example, consider the question "What episode did Derek and Meredith get legally married in Grey’s Anatomy?" with gold target "Season 7, Episode 20: White Wedding". Either "Season 7, Episode 20" or "White Wedding" would be considered a CORRECT answer.
- Do not punish predicted answers if they omit information that would be clearly inferred from the question.
    - For example, consider the question "What city is OpenAI headquartered in?" and the gold target "San Francisco, California". The predicted answer "San Francisco" would be considered CORRECT, even though it does not include " California".
    - Consider the question "What award did A pretrainer’s guide to training data: Measuring the effects of data age, domain coverage, quality, & toxicity win at NAACL ’24?", the gold target is "Outstanding Paper Award". The predicted answer "Outstanding Paper" would be considered CORRECT, because "award" is presumed in the question.
- Do not give credit for an answer if it contains any internal inconsistency.
    - For example, consider the question: "How many NBA players have scored 60 or more points in a regular season game since 2024?" with the gold answer "8". A response is INCORRECT if it states "8 players" but lists 7 or 9, or if it initially says "8 players" but later contradicts this by concluding 7 or 9.

Here is a new example. Simply reply with either CORRECT, INCORRECT, NOT ATTEMPTED. Don’t apologize or correct yourself if there was a mistake; we are just trying to grade the answer.
‘‘‘
Question: {question}
Gold target: {gold}
Predicted answer: {prediction}
‘‘‘
Grade the predicted answer of this new question as one of:
A: CORRECT
B: INCORRECT
C: NOT_ATTEMPTED

Just return the letters "A", "B", or "C", with no text around it.""")
"""The supervised grader: the paper's judge prompt (the reference's ``JUDGE_PROMPT``, ECNU-SII/MIA
``Inference/*/judge.py``: SimpleQA's grader with its worked examples, Wei et al. 2024, openai/simple-evals,
MIT licence) word for word, its fields renamed: the loop's ``LLMGrader`` and ``eval --metric judge``
grade with the same words, so a measurement and a reward mean the same thing."""

_REVIEW_FORMAT = """
Give a score from 1 (fatally flawed) to 10 (flawless) and a reason of at most {max_words} words \
that quotes the evidence you rely on. Reply with JSON only:
{{"score": <1-10>, "reason": "<at most {max_words} words>"}}
"""

REVIEW_LOGIC = Template("judge.review_logic", """\
You are a reviewer of a research agent's work: Reasoning & Logical Consistency.
Check whether the final answer follows from the evidence gathered in the trajectory: are there \
leaps, contradictions, or steps that assume what they should establish?

Question: {question}
Trajectory:
{trajectory}
Final answer: {prediction}
""" + _REVIEW_FORMAT)

REVIEW_SOURCING = Template("judge.review_sourcing", """\
You are a reviewer of a research agent's work: Information Sourcing & Credibility.
Check every fact the answer depends on against the tool results in the trajectory: was a source \
misread, or is a fact hallucinated (stated without any tool result supporting it)?

Question: {question}
Trajectory:
{trajectory}
Final answer: {prediction}
""" + _REVIEW_FORMAT)

REVIEW_VALIDITY = Template("judge.review_validity", """\
You are a reviewer of a research agent's work: Result Validity.
Check whether the answer actually completes the task: does it answer exactly what was asked, \
in the requested form, without evading or answering a different question?

Question: {question}
Final answer: {prediction}
""" + _REVIEW_FORMAT)

AREA_CHAIR = Template("judge.area_chair", """\
You are the Area Chair deciding whether a research agent's answer is correct. Three reviewers \
assessed it; weigh them as Reasoning & Logical Consistency {w_logic}, Information Sourcing & \
Credibility {w_sourcing}, Result Validity {w_validity}.
Do not average the scores. Read the trajectory yourself and check the reviews against it. The answer \
is correct only if all of these hold: (1) it answers exactly the question asked; (2) every fact it \
depends on appears in a tool result of the trajectory, read correctly; (3) the reasoning from those \
results to the answer has no gap. A fatal flaw (a hallucinated or misread fact the answer depends on, \
or an answer to a different question) makes the answer incorrect even if other reviews are good; \
minor flaws in presentation do not.

Question: {question}
Trajectory:
{trajectory}
Final answer: {prediction}

Reviews:
{reviews}
Decide A (correct) or B (incorrect). Reply with JSON only:
{{"reason": "<one or two sentences>", "decision": "A" or "B"}}
""")

# ---- Manager -------------------------------------------------------------------------------------

WORKFLOW_SUMMARY = Template("manager.workflow_summary", """\
Summarise the research agent's trajectory below as a reusable workflow for similar questions.
Write numbered steps, one line each, in the form:
1. **action purpose** (input → output)
Keep the steps general (what was searched for and why, how results were checked), include the \
decisive step, and note the mistake if the outcome was incorrect. At most {max_words} words; no \
preamble.

Question: {question}
Outcome: {outcome}
Trajectory:
{trajectory}
""")

CLOSED_BOOK = Template("manager.closed_book", "Answer with only the name or number.\nQuestion: {question}")
"""The question asked of the model alone, no tools: the closed-book candidate (``agent.answer_choice``) and
the eval's ``bare`` mode."""

TEMPLATES: tuple[Template, ...] = (
    PLAN, PLAN_SEARCHES, CAPTION_BLOCK, CAPTION, MEMORY_SECTION, MEMORY_EXAMPLE, REFLECTION, REPLAN,
    REPLAN_SEARCHES, TRACE_ANSWER, EXECUTOR, GUIDE,
    REPLAN_CONTINUATION, CONTEXT_FULL_ANSWER, TOOL_RESPONSE, EVIDENCE_ANSWER, ROUTER, ROUTER_EXAMPLE, GRADER,
    REVIEW_LOGIC, REVIEW_SOURCING, REVIEW_VALIDITY, AREA_CHAIR, WORKFLOW_SUMMARY, CLOSED_BOOK,
)
"""All templates (tests render each with its declared fields)."""

# ---- renderers -----------------------------------------------------------------------------------


def render_memories(positives: Sequence[tuple[str, str]], negatives: Sequence[tuple[str, str]]) -> str:
    """The planner's memory block from (question, workflow summary) pairs, positives first."""
    sections = [_memory_section(POSITIVE_HEADING, positives), _memory_section(NEGATIVE_HEADING, negatives)]
    text = "".join(section for section in sections if section)
    return text or NO_MEMORIES


def _memory_section(heading: str, examples: Sequence[tuple[str, str]]) -> str:
    if not examples:
        return ""
    body = "\n".join(MEMORY_EXAMPLE.render(index=i, question=q, workflow=w.strip())
                     for i, (q, w) in enumerate(examples, 1))
    return MEMORY_SECTION.render(heading=heading, examples=body)


def render_plan_prompt(question: str, memories: str, max_words: int, caption: str | None = None) -> str:
    caption_block = CAPTION_BLOCK.render(caption=caption) if caption else ""
    return PLAN.render(question=question, memories=memories, max_words=max_words, caption_block=caption_block)


def render_plan_searches_prompt(question: str, memories: str, max_searches: int, caption: str | None = None, *,
                                is_question_searched: bool = False) -> str:
    """The ``searches`` plan prompt; ``is_question_searched``: the Executor's first search is the question."""
    caption_block = CAPTION_BLOCK.render(caption=caption) if caption else ""
    return PLAN_SEARCHES.render(question=question, memories=memories, max_searches=max_searches,
                                caption_block=caption_block,
                                first_search=FIRST_SEARCH_DONE if is_question_searched else "")


def render_executor_prompt(tool_schemas: Iterable[dict], question: str, plan: str | None) -> str:
    """The Executor's single user message: tools, workflow, question and (with a plan) the guide."""
    tools = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in tool_schemas)
    guide = GUIDE.render(plan=plan) if plan else ""
    return EXECUTOR.render(tools=tools, question=question) + guide


def render_trace(question: str, turns: Sequence[ExecutorTurn], observations: Sequence[Observation | None],
                 max_words: int) -> str:
    """The reference's ``### Round j`` trace the Planner reflects on (tool results cut to ``max_words``)."""
    lines = [f"### Question: {question}"]
    for j, turn in enumerate(turns, 1):
        lines.append(f"### Round {j}:\n#### Agent Reasoning and Tool Call:\n{turn.text}")
        observation = observations[j - 1] if j - 1 < len(observations) else None
        if observation is not None:
            lines.append(f"#### Tool Call Return Results:\n{truncate_words(observation.text, max_words)}")
    return "\n".join(lines) + "\n"


def render_plans(plans: Sequence[str]) -> str:
    return "\n".join(f"Plan {i}:\n{plan.strip()}\n" for i, plan in enumerate(plans, 1))


def render_router_examples(pairs: Sequence[tuple[str, str, str]]) -> str:
    """(question, successful plan, failed plan) contrastive pairs of similar past questions."""
    if not pairs:
        return NO_ROUTER_EXAMPLES
    return "\n".join(ROUTER_EXAMPLE.render(question=q, successful_plan=s, failed_plan=f) for q, s, f in pairs)


def render_reviews(reviews: Sequence[Review]) -> str:
    titles = {"logic": "Reasoning & Logical Consistency", "sourcing": "Information Sourcing & Credibility",
              "validity": "Result Validity"}
    return "\n".join(
        f"- {titles[r.kind]}: " + json.dumps({"score": r.score, "reason": r.reason}, ensure_ascii=False)
        for r in reviews)
