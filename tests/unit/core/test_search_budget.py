"""The per-pass search budget: a search that runs out falls back to a valid plan and is
counted (policy, planner, /slo/status, /metrics); a search within it decides as before. The
budget is in work units, so every case here is exact, with no clock."""

from __future__ import annotations

import random

import pytest

from scheduler.components.planner import PassPlanner
from scheduler.components.status_channel import merge_replicas
from scheduler.core.perf_model import default_model
from scheduler.core.plan_path import settings_for
from scheduler.core.policies import make_policy
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.slos_serve import DpItem, TierBudget, admit
from scheduler.core.types import EngineView, RequestView
from scheduler.core.work_budget import BudgetExhausted, WorkBudget, units_for_ms

NOW = 100.0


def test_work_budget_raises_only_past_its_limit() -> None:
    budget = WorkBudget(10)
    budget.spend(10)
    with pytest.raises(BudgetExhausted):
        budget.spend(1)
    unbounded = WorkBudget(None)
    unbounded.spend(10**9)
    assert unbounded.spent == 10**9
    assert units_for_ms(None) is None
    assert units_for_ms(1e-12) == 1  # never a budget of nothing
    assert units_for_ms(2.0) == 2 * units_for_ms(1.0)  # type: ignore[operator]


def _items(seed: int, n: int, forced: int) -> list[DpItem]:
    rng = random.Random(seed)
    return [
        DpItem(
            f"i{k}",
            NOW + rng.uniform(0.05, 3.0) * (1 if k else -1),  # i0 is already past its deadline
            rng.randrange(50, 2000),
            rng.randrange(200, 3000),
            rng.randrange(-1, 3),
            1.0,
            k < forced,
        )
        for k in range(n)
    ]


def _admit(items: list[DpItem], work: WorkBudget | None):
    budget = TierBudget(default_model(), [0.03, 0.05, 0.1], 400_000, 8192)
    return admit(items, budget, (20, 20, 20, 10), NOW, 600_000, 512, fallback_items=16, work=work)


@pytest.mark.parametrize("seed", range(4))
def test_the_dp_within_its_budget_decides_as_unbounded(seed: int) -> None:
    items = _items(seed, 14, forced=3)
    meter = WorkBudget(None)
    free = _admit(items, meter)
    assert meter.spent > 0 and not free.exhausted
    exact = WorkBudget(meter.spent)  # exactly what it needs: the same path, the same answer
    bounded = _admit(items, exact)
    assert (bounded.admitted, bounded.declined, bounded.value, bounded.exhausted) == (
        free.admitted,
        free.declined,
        free.value,
        False,
    )
    assert exact.spent == meter.spent  # deterministic: the units depend on the input only
    assert (_admit(items, None).admitted, _admit(items, None).declined) == (free.admitted, free.declined)


@pytest.mark.parametrize("seed", range(4))
def test_a_dp_out_of_budget_keeps_its_promises_and_admits_nothing_new(seed: int) -> None:
    items = _items(seed, 14, forced=5)
    meter = WorkBudget(None)
    _admit(items, meter)
    out = _admit(items, WorkBudget(meter.spent - 1))  # one unit short
    promised = sorted((it for it in items if it.forced and it.deadline > NOW), key=lambda it: it.deadline)
    assert out.exhausted
    assert out.admitted == [it.rid for it in promised]  # in prefill-deadline order
    assert sorted(out.admitted + out.declined) == sorted(it.rid for it in items)  # every item decided once
    assert "i0" in out.declined  # a promise already past its deadline is not kept


def _latency(i: int, running: bool, rng: random.Random) -> RequestView:
    slo = SloSpec(ttft_ms=rng.choice([800, 2000, 5000]), tpot_ms=rng.choice([40, 60, 100]), slo_class=SloClass.LATENCY)
    arrival = NOW - rng.uniform(0.0, 0.3)
    return RequestView(
        f"{'r' if running else 'w'}{i}",
        slo,
        arrival,
        rng.randrange(100, 1500),
        generated=rng.randrange(1, 50) if running else 0,
        max_new_tokens=256,
        first_token_time=arrival + 0.1 if running else None,
    )


def _view(seed: int, waiting: int = 40, running: int = 16) -> EngineView:
    rng = random.Random(seed)
    return EngineView(
        now=NOW,
        waiting=[_latency(i, False, rng) for i in range(waiting)],
        running=[_latency(i, True, rng) for i in range(running)],
        max_running_requests=64,
        chunk_size=4096,
        free_kv_tokens=200_000,
        total_kv_tokens=300_000,
        step=1,
    )


@pytest.mark.parametrize("seed", range(3))
def test_slos_under_its_default_budget_plans_as_unbounded(seed: int) -> None:
    view = _view(seed)
    bounded, unbounded = make_policy("slos"), make_policy("slos", search_budget_ms=None)
    for _ in range(3):  # later passes carry the admissions forward as forced items
        a, b = bounded.plan(view), unbounded.plan(view)
        assert (a.order, a.best_effort, a.batch_cap, a.chunk_size) == (
            b.order,
            b.best_effort,
            b.batch_cap,
            b.chunk_size,
        )
    assert a.order and len(a.best_effort) < len(view.waiting)  # it admitted something: the DP ran
    assert bounded.budget_fallbacks == 0


def test_slos_out_of_budget_plans_its_fallback_and_counts_it() -> None:
    view = _view(7)
    policy = make_policy("slos")
    planner = PassPlanner(policy, settings_for(policy))
    first = policy.plan(view)
    promised = [rid for rid in first.order or () if rid in policy._admitted]  # the DP's admissions
    assert promised  # promises to keep
    policy.work_units = 1  # the next pass's DP runs out at once
    final = planner.plan(view, None)
    assert final is not None
    assert (planner.budget_fallbacks, planner.fallbacks, planner.errors) == (1, 0, 0)
    assert sorted(final.order or ()) == sorted(r.rid for r in view.waiting)  # a valid plan: every request once
    assert list(final.order or ())[: len(promised)] == promised  # the earlier admissions first, in order
    assert policy._admitted == set(promised)  # and nothing new admitted
    assert not final.best_effort & set(promised)
    policy.plan(view)
    assert planner.budget_fallbacks == 2


def test_the_counter_reaches_the_planner_through_an_oracle_variant() -> None:
    policy = make_policy("slos_oracle", search_budget_ms=1e-9)
    planner = PassPlanner(policy, settings_for(policy))
    assert planner.plan(_view(3), None) is not None
    assert planner.budget_fallbacks == 1


def test_replicas_add_their_budget_fallbacks_and_metrics_export_them() -> None:
    from server.engine_metrics import engine_exposition

    merged = merge_replicas([{"budget_fallbacks": 2, "policy": "slos"}, {"budget_fallbacks": 3, "policy": "slos"}])
    assert merged["budget_fallbacks"] == 5
    text = engine_exposition({"budget_fallbacks": 5}).decode()
    assert "sglang_slo_engine_budget_fallbacks_total 5.0" in text
