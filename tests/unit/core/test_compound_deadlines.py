"""Stage sub-deadlines from matched program patterns, learned online."""

from __future__ import annotations

import pytest

from scheduler.core.analyzer.graph import PatternGraph, PatternLibrary, StageCost, SuperNode
from scheduler.core.compound import CompoundDeadlines

COST = StageCost(prefill_per_token=0.0, decode_per_token=1.0)  # stage time = output tokens


def _graph(*outs: float) -> PatternGraph:
    return PatternGraph(tuple(SuperNode.from_calls([(10.0, o)], COST) for o in outs))


def test_no_history_means_no_sub_deadline() -> None:
    cd = CompoundDeadlines(cost=COST)
    assert cd.stage_deadline("p", 0, program_arrival=100.0, deadline_s=20.0, now=100.0) is None


def test_stage_deadlines_follow_the_matched_pattern_share() -> None:
    library = PatternLibrary()
    library.add(_graph(10, 30, 60))  # φ = 0.1, 0.4, 1.0
    cd = CompoundDeadlines(library, cost=COST)
    assert cd.stage_deadline("p", 0, 100.0, 20.0, now=100.0) == pytest.approx(100.0 + 0.1 * 20.0)
    cd.on_finish("p", 0, 10, 10, now=102.0)
    assert cd.stage_deadline("p", 1, 100.0, 20.0, now=102.0) == pytest.approx(100.0 + 0.4 * 20.0)
    cd.on_finish("p", 1, 10, 30, now=107.0)
    assert cd.stage_deadline("p", 2, 100.0, 20.0, now=107.0) == pytest.approx(120.0)


def test_parallel_calls_of_a_stage_share_one_deadline_and_unnamed_stages_advance() -> None:
    library = PatternLibrary()
    library.add(_graph(50, 50))
    cd = CompoundDeadlines(library, cost=COST)
    first = cd.stage_deadline("p", None, 0.0, 10.0, now=0.0)
    assert cd.stage_deadline("p", None, 0.0, 10.0, now=0.1) == first == pytest.approx(5.0)
    cd.on_finish("p", None, 5, 50, now=4.0)
    assert cd.stage_deadline("p", None, 0.0, 10.0, now=4.0) == pytest.approx(10.0)


def test_idle_programs_join_the_library_and_guide_the_next_run() -> None:
    cd = CompoundDeadlines(idle_s=30.0, cost=COST)
    cd.stage_deadline("run-1", 0, 0.0, 10.0, now=0.0)
    cd.on_finish("run-1", 0, 10, 20, now=1.0)
    cd.stage_deadline("run-1", 1, 0.0, 10.0, now=1.0)
    cd.on_finish("run-1", 1, 10, 80, now=5.0)
    assert cd.expire(now=20.0) == 0 and len(cd) == 1
    assert cd.expire(now=40.0) == 1 and len(cd.library) == 1
    assert cd.stage_deadline("run-2", 0, 50.0, 10.0, now=50.0) == pytest.approx(50.0 + 0.2 * 10.0)


def test_a_program_with_a_call_in_flight_is_not_closed_while_it_waits() -> None:
    cd = CompoundDeadlines(idle_s=30.0, cost=COST)
    cd.stage_deadline("run-1", 0, 0.0, 10.0, now=0.0)
    cd.on_finish("run-1", 0, 10, 20, now=1.0)
    cd.stage_deadline("run-1", 1, 0.0, 10.0, now=2.0)  # queued far longer than idle_s
    assert cd.expire(now=100.0) == 0 and len(cd) == 1 and len(cd.library) == 0
    cd.on_finish("run-1", 1, 10, 80, now=150.0)
    assert cd.expire(now=170.0) == 0
    assert cd.expire(now=190.0) == 1 and len(cd.library) == 1
    # Stage 0 is a fifth of the whole program (20 of 100 tokens); split, it would be all of one.
    assert cd.stage_deadline("run-2", 0, 200.0, 10.0, now=200.0) == pytest.approx(200.0 + 0.2 * 10.0)


def test_a_call_that_never_reports_back_holds_its_program_for_a_bounded_time() -> None:
    cd = CompoundDeadlines(idle_s=30.0, cost=COST)
    cd.stage_deadline("lost", 0, 0.0, 10.0, now=0.0)
    assert cd.expire(now=299.0) == 0
    assert cd.expire(now=301.0) == 1
