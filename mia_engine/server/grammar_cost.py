"""An estimate of what a structured-output constraint costs the grammar compiler, read from the request
alone (no compile), so a request whose grammar would hold the compiler for long is refused before it is
admitted.

The unit is roughly a millisecond of xgrammar compile (grammar, then the token-mask cache) on a mid-sized
vocabulary; compile time grows with the vocabulary, so ``LimitsConfig.max_grammar_cost`` is the knob. What
costs (each measured with xgrammar, the engines' backend): a regex repeat expands into one grammar
element per repetition (``[a-z]{4000}`` is 4000 character classes, nested repeats multiply), string
lengths (``maxLength``) likewise but more cheaply, optional object properties grow about with the square of
their number, and numeric ranges and ``format`` each become a regex of their own. Enums, ``minItems`` /
``maxItems`` and plain nodes are cheap (they are bounded by the schema's byte cap and counted as nodes).
"""

from __future__ import annotations

from typing import Any

CLASS_COST = 1.0
"""One repetition of a character class, ``.`` or a class escape (``\\d``, ``\\w``, ...)."""
LITERAL_COST = 0.25
"""One repetition of a literal character."""
LENGTH_COST = 1 / 64
"""One character of a string's ``minLength`` / ``maxLength``."""
RANGE_COST = 6.0
"""A number with ``minimum`` / ``maximum`` bounds (compiled as a regex of the range)."""
FORMAT_COST = 8.0
"""A string ``format`` (date-time, email, uri, ...: a regex each)."""
NODE_COST = 0.05
"""Any schema object (a subschema)."""
OPTIONAL_SQUARED_COST = 1 / 1000
"""Times the square of an object's optional properties (their orders multiply the grammar's states)."""
HUGE = 10**9
"""A repeat count too long to read (more than nine digits): over any budget."""


def regex_cost(pattern: str) -> float:
    """The expanded size of ``pattern``: literals and classes weighted, repeats multiplied (``*``, ``+``
    and ``?`` are loops, counted once). Unbalanced or odd syntax is read leniently: the engine refuses
    invalid patterns itself."""
    frames = [_Frame()]
    i, n = 0, len(pattern)
    while i < n:
        char, top = pattern[i], frames[-1]
        if char == "\\" and i + 1 < n:
            top.atom(CLASS_COST if pattern[i + 1] in "dDwWsS" else LITERAL_COST)
            i += 2
            continue
        if char == "[":
            i = _class_end(pattern, i)
            top.atom(CLASS_COST)
        elif char == ".":
            top.atom(CLASS_COST)
        elif char == "(":
            frames.append(_Frame())
            i = _group_start(pattern, i)
        elif char == ")" and len(frames) > 1:
            frames.pop()
            frames[-1].atom(top.total())
        elif char == "|":
            top.branch()
        elif char == "{" and (end := pattern.find("}", i)) > i and _is_repeat(pattern[i + 1:end]):
            top.repeat(_repeat_count(pattern[i + 1:end]))
            i = end
        elif char not in "*+?^$":
            top.atom(LITERAL_COST)
        i += 1
    while len(frames) > 1:
        inner = frames.pop()
        frames[-1].atom(inner.total())
    return frames[0].total()


def schema_cost(schema: Any) -> float:
    """The estimated compile cost of a JSON schema (every subschema walked, without recursion)."""
    cost, stack = 0.0, [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        cost += NODE_COST + _keyword_cost(node)
        stack.extend(value for value in node.values() if isinstance(value, (dict, list)))
    return cost


def _keyword_cost(node: dict) -> float:
    cost = 0.0
    if isinstance(pattern := node.get("pattern"), str):
        cost += regex_cost(pattern)
    if isinstance(patterns := node.get("patternProperties"), dict):
        cost += sum(regex_cost(key) for key in patterns)
    lengths = [node.get("minLength"), node.get("maxLength")]
    cost += max((v for v in lengths if _is_number(v)), default=0) * LENGTH_COST
    if any(_is_number(node.get(k)) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        cost += RANGE_COST
    if isinstance(node.get("format"), str):
        cost += FORMAT_COST
    if isinstance(properties := node.get("properties"), dict):
        required = node.get("required")
        named = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
        optional = len(properties) - len(named & properties.keys())
        cost += optional * optional * OPTIONAL_SQUARED_COST
    return cost


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


class _Frame:
    """A group being read: its finished alternatives, the current one, and the last atom's cost (what
    a quantifier repeats)."""

    def __init__(self) -> None:
        self.branches = 0.0
        self.current = 0.0
        self.last = 0.0

    def atom(self, cost: float) -> None:
        self.current += cost
        self.last = cost

    def repeat(self, count: int) -> None:
        self.current += self.last * (count - 1)
        self.last *= count

    def branch(self) -> None:
        self.branches += self.current
        self.current = self.last = 0.0

    def total(self) -> float:
        return self.branches + self.current


def _class_end(pattern: str, start: int) -> int:
    """The index of the ``]`` closing the class opened at ``start`` (a leading ``]`` or ``^]`` is a member)."""
    i = start + 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i


def _group_start(pattern: str, start: int) -> int:
    """The index of the last character of a group's opening: ``(``, ``(?:``, ``(?=``, ``(?P<name>``, ..."""
    if not pattern.startswith("?", start + 1):
        return start
    if pattern.startswith(("?P<", "?<"), start + 1) and not pattern.startswith(("?<=", "?<!"), start + 1):
        end = pattern.find(">", start)
        return end if end > 0 else start + 1
    return start + 2


def _is_repeat(body: str) -> bool:
    low, _, high = body.partition(",")
    return low.isdigit() and (high == "" or high.isdigit()) and all(c.isascii() for c in body)


def _repeat_count(body: str) -> int:
    """How many times ``{body}`` repeats: the upper bound, or the lower one when open (``{m,}``)."""
    low, comma, high = body.partition(",")
    count = high if comma and high else low
    return int(count) if len(count) <= 9 else HUGE
