"""A pass's request columns: what each view says, read once per pass and shared by the policy
and finalize_plan, with a view's static numbers kept across passes without going stale."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from scheduler.core.columns import RowCache, ViewColumns
from scheduler.core.estimates import (
    DEFAULT_OUTPUT_LEN,
    deadline_base,
    next_deadline,
    output_bound,
    request_deadline,
    token_due,
)
from scheduler.core.pass_columns import columns_of, columns_read, sharing
from scheduler.core.perf_model import default_model
from scheduler.core.plan_path import LeverModel, finalize_plan, plan_pass, settings_for
from scheduler.core.policies import POLICIES, make_policy
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import EngineView, RequestView
from tests.unit.core.view_cases import SHAPES, view_passes

CASES = [pytest.param(seed, nw, nr, id=f"{nw}w{nr}r") for seed, (nw, nr) in enumerate(SHAPES)]


def _same(vector: float, scalar: float | None) -> bool:
    """Equal, with nan in the vector form for None (or nan) in the scalar one."""
    return math.isnan(vector) if scalar is None or math.isnan(scalar) else vector == scalar


def _groups(c: ViewColumns) -> list[frozenset[int]]:
    """The compound groups as sets of rows (the numbering itself means nothing)."""
    rows: dict[int, set[int]] = {}
    for i, g in enumerate(c.group.tolist()):
        if g >= 0:
            rows.setdefault(g, set()).add(i)
    return sorted(map(frozenset, rows.values()), key=min)


def _expected_groups(reqs: list[RequestView]) -> list[frozenset[int]]:
    rows: dict[tuple[object, object], set[int]] = {}
    for i, r in enumerate(reqs):
        if r.slo.slo_class is SloClass.COMPOUND and r.slo.program_id is not None:
            rows.setdefault((r.slo.program_id, r.slo.stage), set()).add(i)
    return sorted(map(frozenset, rows.values()), key=min)


def _assert_columns_are_the_views(c: ViewColumns, view: EngineView) -> None:
    reqs = [*view.waiting, *view.running]
    assert c.rids == [r.rid for r in reqs] and c.n_waiting == len(view.waiting)
    for i, r in enumerate(reqs):
        spec = r.slo
        assert c.arrival[i] == r.arrival and c.prompt[i] == r.prompt_len
        assert c.generated[i] == r.generated and c.cached[i] == r.prefix_cached
        assert c.started[i] == r.started and c.be_tier[i] == r.best_effort_tier
        assert c.attained[i] == r.attained_service
        assert c.rejects[i] == spec.rejects_when_infeasible
        assert _same(c.max_queue_s[i], None if spec.max_queue_ms is None else spec.max_queue_ms / 1000.0)
        assert _same(c.ttft_ms[i], spec.ttft_ms) and _same(c.tpot_ms[i], spec.tpot_ms)
        assert _same(c.deadline[i], request_deadline(r))
        if spec.deadline_ms is not None:
            assert c.base[i] == deadline_base(r.arrival, r.program_arrival)
        assert _same(c.next_due[i], next_deadline(r))
        assert _same(c.token_due(c.generated + 2)[i], token_due(spec, r.arrival, r.generated + 2))
        bound = output_bound(r.predicted_output_len, r.max_new_tokens, r.generated)
        assert c.total_out(DEFAULT_OUTPUT_LEN)[i] == bound
    assert _groups(c) == _expected_groups(reqs)


@pytest.mark.parametrize("seed,nw,nr", CASES)
def test_columns_hold_each_views_numbers_pass_after_pass(seed: int, nw: int, nr: int) -> None:
    cache = RowCache()
    for view in view_passes(seed, nw, nr, passes=4):
        _assert_columns_are_the_views(ViewColumns.read(view.waiting, view.running), view)
        _assert_columns_are_the_views(ViewColumns.read(view.waiting, view.running, cache), view)


def test_the_row_cache_drops_views_no_longer_seen_and_stays_right() -> None:
    cache = RowCache(slack=0)
    for view in view_passes(5, 40, 20, passes=6):
        _assert_columns_are_the_views(ViewColumns.read(view.waiting, view.running, cache), view)
        assert len(cache) <= 2 * (len(view.waiting) + len(view.running)) + 4  # what one pass may add


def test_one_copy_of_the_columns_per_pass_and_none_outside_it() -> None:
    view = next(view_passes(1, 5, 3))
    assert columns_of(view) is not columns_of(view)  # no scope: read afresh every time
    with sharing(view, RowCache()):
        assert columns_read(view) is None  # nobody has read them yet this pass
        shared = columns_of(view)
        assert columns_of(view) is shared and columns_read(view) is shared
        other = replace(view)  # another view, even an equal one, is not this pass's
        assert columns_of(other) is not columns_of(other)
        with sharing(other):  # each view holds its own pass's copy: two open passes do not mix
            assert columns_of(other) is columns_of(other) is not shared and columns_of(view) is shared
        assert columns_of(view) is shared and columns_read(other) is None
    assert columns_of(view) is not shared and columns_read(view) is None


@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "separate"])
@pytest.mark.parametrize("name", list(POLICIES))
def test_sharing_the_columns_changes_no_plan(name: str, mixed: bool) -> None:
    """plan_pass (one shared read, static numbers cached across passes) finishes every plan as
    an unshared policy.plan and finalize_plan do, pass after pass, for stateful policies too."""
    perf = default_model()
    shared, alone = make_policy(name, perf), make_policy(name, perf)
    settings = settings_for(shared, mixed_batching=mixed)
    cache = RowCache()
    for seed, (nw, nr) in enumerate(SHAPES):
        for view in view_passes(seed, nw, nr, passes=3):
            planned = plan_pass(view, shared, settings, LeverModel(perf), cache=cache)
            assert planned == finalize_plan(view, alone.plan(view), settings, LeverModel(perf))


def test_a_new_view_under_a_known_rid_is_read_anew() -> None:
    cache = RowCache()
    view = next(view_passes(2, 5, 3))
    ViewColumns.read(view.waiting, view.running, cache)
    first = view.waiting[0]
    moved = replace(first, arrival=first.arrival - 7.0, prompt_len=9, slo=replace(first.slo, weight=3.0))
    again = replace(view, waiting=[moved, *view.waiting[1:], first])  # the old view too, under the same rid
    for _ in range(2):
        _assert_columns_are_the_views(ViewColumns.read(again.waiting, again.running, cache), again)


def test_infinite_targets_keep_the_scalar_forms_arithmetic() -> None:
    """SloSpec built in code may hold an infinite TPOT or deadline (the HTTP edge refuses them):
    0·∞ is nan there too, not a huge finite number."""
    inf = math.inf
    specs = [
        SloSpec(ttft_ms=100.0, tpot_ms=inf, slo_class=SloClass.LATENCY),
        SloSpec(deadline_ms=inf, slo_class=SloClass.DEADLINE),
    ]
    reqs = [RequestView(f"r{i}", s, 10.0, 5, generated=g) for i, s in enumerate(specs) for g in (0, 3)]
    view = EngineView(11.0, reqs, [], 4, 512, 1000, 1000)
    with np.errstate(invalid="ignore"):  # numpy says so when it makes 0·∞ nan
        _assert_columns_are_the_views(ViewColumns.read(view.waiting, view.running, RowCache()), view)
