"""What each Executor turn may be: the structured-output regex of a generated turn, and the calls of
turns the config fixes whole, which the loop writes instead of generating.

The paper's Executor chooses every turn freely (``structured_executor = false``, as configs/8xgpu.toml
runs it): the reference generates each turn unconstrained, cuts it after its first ``</tool_call>``, and
a turn without a call ends the loop. At its turn cap it forces nothing: the trajectory ends without an
answer (its prediction is then "Sorry, the number of llm calls exceeds the limit." in ``react_agent.py``,
the last tool-call turn in ``call_agent.py``). Its one forced answer is at the context limit, where a
prompt asking for the answer replaces the last message (``agent.executor_max_context_share``, in
``RolloutRunner._react``), and a last turn without ``<answer>`` is read whole as the answer
(``ExecutorRun.last_answer``). Structured turns do neither.
With structured outputs a turn is always well formed. The departures for small models each fix some
turns (config fields): the first search is the question (``first_query``), an image question starts with
the image search (``first_image_search``), the first turns must call a tool (``min_tool_calls``), the turn
cap's last turn must answer (``force_final_answer``). A ``searches`` plan adds its queries to the fixed ones.
"""

from __future__ import annotations

import json

from ..config.agent import AgentConfig
from .executor_run import ExecutorRun, search_calls
from .turns import executor_turn_regex, think_regex
from ..tools.calls import ToolCall
from ..tools.registry import IMAGE_SEARCH, SEARCH, Tools

TURN_OVERHEAD_CHARS = 160
"""Tags, newlines and the JSON skeleton of a structured turn, with room to spare (about 100 are used)."""


class TurnPolicy:
    """The Executor-turn departures of one config, over one tool set (chosen in ``strategies``)."""

    def __init__(self, config: AgentConfig, tools: Tools) -> None:
        self.limits = config.regex
        self.is_structured = config.structured_executor
        self.is_question_first = config.first_query == "question"
        self.is_image_first = config.first_image_search
        self.min_tool_calls = config.min_tool_calls
        self.is_final_answer_forced = config.force_final_answer
        self._can_search = SEARCH in tools.names()
        limits = dict(max_think_chars=self.limits.max_think_chars, max_answer_chars=self.limits.max_answer_chars,
                      max_query_chars=self.limits.max_query_chars, max_queries=self.limits.max_queries)
        self._free = {(allow, with_image): executor_turn_regex(tools.names(with_image=with_image),
                                                               allow_answer=allow, **limits)
                      for allow in (True, False) for with_image in (True, False)}
        self._answer_only = executor_turn_regex([], **limits)
        self._image_first = executor_turn_regex([IMAGE_SEARCH], allow_answer=False,
                                                max_think_chars=self.limits.max_think_chars)
        self._think_only = think_regex(self.limits.max_think_chars)

    def first_queries(self, question: str) -> list[str]:
        """The queries fixed before any plan's: the question itself with ``first_query = "question"``."""
        return [question] if self.is_question_first else []

    def starts_with_image_search(self, run: ExecutorRun) -> bool:
        return self.is_image_first and bool(run.images)

    def is_answer_only(self, is_last: bool) -> bool:
        """The turn cap's last turn, when it may only answer (``force_final_answer``)."""
        return is_last and self.is_structured and self.is_final_answer_forced

    def regex(self, run: ExecutorRun, *, is_last: bool) -> str | None:
        """The next turn's regex: answer only, a fixed call, a call or an answer (a call only before
        ``min_tool_calls``); None without structured outputs."""
        if self.is_answer_only(is_last):
            return self._answer_only
        if not self.is_structured:
            return None
        if self.starts_with_image_search(run) and not run.turns:
            return self._image_first
        if self.fixed_call(run) is not None:
            return self._think_only
        return self._free[run.num_tool_calls >= self.min_tool_calls, bool(run.images)]

    def fixed_call(self, run: ExecutorRun) -> ToolCall | None:
        """The call of the next turn, when it is fixed (structured turns only): the text searches of
        ``run.fixed_queries`` in order, after the image search first. The Executor generates the turn's
        think block alone (``regex``) and the loop writes this call after it (``turns.fixed_call_turn``):
        the same turn a regex with the query in it would give, without a grammar per query."""
        if not self.is_structured or not self._can_search:
            return None
        index = len(run.turns) - int(self.starts_with_image_search(run))
        return search_calls([run.fixed_queries[index]])[0] if 0 <= index < len(run.fixed_queries) else None

    def pinned_calls(self, run: ExecutorRun) -> list[ToolCall]:
        """The calls of a rollout whose turns are all fixed, as the loop writes them: the image search
        first (``first_image_search``), then the text searches of ``run.fixed_queries`` in order."""
        image = [ToolCall(IMAGE_SEARCH, {"img_idx": "0"})] if self.starts_with_image_search(run) else []
        return image + search_calls(run.fixed_queries)

    def max_chars(self, run: ExecutorRun) -> int:
        """The longest Executor turn the regexes allow (tags and JSON included): a token budget that
        never cuts a turn (a token is at least one character)."""
        limits = self.limits
        query = max((len(json.dumps(q, ensure_ascii=False)) for q in [run.question, *run.fixed_queries]), default=0)
        body = max(limits.max_answer_chars, limits.max_queries * (limits.max_query_chars + 4), query, 300)
        return limits.max_think_chars + body + TURN_OVERHEAD_CHARS
