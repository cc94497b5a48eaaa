"""PolyServe dynamic chunking (§4.7): the step-budget rule and what it buys over strict chunks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.dynamic_chunking import (
    ChunkStep,
    budget_from_startup,
    dynamic_chunk,
    startup_chunk_size,
)


def _finish_steps(lengths: list[int], budget: int, dynamic: bool, page: int = 1) -> tuple[list[int], list[int]]:
    """A FIFO prefill worker: (the step each request finishes in, tokens per step)."""
    remaining = list(lengths)
    finished = [0] * len(lengths)
    per_step: list[int] = []
    head, step = 0, 0
    while head < len(remaining):
        step += 1
        plan = dynamic_chunk(budget, remaining[head], page) if dynamic else ChunkStep(budget, True)
        left, used = plan.chunk, 0
        while head < len(remaining) and left > 0:
            take = min(left, remaining[head])
            remaining[head] -= take
            left -= take
            used += take
            if remaining[head] == 0:
                finished[head] = step
                head += 1
                if not plan.admit_others:
                    break
        per_step.append(used)
    return finished, per_step


def test_between_one_and_two_budgets_the_rest_runs_at_once_alone() -> None:
    assert dynamic_chunk(1024, 1025) == ChunkStep(1025, False)
    assert dynamic_chunk(1024, 2047) == ChunkStep(2047, False)


def test_outside_the_window_the_budget_is_unchanged() -> None:
    for remaining in (None, 0, 1, 1023, 1024, 2048, 5000):
        assert dynamic_chunk(1024, remaining) == ChunkStep(1024, True), remaining


def test_the_whole_finish_budget_is_page_rounded_but_never_above_the_ceiling() -> None:
    assert dynamic_chunk(1024, 1025, page_size=64) == ChunkStep(1088, False)  # SGLang compares paged lengths
    assert dynamic_chunk(1000, 1990, page_size=64, ceiling=2000) == ChunkStep(1000, True)  # 2048 > 2000
    assert dynamic_chunk(1024, 2047, page_size=64, ceiling=2048) == ChunkStep(2048, False)


def test_startup_size_and_budget_round_trip() -> None:
    assert startup_chunk_size(1024) == 2048
    assert budget_from_startup(startup_chunk_size(1024)) == 1024
    assert budget_from_startup(1) == 1


def test_the_papers_examples_save_a_step() -> None:
    # 2050 tokens at B=1024: three strict chunks, two dynamic ones (1024 + 1026).
    assert _finish_steps([2050], 1024, dynamic=False)[0] == [3]
    assert _finish_steps([2050], 1024, dynamic=True) == ([2], [1024, 1026])
    # Worst case: the first step already holds 1023 tokens of other work: 4 steps, now 3.
    assert _finish_steps([1023, 2050], 1024, dynamic=False)[0] == [1, 4]
    assert _finish_steps([1023, 2050], 1024, dynamic=True)[0] == [1, 3]


def test_nothing_else_rides_along_a_whole_finish_step() -> None:
    # The paged budget (1088) has room for 63 more tokens; they wait for the next step.
    finished, per_step = _finish_steps([1025, 10, 10], 1024, dynamic=True, page=64)
    assert finished == [1, 2, 2] and per_step == [1025, 20]


@settings(max_examples=200, deadline=None)
@given(
    budget=st.integers(min_value=1, max_value=64),
    lengths=st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=12),
)
def test_dynamic_chunking_never_finishes_a_request_later_and_steps_stay_under_2b(
    budget: int, lengths: list[int]
) -> None:
    strict, _ = _finish_steps(lengths, budget, dynamic=False)
    dynamic, per_step = _finish_steps(lengths, budget, dynamic=True)
    assert all(d <= s for d, s in zip(dynamic, strict)), (dynamic, strict)
    assert max(per_step) <= max(2 * budget - 1, budget)
    # A lone request with B < r < 2B takes one step instead of two.
    for r in lengths:
        if budget < r < 2 * budget:
            assert _finish_steps([r], budget, dynamic=True)[0] == [1]
            assert _finish_steps([r], budget, dynamic=False)[0] == [2]
