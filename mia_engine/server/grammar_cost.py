"""An estimate of what a structured-output constraint costs the grammar compiler, read from the request
alone (no compile), so a request whose grammar would hold the compiler for long is refused before it is
admitted.

The unit is roughly a millisecond of xgrammar compile (grammar, then the token-mask cache) on a vocabulary
of ``REFERENCE_VOCAB`` tokens; a larger vocabulary scales every cost up in proportion (``vocab_factor``), and
``LimitsConfig.max_grammar_cost`` is the budget. What costs (each measured with xgrammar, the engines'
backend): a regex repeat expands into one grammar element per repetition (``[a-z]{4000}`` is 4000
character classes, nested repeats multiply), a group of variable-length atoms only under a counted repeat
grows with the square of its expansion, each distinct string length bound (``maxLength``) costs with the
bound up to a couple of hundred characters, optional object properties grow about with the square of their
number, and numeric ranges and ``format`` each become a regex of their own. Enums, ``minItems`` / ``maxItems``
and plain nodes are cheap (they are bounded by the schema's byte cap and counted as nodes).
"""

from __future__ import annotations

from typing import Any

CLASS_COST = 1.0
"""One repetition of a character class, ``.`` or a class escape (``\\d``, ``\\w``, ...)."""
LITERAL_COST = 0.25
"""One repetition of a literal character."""
LENGTH_COSTS = {"maxLength": (3.4, 190), "minLength": (1.9, 120)}
"""A string length bound: its cost per character of the bound, and the bound past which the cost stays
flat (characters). Each distinct pair of bounds in a schema is a grammar rule of its own, compiled once
however many strings share it; past a couple of hundred characters every bound compiles alike (measured
with SmolLM2's vocabulary)."""
RANGE_COST = 6.0
"""A number with ``minimum`` / ``maximum`` bounds (compiled as a regex of the range)."""
FORMAT_COST = 8.0
"""A string ``format`` (date-time, email, uri, ...: a regex each)."""
NODE_COST = 0.05
"""Any schema object (a subschema)."""
OPTIONAL_SQUARED_COST = 1 / 1000
"""Times the square of an object's optional properties (their orders multiply the grammar's states)."""
NESTED_SQUARED_COST = 0.65
"""Times the square of the expanded size of a group of variable-length atoms only, repeated a counted number
of times (``(.?){30}``, ``(.{0,10}){10}``): with no fixed atom to anchor each repetition, a position can be
reached along many splits between them, so the compile grows with the square of the expansion. One fixed
atom (``(, "[^"]{1,20}"){0,3}``, ``(a.{0,10}){10}``) keeps it linear."""
HUGE = 10**9
"""A repeat count too long to read (more than nine digits): over any budget."""
REFERENCE_VOCAB = 32768
"""The vocabulary size (tokens) the unit is measured on; a larger vocabulary scales every cost up."""


def vocab_factor(vocab_size: int) -> float:
    """How much dearer a compile is on a ``vocab_size``-token vocabulary than on ``REFERENCE_VOCAB``:
    the token-mask cache checks every token in every state, so it grows with the vocabulary. Never below
    one, so a small vocabulary does not raise the budget."""
    return max(1.0, vocab_size / REFERENCE_VOCAB)


