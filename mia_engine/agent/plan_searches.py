"""The Planner's plan as the searches to make (``agent.plan_form = "searches"``), in its two views: the
regex (vLLM structured outputs) that lets the Planner write only that form, and the parser that reads
the queries back. They describe one format, so they change together: every text the regex allows
parses to the distinct queries it spells (``tests/agent/test_plan_searches.py`` checks it with hypothesis).

A plan of this form is one to ``max_searches`` lines ``Search: <query>``. The Executor runs them as
its searches, in order; a workflow memory of such a rollout is written in the same lines, so the
Planner can reuse the searches of a past success by copying them.
"""

from __future__ import annotations

from .model_text import strip_think

SEARCH_PREFIX = "Search:"
_QUERY_EXCLUDED = frozenset('"\\<') | frozenset(map(chr, range(32)))
"""Never in a query: control characters (a line break ends it), and quotes, backslashes and ``<``, which
would need escaping in the Executor's tool-call JSON and its tags (the turn regex pins the query
literally)."""


def plan_searches_regex(max_searches: int, max_query_chars: int) -> str:
    """One to ``max_searches`` lines ``Search: <query>``, each query 1..``max_query_chars`` characters,
    starting with a visible one. Bounded repeats only (a subset every structured-output backend compiles)."""
    if max_searches < 1 or max_query_chars < 1:
        raise ValueError("max_searches and max_query_chars must be >= 1")
    excluded = r'"\\<\x00-\x1f'
    line = rf"{SEARCH_PREFIX} [^\s{excluded}][^{excluded}]{{0,{max_query_chars - 1}}}\n"
    return rf"({line}){{1,{max_searches}}}"


def plan_searches_chars(max_searches: int, max_query_chars: int) -> int:
    """The longest text ``plan_searches_regex`` allows: a token budget that never cuts it (a token is at
    least one character)."""
    return max_searches * (len(SEARCH_PREFIX) + max_query_chars + 2)


def parse_plan_searches(plan: str, max_searches: int) -> list[str]:
    """The queries of a plan, in order, without repeats, at most ``max_searches``; lenient about
    spacing and about text around the lines (a plan written without the regex); never raises."""
    queries: list[str] = []
    for line in strip_think(plan if isinstance(plan, str) else "").split("\n"):
        line = line.strip()
        if not line.startswith(SEARCH_PREFIX):
            continue
        query = "".join(c for c in line[len(SEARCH_PREFIX):] if c not in _QUERY_EXCLUDED).strip()
        if query and query not in queries:
            queries.append(query)
    return queries[:max_searches]


def render_plan_searches(queries: list[str]) -> str:
    """Queries in the plan's own form (what the Planner writes, and a workflow memory of its searches)."""
    return "".join(f"{SEARCH_PREFIX} {query}\n" for query in queries)
