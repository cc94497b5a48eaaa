"""Which client `stop_regex` patterns a worker may run: a static bound on their matching cost.

SGLang checks every stop pattern with Python's backtracking `re.search` inside the scheduler
loop, on every decode step of the request, over the decoded tail of its output. The tail is as
long as the pattern's longest match (SGLang's `get_max_seq_length`); a pattern with an unbounded
repeat gets the whole output. One pattern that backtracks catastrophically (`(a+)+$`, `(a|a)*b`,
a backreference) therefore blocks the loop, and every other request on the worker with it.

The rule: a pattern is accepted only when the cost of one search is bounded by constants that do
not depend on the text, which the parse tree shows without running it:

- no unbounded repeat (`*`, `+`, `{n,}`): a stop condition fires as soon as its text appears, so
  `\\n\\n+` stops exactly where `\\n\\n` does, and `\\s*` can be written `\\s{0,32}`. An unbounded
  repeat makes the searched tail the whole output and, followed by anything that can fail, costs
  quadratic time per step on an output the client can steer (`logit_bias`);
- no backreference or conditional group (matching with them is NP-hard), no lookaround and no
  one-character negated class `[^x]` (SGLang's tail bound does not count these, so it would
  search the whole output every step; `[^x\\x00]` matches the same in any text without NULs);
- `paths`, the number of ways the pattern can match from one start position, at most
  MAX_PATHS: a branch adds its alternatives, a sequence multiplies, a repeat `{m,n}` of a body
  with `w` ways has `w^m + ... + w^n`. Nested repeats and alternation inside repeats, the
  exponential shapes, blow this count up and are refused by it;
- the longest match at most MAX_MATCH_CHARS characters, which bounds SGLang's tail.

A backtracking search tries each start position of the tail and, from each, at most `paths`
match attempts of at most the longest match each: the work per step is bounded by
tail x paths x longest match, fixed once the pattern is accepted. This is sound for a stop
condition because stop patterns are short literal-like markers; what the rule refuses (an
unbounded or deeply ambiguous pattern) can always be rewritten with bounded counts.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

from scheduler.core.field_error import FieldError


def _stdlib(new: str, old: str) -> Any:
    """The regex parser's modules (renamed in Python 3.11; the old names warn there)."""
    try:
        return importlib.import_module(new)
    except ImportError:  # pragma: no cover - Python 3.10
        return importlib.import_module(old)


sre_c = _stdlib("re._constants", "sre_constants")
sre_parse = _stdlib("re._parser", "sre_parse")

MAX_PATTERNS = 8  # stop patterns per request
MAX_PATTERN_CHARS = 256  # length of one pattern's source
MAX_MATCH_CHARS = 256  # longest text one pattern can match (SGLang's tail, in tokens, follows it)
MAX_PATHS = 1024  # ways one pattern can match from one start position

FIELD = "stop_regex"

# One-character atoms: each consumes exactly one character, in exactly one way.
_ATOMS = frozenset({sre_c.LITERAL, sre_c.IN, sre_c.ANY})
_REPEATS = frozenset({sre_c.MAX_REPEAT, sre_c.MIN_REPEAT})


class UnsafeRegex(FieldError):
    """A stop pattern the guard refuses; `field` names it for the 400 (e.g. stop_regex[1])."""


@dataclass(frozen=True)
class Cost:
    """The static cost of a (sub)pattern: ways to match from one position, longest match."""

    paths: int
    longest: int


def _cap(value: int) -> int:
    """Counts saturate just above the limit, so a huge repeat cannot build huge integers."""
    return min(value, MAX_PATHS + 1)


def _seq_cost(items: Any) -> Cost:
    paths, longest = 1, 0
    for op, av in items:
        cost = _item_cost(op, av)
        paths, longest = _cap(paths * cost.paths), min(longest + cost.longest, MAX_MATCH_CHARS + 1)
    return Cost(paths, longest)


def _repeat_cost(low: int, high: int, body: Any) -> Cost:
    if high == sre_c.MAXREPEAT:
        raise _Refused(
            "unbounded repeat (*, + or {n,}): a stop pattern fires as soon as it matches, "
            f"so use a bounded count such as {{{low},{max(low, 32)}}}"
        )
    inner = _seq_cost(body)
    paths, power = 0, 1
    for count in range(high + 1):
        if count >= low:
            paths = _cap(paths + power)
        power = _cap(power * inner.paths)
        if paths > MAX_PATHS:
            break
    longest = min(high * inner.longest, MAX_MATCH_CHARS + 1)
    return Cost(paths, longest)


def _item_cost(op: Any, av: Any) -> Cost:
    if op in _ATOMS:
        return Cost(1, 1)
    if op is sre_c.AT:
        return Cost(1, 0)
    if op is sre_c.SUBPATTERN:
        return _seq_cost(av[-1])
    if op is sre_c.BRANCH:
        costs = [_seq_cost(branch) for branch in av[1]]
        return Cost(_cap(sum(c.paths for c in costs)), max(c.longest for c in costs))
    if op in _REPEATS:
        low, high, body = av
        return _repeat_cost(low, high, body)
    if op in (sre_c.GROUPREF, sre_c.GROUPREF_EXISTS):
        raise _Refused("backreferences and conditional groups are not allowed")
    if op in (sre_c.ASSERT, sre_c.ASSERT_NOT):
        raise _Refused("lookahead and lookbehind are not allowed")
    if op is sre_c.NOT_LITERAL:  # SGLang's tail bound counts it as unbounded: the whole output
        raise _Refused(
            "a one-character negated class [^x] makes SGLang search the whole output each step: "
            "name two characters, e.g. [^x\\x00]"
        )
    raise _Refused(f"{str(op).lower()} is not allowed in a stop pattern")


class _Refused(Exception):
    pass


def pattern_cost(pattern: str) -> Cost:
    """The static cost of `pattern`; UnsafeRegex (field `stop_regex`) when it is refused."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise UnsafeRegex(FIELD, f"longer than {MAX_PATTERN_CHARS} characters")
    try:
        re.compile(pattern)
        tree = sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError) as exc:
        raise UnsafeRegex(FIELD, f"does not compile: {exc}") from None
    try:
        cost = _seq_cost(tree)
    except _Refused as exc:
        raise UnsafeRegex(FIELD, str(exc)) from None
    except RecursionError:
        raise UnsafeRegex(FIELD, "nested too deeply") from None
    if cost.paths > MAX_PATHS:
        raise UnsafeRegex(
            FIELD,
            f"can match in more than {MAX_PATHS} ways from one position (a long repeat, nested "
            "repeats or alternatives inside a repeat; the last two backtrack exponentially)",
        )
    if cost.longest > MAX_MATCH_CHARS:
        raise UnsafeRegex(FIELD, f"can match more than {MAX_MATCH_CHARS} characters")
    return cost


def check_stop_regex(value: Any, field: str = FIELD) -> None:
    """Refuse (UnsafeRegex naming `field`, or `field[i]` in a list) a stop_regex value SGLang
    would run unsafely; None, a string or a list of strings are what SGLang takes."""
    if value is None:
        return
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise UnsafeRegex(field, "must be a string or a list of strings")
    if len(patterns) > MAX_PATTERNS:
        raise UnsafeRegex(field, f"at most {MAX_PATTERNS} patterns")
    for i, pattern in enumerate(patterns):
        name = field if isinstance(value, str) else f"{field}[{i}]"
        try:
            pattern_cost(pattern)
        except UnsafeRegex as exc:
            raise UnsafeRegex(name, exc.message) from None