def regex_cost(pattern: str) -> float:
    """The expanded size of ``pattern``: literals and classes weighted, repeats multiplied (``*`` and ``+``
    are loops, counted once), and a group of variable-length atoms only under a counted repeat priced by the
    square of its expansion (``NESTED_SQUARED_COST``). Unbalanced or odd syntax is read leniently: the engine refuses
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
            frames[-1].group(top)
        elif char == "|":
            top.branch()
        elif char == "{" and (end := pattern.find("}", i)) > i and _is_repeat(pattern[i + 1:end]):
            top.repeat(*_repeat_bounds(pattern[i + 1:end]))
            i = end
        elif char == "?" and i > 0 and pattern[i - 1] not in "*+?}(|":
            top.optional()
        elif char not in "*+?^$":
            top.atom(LITERAL_COST)
        i += 1
    while len(frames) > 1:
        inner = frames.pop()
        frames[-1].group(inner)
    return frames[0].total()


def schema_cost(schema: Any) -> float:
    """The estimated compile cost of a JSON schema (every subschema walked, without recursion)."""
    cost, stack, lengths = 0.0, [schema], set()
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        cost += NODE_COST + _keyword_cost(node)
        bounds = tuple(node[k] if _is_number(node.get(k)) else 0 for k in LENGTH_COSTS)
        if any(bounds):
            lengths.add(bounds)
        stack.extend(value for value in node.values() if isinstance(value, (dict, list)))
    return cost + sum(_length_cost(bounds) for bounds in lengths)


def _length_cost(bounds: tuple[float, ...]) -> float:
    """A string rule of these length bounds (``LENGTH_COSTS``' order)."""
    return sum(min(bound, flat) * per_char for bound, (per_char, flat) in zip(bounds, LENGTH_COSTS.values()))


def _keyword_cost(node: dict) -> float:
    cost = 0.0
    if isinstance(pattern := node.get("pattern"), str):
        cost += regex_cost(pattern)
    if isinstance(patterns := node.get("patternProperties"), dict):
        cost += sum(regex_cost(key) for key in patterns)
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
    """A group being read: its finished alternatives, the current one, and the last atom (what a
    quantifier repeats): its cost, its expanded size, whether its length varies, and whether it floats (a
    group of variable-length atoms only, whose repetitions can split a string anywhere)."""

    def __init__(self) -> None:
        self.branches = 0.0
        self.current = 0.0
        self.last = 0.0
        self.sizes = 0.0
        """The expanded size of the finished alternatives and the current one (classes and literals
        weighted as in the cost, repeats multiplied, never squared)."""
        self.last_size = 0.0
        self.last_variable = False
        self.last_floats = False
        self.variable = False
        """Some atom of the group has a variable length (``?`` or a ``{m,n}`` with m < n)."""
        self.fixed = 0
        """Atoms of a fixed length in the group: one anchors where each repetition of the group starts."""

    def atom(self, cost: float, size: float | None = None, variable: bool = False, floats: bool = False) -> None:
        size = cost if size is None else size
        self.current += cost
        self.sizes += size
        self.last, self.last_size, self.last_variable, self.last_floats = cost, size, variable, floats
        self.variable |= variable
        self.fixed += not variable

    def group(self, inner: _Frame) -> None:
        """A closed group as one atom (its size: its alternatives' expansions together)."""
        self.atom(inner.total(), inner.sizes, inner.variable, inner.variable and not inner.fixed)

    def optional(self) -> None:
        self._vary()

    def repeat(self, low: int, high: int) -> None:
        size = self.last_size * high
        if self.last_floats and high > 1:
            cost = NESTED_SQUARED_COST * size * size
        else:
            cost = self.last * high
        self.current += cost - self.last
        self.sizes += size - self.last_size
        self.last, self.last_size = cost, size
        if low < high:
            self._vary()

    def _vary(self) -> None:
        """The last atom's length varies from now on."""
        self.fixed -= not self.last_variable
        self.last_variable = self.variable = True

    def branch(self) -> None:
        self.branches += self.current
        self.current = self.last = self.last_size = 0.0
        self.last_variable = self.last_floats = False

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


def _repeat_bounds(body: str) -> tuple[int, int]:
    """The bounds of ``{body}``: (m, n) of ``{m,n}``, (m, m) of ``{m}`` and of an open ``{m,}`` (its loop
    is counted once)."""
    low, comma, high = body.partition(",")
    count = high if comma and high else low
    return _number(low), _number(count)


def _number(digits: str) -> int:
    return int(digits) if len(digits) <= 9 else HUGE
