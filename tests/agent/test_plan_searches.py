"""The ``searches`` plan form: its regex and its parser describe one format (whatever the regex lets
through parses to the queries it spells), and the parser is lenient with text written without it."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mia_engine.agent.plan_searches import parse_plan_searches, plan_searches_regex, render_plan_searches

REGEX = plan_searches_regex(2, 20)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.from_regex(REGEX, fullmatch=True))
def test_every_plan_the_regex_allows_parses_to_the_queries_it_spells(plan: str) -> None:
    lines = plan.split("\n")[:-1]
    queries = parse_plan_searches(plan, 2)
    assert 1 <= len(queries) <= len(lines) <= 2
    assert queries == list(dict.fromkeys(line[len("Search:"):].strip() for line in lines))
    assert all(q and len(q) <= 20 and not set(q) & set('"\\<\n') for q in queries)
    assert parse_plan_searches(render_plan_searches(queries), 2) == queries  # a memory of it reads back the same


def test_the_regex_refuses_what_the_executor_could_not_search_literally() -> None:
    for bad in ["", "Search: \n", "Search:  x\n", 'Search: say "hi"\n', "Search: a<b\n", "Search: x",
                "Search: a\nSearch: b\nSearch: c\n", "Search: " + "x" * 21 + "\n", "search: x\n"]:
        assert re.fullmatch(REGEX, bad) is None, bad


def test_parser_is_lenient_with_free_text_and_thinking() -> None:
    plan = ('<think>Search: hidden</think>First I will look.\n  Search:  Riga \nsearch: lower\nSearch: Riga\n'
            'Search: "Latvia"\nSearch:\nSearch: third\n')
    assert parse_plan_searches(plan, 2) == ["Riga", "Latvia"]
    assert parse_plan_searches(plan, 5) == ["Riga", "Latvia", "third"]
    assert parse_plan_searches("no searches here", 2) == []
    assert parse_plan_searches(None, 2) == []  # type: ignore[arg-type]  # untrusted output never raises


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError):
        plan_searches_regex(0, 10)
    with pytest.raises(ValueError):
        plan_searches_regex(1, 0)
