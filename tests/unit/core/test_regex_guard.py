"""The stop_regex guard: known catastrophic patterns are refused, common stop patterns pass, and
every pattern it accepts (hypothesis-generated) is in the bounded class, checked by enumerating
its match paths independently of the guard's own arithmetic, and by SGLang's own tail bound."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.regex_guard import (
    MAX_MATCH_CHARS,
    MAX_PATHS,
    MAX_PATTERN_CHARS,
    MAX_PATTERNS,
    UnsafeRegex,
    check_stop_regex,
)

try:
    from re import _constants as C  # type: ignore[attr-defined]
    from re import _parser as P  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import sre_constants as C  # type: ignore[no-redef]
    import sre_parse as P  # type: ignore[no-redef]

EVIL = [
    r"(a+)+$",
    r"(a*)*b",
    r"(a|a)*b",
    r"(a|aa)+$",
    r"(\w+\s?)*$",
    r"(.*a){12}",
    r"^(([a-z])+.)+[A-Z]([a-z])+$",
    r"(x+x+)+y",
    r"(\d+)*\.",
    r"(.*)*x",
    r"(a|a){1,30}b",  # bounded, but 2^30 ways
    r"((a{1,10}){1,10}){1,10}",
    r"(?P<q>a{1,5})(?P=q)",  # backreference
    r"(a)?(?(1)b|c)",  # conditional group
    r".*x",  # quadratic per step on a steered output
    r"[a-z]+\d",
    r"a{0,100000}",
    r"(?=(a+))a*b",
    "a" * (MAX_PATTERN_CHARS + 1),
    r"[",  # does not compile
    r"(?<!x)y",
]
COMMON = [
    r"\n\n",
    r"</answer>",
    r"<\|im_end\|>",
    r"(?i)final answer:",
    r"Answer: [A-D]",
    r"\n\s{0,32}\n",
    r"(?:\r?\n){2}",
    r"^\s{0,8}$",
    r"[.!?]\s{0,4}$",
    r"\d{1,3}\.",
    r"(User|Assistant|System):",
    r"\bEND\b",
    r"```",
    r"[^\n\r]{0,64}\n",
    r"\[/INST\]",
    r"(?:Q|Question)\s{0,2}:",
]


@pytest.mark.parametrize("pattern", EVIL)
def test_known_catastrophic_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(UnsafeRegex) as info:
        check_stop_regex(pattern)
    assert info.value.field == "stop_regex"


@pytest.mark.parametrize("pattern", COMMON)
def test_common_stop_patterns_pass(pattern: str) -> None:
    check_stop_regex(pattern)
    check_stop_regex([pattern, r"\n\n"])


def test_lists_name_the_bad_element_and_are_bounded() -> None:
    with pytest.raises(UnsafeRegex) as info:
        check_stop_regex(["ok", "(a+)+$"], "sampling_params.stop_regex")
    assert info.value.field == "sampling_params.stop_regex[1]"
    with pytest.raises(UnsafeRegex):
        check_stop_regex(["x"] * (MAX_PATTERNS + 1))
    for wrong in (5, {"a": 1}, ["a", 3]):
        with pytest.raises(UnsafeRegex):
            check_stop_regex(wrong)
    check_stop_regex(None)
    check_stop_regex([])


# --- an independent check of the accepted class ---


def _ends(items: list[Any], pos: int, budget: list[int]) -> Iterator[int]:
    """Every end position a backtracking matcher can reach from `pos`, one yield per path, when
    every atom matches every character (the worst text). Refuses (AssertionError) any construct
    outside the class and stops once the path budget is spent."""
    if not items:
        budget[0] -= 1
        assert budget[0] >= 0, "more match paths than the guard allows"
        yield pos
        return
    (op, av), rest = items[0], items[1:]
    if op in (C.LITERAL, C.IN, C.ANY):
        yield from _ends(rest, pos + 1, budget)
    elif op is C.AT:
        yield from _ends(rest, pos, budget)
    elif op is C.SUBPATTERN:
        yield from _ends(list(av[-1]) + rest, pos, budget)
    elif op is C.BRANCH:
        for branch in av[1]:
            yield from _ends(list(branch) + rest, pos, budget)
    elif op in (C.MAX_REPEAT, C.MIN_REPEAT):
        low, high, body = av
        assert high != C.MAXREPEAT, "an unbounded repeat was accepted"
        for count in range(low, high + 1):
            yield from _ends(list(body) * count + rest, pos, budget)
    else:
        raise AssertionError(f"{op} was accepted")


def _assert_in_safe_class(pattern: str) -> None:
    tree = P.parse(pattern)
    budget = [MAX_PATHS]
    longest = max(_ends(list(tree), 0, budget))
    assert longest <= MAX_MATCH_CHARS


ATOMS = st.sampled_from(["a", "b", r"\d", r"\s", ".", "[a-c]", r"\w", "[^ab]", "[^a]"])
ANCHORS = st.sampled_from(["", "", "", "^", "$", r"\b"])
QUANT = st.sampled_from(["", "", "?", "*", "+", "{2}", "{1,3}", "{0,8}", "{2,}", "{0,40}", "*?", "{1,300}"])


def _regex() -> st.SearchStrategy[str]:
    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        seq = st.lists(inner, min_size=1, max_size=3).map("".join)
        group = st.tuples(st.sampled_from(["(", "(?:"]), st.lists(seq, min_size=1, max_size=3), QUANT)
        return group.map(lambda g: g[0] + "|".join(g[1]) + ")" + g[2]) | st.tuples(inner, QUANT).map(
            lambda g: f"(?:{g[0]}){g[1]}"
        )

    base = st.tuples(ANCHORS, ATOMS, QUANT).map("".join)
    return st.recursive(base, extend, max_leaves=8).flatmap(
        lambda head: st.lists(st.just(head) | base, min_size=1, max_size=4).map("".join)
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_regex())
def test_every_accepted_pattern_is_in_the_bounded_class(pattern: str) -> None:
    try:
        re.compile(pattern)
    except re.error:
        return
    try:
        check_stop_regex(pattern)
    except UnsafeRegex:
        return
    _assert_in_safe_class(pattern)


def test_sglang_searches_a_bounded_tail_for_every_accepted_common_pattern() -> None:
    """SGLang sizes the decoded tail it searches from the pattern; accepted patterns keep it short."""
    sampling = pytest.importorskip("sglang.srt.sampling.sampling_params")
    for pattern in COMMON:
        assert sampling.get_max_seq_length(pattern) <= MAX_MATCH_CHARS, pattern
    assert sampling.get_max_seq_length(r"\n\n+") > MAX_MATCH_CHARS  # why unbounded repeats are refused
