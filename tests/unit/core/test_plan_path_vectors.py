"""The plan path's per-request checks and the policies' per-request bookkeeping, vectorised on a
pass's columns, equal straightforward per-request references on seeded views of every kind."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from scheduler.core.admission import certainly_late
from scheduler.core.batch_limits import PACE_FLOOR_STEPS, _running_slack, _ttft_needs, batch_levers, tightest_tpot
from scheduler.core.columns import ViewColumns
from scheduler.core.estimates import (
    absolute_deadline,
    deadline_seconds,
    next_token_due,
    output_bound,
    request_deadline,
    token_due,
)
from scheduler.core.lost_hold import held_lost_at, held_lost_causes, past_due
from scheduler.core.pass_columns import columns_of, sharing
from scheduler.core.perf_model import constant_model, default_model, linear_model
from scheduler.core.plan_path import LeverModel, PlanSettings, finalize_plan
from scheduler.core.policies import make_policy
from scheduler.core.policies.gmax import GmaxParams, GmaxPolicy
from scheduler.core.policies.slos import SlosServePolicy, _by_key
from scheduler.core.queue_timeout import expired_in_queue, expired_rids
from scheduler.core.slo import SloClass
from scheduler.core.slos_serve.items import demand, prefill_deadline
from scheduler.core.types import EngineView, PerfModel, RequestView, StepPlan
from tests.unit.core.view_cases import SHAPES, view_passes, with_duplicate_rids

CASES = [pytest.param(seed, nw, nr, id=f"{nw}w{nr}r") for seed, (nw, nr) in enumerate(SHAPES)]
MODELS = [default_model(), linear_model(base_s=0.002, per_token_s=1e-6), constant_model(0.5)]


def _tiers(view: EngineView, rng: random.Random) -> list[frozenset[str]]:
    rids = [r.rid for r in view.waiting]
    return [frozenset(), frozenset(rids), frozenset(r for r in rids if rng.random() < 0.5)]


# -- per-request references ----------------------------------------------------------------


def _held(view: EngineView, tier: frozenset[str]) -> frozenset[str]:
    lost = [r.rid for r in view.waiting if r.rid in tier and past_due(r, view.now)]
    slo_work = any(not (r.best_effort_tier or r.slo.is_best_effort) for r in view.running) or any(
        r.rid not in tier and not r.slo.is_best_effort for r in view.waiting
    )
    return frozenset(lost) if lost and slo_work else frozenset()


def _tightest(view: EngineView) -> float | None:
    reqs = (*view.running, *view.waiting)
    tpots = [r.slo.tpot_ms / 1000.0 for r in reqs if r.slo.tpot_ms is not None and not r.best_effort_tier]
    return min(tpots) if tpots else None


def _budget(view: EngineView, tokens_per_step: float, decode_s: float) -> float | None:
    ahead = int(math.ceil(tokens_per_step)) - 1
    slack = []
    for r in view.running:
        if r.generated > 0 and not r.best_effort_tier and r.slo.tpot_ms is not None:
            due = token_due(r.slo, r.arrival, r.generated + ahead)
            if due is not None and due >= view.now:
                slack.append(due - view.now)
        deadline = request_deadline(r)
        if r.slo.slo_class in (SloClass.DEADLINE, SloClass.COMPOUND) and not r.best_effort_tier and deadline:
            left = max(output_bound(r.predicted_output_len, r.max_new_tokens, r.generated) - r.generated, 1.0)
            pace = (deadline - view.now) / left * tokens_per_step
            if pace >= PACE_FLOOR_STEPS * decode_s:
                slack.append(pace)
    return min(slack) if slack else None


def _needs(
    view: EngineView, perf: PerfModel, decodes: int, kv: int, limit: int
) -> tuple[list[tuple[int, float]], bool]:
    needs, urgent = [], False
    decode_s = perf.step_time(0, len(view.running), kv)
    for r in view.waiting:
        if r.slo.ttft_ms is None or r.best_effort_tier or r.started:
            continue
        slack = r.arrival + r.slo.ttft_ms / 1000.0 - view.now
        if slack <= 0:
            continue
        remaining = max(r.prompt_len - r.prefix_cached, 1)
        step = perf.step_time(min(remaining, limit), decodes, kv)
        fastest = step * -(-remaining // limit)
        if slack <= fastest:
            continue  # lost whatever the chunk
        urgent = urgent or slack - decode_s < fastest
        needs.append((min(-(-remaining // max(int(slack / step), 1)), limit), r.slo.weight))
    return needs, urgent


def _late_without_model(view: EngineView) -> list[str]:
    def due(r: RequestView) -> float | None:
        if r.slo.slo_class is SloClass.LATENCY:
            return None if r.slo.ttft_ms is None else r.arrival + r.slo.ttft_ms / 1000.0
        return request_deadline(r) if r.slo.slo_class in (SloClass.DEADLINE, SloClass.COMPOUND) else None

    return [
        r.rid
        for r in view.waiting
        if r.slo.rejects_when_infeasible and not r.started and (d := due(r)) is not None and view.now > d
    ]


# -- the plan path ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed,nw,nr", CASES)
def test_the_hold_is_the_per_request_one(seed: int, nw: int, nr: int) -> None:
    rng = random.Random(seed)
    for view in view_passes(seed, nw, nr):
        for tier in _tiers(view, rng):
            assert held_lost_causes(view, tier) == _held(view, tier)
            at = np.array([i for i, r in enumerate(view.waiting) if r.rid in tier], dtype=np.int64)
            held_at = held_lost_at(view, at).tolist()  # the plan's positions
            assert held_at == sorted(held_at) and {view.waiting[i].rid for i in held_at} == _held(view, tier)


def _hold_tiers(view: EngineView, rng: random.Random) -> list[frozenset[str]]:
    """`_tiers`, and tiers the hold takes whole or nearly whole: the past-due waiting requests,
    alone and with a few that may still make it."""
    lost = [r.rid for r in view.waiting if past_due(r, view.now)]
    others = [r.rid for r in view.waiting if not past_due(r, view.now)]
    return [*_tiers(view, rng), frozenset(lost), *(frozenset(lost + others[:k]) for k in (1, 2))]


@pytest.mark.parametrize("seed,nw,nr", CASES)
def test_a_plan_given_as_positions_is_finished_as_the_same_plan_given_as_rids(seed: int, nw: int, nr: int) -> None:
    rng = random.Random(seed)
    levers = LeverModel(default_model())
    for base in view_passes(seed, nw, nr):
        for view in (base, replace(base, now=base.now + 5.0)):  # later: most of the queue past due
            _check_finished_alike(view, rng, levers)


def _check_finished_alike(view: EngineView, rng: random.Random, levers: LeverModel) -> None:
    rids = [r.rid for r in view.waiting]
    for tier in _hold_tiers(view, rng):
        order_at = np.array(rng.sample(range(len(rids)), len(rids)), dtype=np.int64)
        tier_at = np.array([i for i, rid in enumerate(rids) if rid in tier], dtype=np.int64)
        by_rids = StepPlan(order=[rids[i] for i in order_at.tolist()], best_effort=set(tier))
        by_positions = StepPlan(
            order=list(by_rids.order or ()), best_effort=frozenset(tier), order_at=order_at, best_effort_at=tier_at
        )
        a = finalize_plan(view, by_rids, PlanSettings(), levers)
        b = finalize_plan(view, by_positions, PlanSettings(), levers)
        if b.hold_at is not None:  # the positions name the held requests
            assert b.hold == {rids[i] for i in b.hold_at.tolist()}
        assert b == a  # order, tier, hold, drops and their waits, preemptions, levers


@pytest.mark.parametrize("seed,nw,nr", CASES)
def test_the_batch_levers_inputs_are_the_per_request_ones(seed: int, nw: int, nr: int) -> None:
    for view in view_passes(seed, nw, nr):
        c = ViewColumns.read(view.waiting, view.running)
        assert tightest_tpot(view, c) == _tightest(view)
        kv = sum(r.prompt_len + r.generated for r in view.running)
        for tokens_per_step in (1.0, 2.5):
            for decode_s in (0.0, 0.02, 0.5):
                slack = _running_slack(view, tokens_per_step, c, decode_s)
                budget = _budget(view, tokens_per_step, decode_s)
                assert (None if slack is None else float(slack[0].min())) == pytest.approx(budget)
        for perf in MODELS:
            for decodes in (0, len(view.running)):
                for limit in (16, 512, 8192):
                    got = _ttft_needs(view, perf, decodes, kv, limit, c)
                    needs, urgent = _needs(view, perf, decodes, kv, limit)
                    assert list(zip(got.tokens.tolist(), got.weight.tolist(), strict=True)) == needs
                    assert got.urgent == urgent
            for mixed in (True, False):
                assert batch_levers(view, perf, 1.0, mixed) == batch_levers(view, perf, 1.0, mixed, c)


@pytest.mark.parametrize("seed,nw,nr", CASES)
def test_admission_on_the_columns_is_admission_on_the_views(seed: int, nw: int, nr: int) -> None:
    for view in view_passes(seed, nw, nr):
        c = ViewColumns.read(view.waiting, view.running)
        assert certainly_late(view, None) == certainly_late(view, None, columns=c) == _late_without_model(view)
        for perf in MODELS:
            assert certainly_late(view, perf) == certainly_late(view, perf, columns=c)
        assert expired_rids(c, view.now) == expired_in_queue(view.waiting, view.now)


# -- the policies' own per-request work -------------------------------------------------------


@pytest.mark.parametrize("seed,nw,nr", CASES)
def test_slos_tiers_and_queue_triage_are_the_per_request_ones(seed: int, nw: int, nr: int) -> None:
    rng = random.Random(seed)
    policy = make_policy("slos", default_model())
    assert isinstance(policy, SlosServePolicy)
    share, default = policy.prefill_share, policy.default_output
    for plain in view_passes(seed, nw, nr):
        for view in (plain, with_duplicate_rids(plain)):
            policy.plan(view)  # sets the decode floor; later passes force what it admitted
            policy._admitted |= {r.rid for r in view.waiting if rng.random() < 0.2}
            c = ViewColumns.read(view.waiting, view.running)
            now, floor = view.now, policy._floor

            decoding, prefilling, _ = policy._running_demands(view, c)
            expected_decoding, expected_prefilling = [], []
            for r in view.running:
                d = demand(r, now, default, share, floor)
                if r.started or d is None:
                    expected_decoding.append(None if d is None else d.tpot)
                else:
                    expected_prefilling.append((r, d))
            tiers = [None if math.isnan(t) else t for t in decoding.tolist()]
            assert Counter(tiers) == Counter(expected_decoding) and prefilling == expected_prefilling

            queue = policy._triage(view, c)
            undecided, no_target, declined, forced = [], [], [], []
            for r in view.waiting:
                deadline = prefill_deadline(r, now, share)
                if deadline is None:
                    no_target.append((r.arrival, r.rid))
                elif deadline <= now:
                    declined.append(r.rid)
                elif r.rid in policy._admitted and (d := demand(r, now, default, share, floor)) is not None:
                    forced.append((r, d))
                else:
                    undecided.append((deadline, r.rid))
            rids = [r.rid for r in view.waiting]  # the queue's positions, named
            assert [rids[i] for i in queue.undecided.tolist()] == [rid for _, rid in sorted(undecided)]
            assert [rids[i] for i in queue.no_target.tolist()] == [rid for _, rid in sorted(no_target)]
            assert [rids[i] for i in queue.declined.tolist()] == declined
            assert [(view.waiting[i], d) for i, d in queue.forced] == forced


@pytest.mark.parametrize("seed", range(5))
def test_slos_queue_order_breaks_equal_deadlines_by_rid_as_a_sort_of_pairs_does(seed: int) -> None:
    """A compound stage's calls share a deadline: runs of equal keys are ordered by rid, then
    by position, exactly as sorting (key, rid) pairs orders them."""
    rng = random.Random(seed)
    for _ in range(300):
        n = rng.randrange(0, 40)
        key = np.array([rng.choice([1.0, 2.0, 3.0, rng.random()]) for _ in range(n)])
        rids = [rng.choice("abcdefg") for _ in range(n)]
        idx = np.array(sorted(rng.sample(range(n), rng.randrange(n + 1))), dtype=np.int64)
        expected = [i for *_, i in sorted((key[i], rids[i], i) for i in idx.tolist())]
        assert _by_key(key, rids, idx).tolist() == expected


@pytest.mark.parametrize("objective", ["requests", "tokens"])
@pytest.mark.parametrize("seed,nw,nr", CASES)
def test_gmax_books_each_running_requests_worth_as_per_request(seed: int, nw: int, nr: int, objective: str) -> None:
    policy = make_policy("gmax", default_model(), objective=objective)
    assert isinstance(policy, GmaxPolicy)
    for view in view_passes(seed, nw, nr):
        policy.plan(view)
        expected = {}
        for r in view.running:
            cls = r.slo.slo_class
            # by default GMAX judges a compound stage by its program's deadline, not its sub-deadline
            program_due = absolute_deadline(deadline_seconds(r.slo), r.arrival, r.program_arrival)
            due = program_due if cls in (SloClass.DEADLINE, SloClass.COMPOUND) else None
            if cls is SloClass.LATENCY:
                nxt = next_token_due(r)
                on_time = nxt is None or view.now <= nxt
                tokens = r.generated + 1 if objective == "tokens" else 1
                worth = r.slo.weight * tokens if on_time else 0.0
            else:
                worth = r.slo.weight * ((r.prompt_len + r.generated + 1) if objective == "tokens" else 1)
            if cls is SloClass.BEST_EFFORT:  # no SLO: worth best_effort_value of it
                worth *= GmaxParams().best_effort_value
            expected[r.rid] = (worth, due if due is not None else math.inf)
        assert policy._seen is not None and policy._seen.booked() == expected


@pytest.mark.parametrize("seed,nw,nr", CASES)
def test_the_preemptions_are_the_plans_running_rids_each_once(seed: int, nw: int, nr: int) -> None:
    """A policy may list a victim twice, or one that is not running (a waiting rid, a stale
    one); the finished plan preempts each running one once, in the plan's order, whether the
    pass read its columns (which name the running rids) or not."""
    rng = random.Random(seed)
    for view in view_passes(seed, nw, nr):
        running = [r.rid for r in view.running]
        for _ in range(4):
            pool = running + [r.rid for r in view.waiting][:3] + ["gone"]
            listed = [rng.choice(pool) for _ in range(rng.randrange(len(pool) + 3))]
            if running and rng.random() < 0.3:  # every running request, as an adversarial pass asks
                listed = rng.sample(running, len(running))
            expected = tuple(dict.fromkeys(rid for rid in listed if rid in set(running)))
            plan = StepPlan(preempt=listed)
            assert finalize_plan(view, plan, PlanSettings()).preempt == expected
            with sharing(view):
                columns_of(view)
                assert finalize_plan(view, plan, PlanSettings()).preempt == expected
