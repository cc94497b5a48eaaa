"""SLOs-Serve planner: the paper's Fig. 3 burst, feasibility of every admission under the
model, monotonicity of admission and of the speculation length."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from scheduler.core.perf_model import RooflinePerfModel, linear_model
from scheduler.core.policies import POLICIES, make_policy
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.slos_serve import (
    DpItem,
    Tier,
    TierBudget,
    acceptance,
    admit,
    optimize_spec_lengths,
)
from scheduler.core.slos_serve.spec_length import DraftsInModel, best, choose_uniform
from scheduler.core.types import EngineView, RequestView
from scheduler.core.work_budget import WorkBudget
from tests.unit.core.slos_cases import PACED, chat_beside_a_deadline
from tests.unit.core.slos_serve_alg2 import alg2_batches, form_batch

# ---------------------------------------------------------------- Fig. 3 (§2.3)
# Six tokens per time unit, three running decodes, a burst of four requests with six prefill
# tokens each; TTFT 6 units, TPOT 1 unit (deadline-based: token k due at TTFT + k·TPOT).
SIX_PER_UNIT = linear_model(base_s=0.0, per_token_s=1 / 6)
FIG3_SLO = SloSpec(ttft_ms=6000, tpot_ms=1000, slo_class=SloClass.LATENCY)


def _prefill_unit(pending: dict[str, int], tokens: dict[str, list[int]], left: int, unit: int) -> tuple[int, list[str]]:
    """Spend `left` prefill tokens of one unit on the pending prompts in order; a prompt that
    completes sends its first token with this unit. Returns the tokens left and who completed."""
    completed = []
    for rid in list(pending):
        if left == 0:
            break
        used = min(left, pending[rid])
        pending[rid] -= used
        left -= used
        if pending[rid] == 0:
            del pending[rid]
            tokens[rid].append(unit)  # the first token leaves with the last chunk
            completed.append(rid)
    return left, completed


def _toy_schedule(prefill_first: bool, horizon: int = 16) -> dict[str, list[int]]:
    """A greedy co-located scheduler on the toy: each unit has 6 tokens; returns for every
    request the end times of the units in which it got an output token."""
    decoding = ["run0", "run1", "run2"]
    pending = {f"new{i}": 6 for i in range(4)}
    tokens: dict[str, list[int]] = {rid: [] for rid in decoding + list(pending)}
    for unit in range(1, horizon + 1):
        left = 6
        joined: list[str] = []
        if prefill_first:
            left, joined = _prefill_unit(pending, tokens, left, unit)
        for rid in decoding:
            if left == 0:
                break
            tokens[rid].append(unit)
            left -= 1
        if not prefill_first:
            _, joined = _prefill_unit(pending, tokens, left, unit)
        decoding += joined
    return tokens


def _violations(tokens: dict[str, list[int]], horizon: int = 16) -> dict[str, str]:
    """Which requests miss their DSLO: running ones owe a token per unit, new ones the first
    by unit 6 and token k by 6 + k."""
    bad = {}
    for rid, times in tokens.items():
        first_due = 1 if rid.startswith("run") else 6
        for k in range(horizon - first_due + 1):
            due = first_due + k
            if sum(t <= due for t in times) < k + 1:
                bad[rid] = "ttft" if k == 0 and rid.startswith("new") else "tpot"
                break
    return bad


def test_fig3_prefill_first_breaks_running_tpot():
    bad = _violations(_toy_schedule(prefill_first=True))
    assert {"run0", "run1", "run2"} <= {rid for rid, why in bad.items() if why == "tpot"}


def test_fig3_decode_first_breaks_ttft_of_later_requests():
    tokens = _toy_schedule(prefill_first=False)
    assert tokens["new2"][0] == 11  # "request three's prefill completion delayed to the 11th"
    assert tokens["new3"] == []
    bad = _violations(tokens)
    assert bad.get("new2") == "ttft" and bad.get("new3") == "ttft"


def test_fig3_dp_admits_running_plus_three_of_four():
    budget = TierBudget(SIX_PER_UNIT, [1.0])
    items = [DpItem(f"new{i}", 6.0, 6, tier=0) for i in range(4)]
    result = admit(items, budget, (3, 0), now=0.0)
    assert len(result.admitted) == 3 and len(result.declined) == 1
    assert result.counts == (6, 0)  # the three running decodes stay guaranteed
    _check_feasible(result.admitted_items, (3, 0), [1.0], SIX_PER_UNIT, 0.0, chunk_cap=None)
    # and the model agrees with the toy: every admitted request and every running one on time
    assert len(_violations(_toy_dp_schedule(result.admitted))) == 1  # only the declined one


def _toy_dp_schedule(admitted: list[str]) -> dict[str, list[int]]:
    """The schedule the DP plans: running decodes every unit, admitted prefills EDF with the
    remaining 3 tokens per unit, each admitted request decoding from its deadline."""
    tokens: dict[str, list[int]] = {f"run{i}": list(range(1, 17)) for i in range(3)}
    pending = {rid: 6 for rid in admitted}
    for rid in [f"new{i}" for i in range(4)]:
        tokens[rid] = []
    for unit in range(1, 7):
        _prefill_unit(pending, tokens, 3, unit)
    for rid in admitted:
        tokens[rid] += list(range(7, 17))
    return tokens


def test_fig3_policy_puts_the_fourth_in_best_effort_not_drop():
    running = [RequestView(f"run{i}", FIG3_SLO, -10.0, 6, generated=5, first_token_time=-5.0) for i in range(3)]
    waiting = [RequestView(f"new{i}", FIG3_SLO, 0.0 + i * 1e-6, 6) for i in range(4)]
    policy = make_policy("slos", perf_model=SIX_PER_UNIT)
    view = EngineView(0.0, waiting, running, 64, 1 << 20, 1 << 20, 1 << 20)
    plan = policy.plan(view)
    assert plan.best_effort == {"new3"} and not plan.drop
    assert plan.order[:3] == ["new0", "new1", "new2"]
    assert plan.chunk_size == 3 and plan.batch_cap == 6  # 6 tokens per unit, 3 decoding
    # the admitted three stay admitted on the next step even if a more urgent one arrives
    urgent = RequestView("urgent", SloSpec(ttft_ms=3000, tpot_ms=1000, slo_class=SloClass.LATENCY), 0.0, 6)
    plan2 = policy.plan(EngineView(0.0, waiting + [urgent], running, 64, 1 << 20, 1 << 20, 1 << 20))
    assert {"new0", "new1", "new2"}.isdisjoint(plan2.best_effort)
    assert "urgent" in plan2.best_effort


def test_registry_has_slos():
    assert "slos" in POLICIES


# ------------------------------------------------------- feasibility under the model
def _max_prefill(perf: RooflinePerfModel, batch_time: float, decoders: int, kv: int) -> int:
    """Largest integer prefill fitting the batch, found from the closed form of the (one-term) model."""
    (term,) = perf.terms
    free = batch_time - term.b - term.k_kv * kv
    p = math.floor(free / term.k_tokens - decoders + 1e-6)
    while p >= 0 and perf.step_time(p, decoders, kv) > batch_time + 1e-9:
        p -= 1
    return p


def _check_feasible(
    items, base, tiers, perf, now, chunk_cap, kv=0, idle=0.05, mem_budget=math.inf, max_dec=None, lost=()
):
    """Replay the plan batch by batch: between consecutive admitted prefill deadlines, batches
    as long as the tightest decoding TPOT carry one token per decoder (never longer than any
    decoder's TPOT) and EDF prefill; each admitted prefill must finish by its deadline. `lost`:
    started prompts that were not kept: their tokens go first, and they decode untargeted."""
    counts = list(base)
    counts[-1] += len(lost)
    remaining = {it.rid: it.prefill_tokens for it in [*lost, *items]}
    finish: dict[str, float] = {}
    t = now
    for deadline in sorted({it.deadline for it in items}):
        decoders = sum(counts)
        tight = [tp for tp, n in zip(tiers, counts[:-1], strict=True) if n > 0]
        if tight:
            batch_time = min(tight)
            per_batch = _max_prefill(perf, batch_time, decoders, kv)
            assert per_batch >= 0, "decodes overrun the tightest TPOT"
            if chunk_cap is not None:
                per_batch = min(per_batch, chunk_cap)
        elif chunk_cap is not None and perf.step_time(chunk_cap, decoders, kv) <= idle:
            batch_time, per_batch = perf.step_time(chunk_cap, decoders, kv), chunk_cap
        elif chunk_cap is not None and _max_prefill(perf, idle, decoders, kv) >= 1:
            batch_time, per_batch = idle, min(chunk_cap, _max_prefill(perf, idle, decoders, kv))
        elif chunk_cap is not None:
            batch_time, per_batch = perf.step_time(chunk_cap, decoders, kv), chunk_cap
        else:
            batch_time, per_batch = idle, max(0, _max_prefill(perf, idle, decoders, kv))
        for k in range(math.floor((deadline - t) / batch_time + 1e-9)):
            left = per_batch
            for it in [*lost, *sorted(items, key=lambda x: x.deadline)]:
                if left <= 0:
                    break
                if remaining[it.rid] > 0:
                    used = min(left, remaining[it.rid])
                    remaining[it.rid] -= used
                    left -= used
                    if remaining[it.rid] == 0:
                        finish[it.rid] = t + (k + 1) * batch_time
            assert perf.step_time(per_batch - left, decoders, kv) <= batch_time + 1e-9
        t = deadline
        for it in items:
            if it.deadline == deadline:
                assert it.rid in finish and finish[it.rid] <= it.deadline + 1e-9, f"{it.rid} misses its TTFT"
                counts[it.tier] += 1
    tight = [tp for tp, n in zip(tiers, counts[:-1], strict=True) if n > 0]
    if tight and items:  # (running decodes alone may already overrun: not the DP's doing)
        assert _max_prefill(perf, min(tight), sum(counts), kv) >= 0, "final decodes overrun the TPOT"
    assert sum(it.mem_tokens for it in items) <= mem_budget
    if max_dec is not None and items:
        assert sum(counts) <= max_dec


TIER_SETS = st.lists(st.sampled_from([0.02, 0.03, 0.05, 0.1, 0.2]), min_size=1, max_size=3, unique=True).map(sorted)


@st.composite
def scenarios(draw):
    tiers = draw(TIER_SETS)
    nt = len(tiers)
    base = tuple(draw(st.integers(0, 30)) for _ in range(nt)) + (draw(st.integers(0, 10)),)
    perf = linear_model(
        base_s=draw(st.sampled_from([0.0, 0.005, 0.01])),
        per_token_s=draw(st.sampled_from([2e-5, 5e-5, 1e-4, 3e-4])),
    )
    items = []
    for i in range(draw(st.integers(1, 7))):
        items.append(
            DpItem(
                rid=f"q{i}",
                deadline=draw(st.sampled_from([0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0])),
                prefill_tokens=draw(st.integers(1, 4000)),
                mem_tokens=draw(st.integers(1, 3000)),
                tier=draw(st.integers(-1, nt - 1)),
                forced=(forced := draw(st.booleans()) and i < 3),
                started=forced and draw(st.booleans()),
            )
        )
    cap = draw(st.sampled_from([None, 512, 2048]))
    mem = draw(st.sampled_from([math.inf, 4000, 10000]))
    max_dec = draw(st.sampled_from([None, 40, 1000]))
    return tiers, base, perf, items, cap, mem, max_dec


@settings(max_examples=150, deadline=None)
@given(scenarios(), st.sampled_from([0.0, 0.15]))
def test_every_admitted_set_is_feasible(sc, now):
    tiers, base, perf, items, cap, mem, max_dec = sc
    result = admit(items, TierBudget(perf, tiers, 0, cap), base, now, mem, max_dec)
    if result.forced_ok:
        assert {it.rid for it in items if it.forced and it.deadline > now} <= set(result.admitted)
    assert sorted(result.admitted + result.declined) == sorted(it.rid for it in items)
    # a started prompt already late still runs: its tokens go first, then it decodes untargeted
    lost = [it for it in items if it.started and it.deadline <= now]
    _check_feasible(result.admitted_items, base, tiers, perf, now, cap, mem_budget=mem, max_dec=max_dec, lost=lost)


@settings(max_examples=100, deadline=None)
@given(scenarios(), st.sampled_from([0.25, 0.5, 0.8]), st.sampled_from([1.0, 1.5, 4.0]))
def test_more_capacity_never_admits_fewer(sc, speedup, more_mem):
    tiers, base, perf, items, cap, mem, max_dec = sc
    items = [DpItem(**{**it.__dict__, "forced": False}) for it in items]
    slow = admit(items, TierBudget(perf, tiers, 0, cap), base, 0.0, mem, max_dec)
    (term,) = perf.terms
    fast_perf = linear_model(base_s=term.b * speedup, per_token_s=term.k_tokens * speedup)
    fast = admit(items, TierBudget(fast_perf, tiers, 0, cap), base, 0.0, mem * more_mem, max_dec)
    assert len(fast.admitted) >= len(slow.admitted)


def test_infeasible_forced_items_are_freed_not_kept():
    budget = TierBudget(SIX_PER_UNIT, [1.0])
    items = [DpItem("late", 1.0, 600, tier=0, forced=True), DpItem("ok", 6.0, 6, tier=0)]
    result = admit(items, budget, (3, 0), 0.0)
    assert not result.forced_ok and result.admitted == ["ok"]


def _deep_infeasible_forced(n: int) -> list[DpItem]:
    """One forced item nobody can serve in time, then n admissible ones, all forced (earlier
    admissions that the engine has not started): the forced set as a whole is infeasible."""
    late = DpItem("late", 1.0, 600, tier=0, forced=True)
    return [late] + [DpItem(f"r{i:03d}", 6.0 + i, 1, tier=0, forced=True) for i in range(n)]


def test_the_promises_that_still_fit_are_kept_when_one_cannot_be():
    items = _deep_infeasible_forced(40)
    result = admit(items, TierBudget(SIX_PER_UNIT, [1.0]), (3, 0), 0.0)
    assert not result.forced_ok
    # three decoders run at one token per unit out of six: the next three promises fit beside
    # them; a seventh decoder would leave the batch no room for prefill under its TPOT
    assert result.admitted == ["r000", "r001", "r002"]
    assert set(result.declined) == {"late"} | {f"r{i:03d}" for i in range(3, 40)}


def test_only_the_most_urgent_items_are_decided_again():
    items = [DpItem("late", 1.0, 600, tier=0, forced=True)]
    items += [DpItem(name, deadline, 1) for name, deadline in (("a", 3.0), ("b", 4.0), ("c", 5.0))]
    result = admit(items, TierBudget(SIX_PER_UNIT, [1.0]), (3, 0), 0.0, fallback_items=3)
    assert not result.forced_ok
    assert result.admitted == ["a", "b"] and set(result.declined) == {"late", "c"}


def test_the_re_decision_keeps_the_most_promises_not_the_earliest():
    """`big` (due at 4) fits alone, and so do the three small ones after it, not all four:
    giving up the one large prompt keeps three, where keeping promises in deadline order would
    keep one."""
    items = [DpItem("big", 4.0, 12, tier=-1, forced=True)]
    items += [DpItem(f"s{i}", 5.0 + i, 4, tier=-1, forced=True) for i in range(3)]
    budget = TierBudget(SIX_PER_UNIT, [1.0])
    assert admit(items[:1], budget, (3, 0), 0.0).forced_ok
    result = admit(items, budget, (3, 0), 0.0)
    assert not result.forced_ok and result.admitted == ["s0", "s1", "s2"] and result.declined == ["big"]


def test_a_prompt_already_late_breaks_no_other_promise_and_its_tokens_still_count():
    """A started prefill past its first token's due time runs anyway: its tokens come before
    anything admitted now (three per unit are free; `x` needs three by t=2, which fits only
    without them). A waiting one past its due time is simply declined."""
    later = [DpItem("kept", 6.0, 1, tier=0, forced=True), DpItem("x", 2.0, 3)]
    budget = TierBudget(SIX_PER_UNIT, [1.0])
    for started, x_fits in ((True, False), (False, True)):
        lost = DpItem("lost", -1.0, 6, tier=0, forced=True, started=started)
        result = admit([lost, *later], budget, (3, 0), 0.0)
        assert result.forced_ok  # the broken promise does not free the kept one
        assert "kept" in result.admitted and "lost" in result.declined
        assert ("x" in result.admitted) is x_fits


def test_a_deep_infeasible_forced_set_costs_linear_dp_work():
    """Freeing an infeasible forced set and solving it again with the DP cost the square of its
    size (4-22 s per plan at ~100 waiting admissions in a simulated overload); deciding it again
    by Moore-Hodgson's rule does not."""
    work = {}
    for n in (20, 80):
        meter = WorkBudget(None)  # counts the DP's work units: a measure that does not depend on the host
        admit(_deep_infeasible_forced(n), TierBudget(SIX_PER_UNIT, [1.0]), (3, 0), 0.0, work=meter)
        work[n] = meter.spent
    assert work[80] < 5 * work[20]  # 4x the items, about 4x the work (the DP's re-solve: over 8x)


# ------------------------------------------------------------- batch formation (Alg. 2)
def test_dynamic_batch_size_follows_the_tightest_running_tpot():
    perf = linear_model(base_s=0.01, per_token_s=1e-4)
    loose = form_batch(perf, [0.1] * 10)
    tight = form_batch(perf, [0.1] * 9 + [0.05])
    assert loose.batch_time == 0.1 and tight.batch_time == 0.05
    assert loose.prefill_budget == 890 and tight.prefill_budget == 390
    assert form_batch(perf, [None] * 4, chunk_cap=256).prefill_budget == 256


def test_alg2_serves_loose_tiers_only_when_due():
    six_per_tenth = linear_model(base_s=0.0, per_token_s=1 / 60)
    batches = alg2_batches(0.4, [("tight", 0.1), ("loose", 0.2)], six_per_tenth)
    assert [b.decode_rids for b in batches] == [["tight", "loose"], ["tight"], ["tight", "loose"], ["tight"]]
    assert [b.prefill_budget for b in batches] == [4, 5, 4, 5]


# ----------------------------------------------------------- speculation length (App. D)
def test_acceptance_formula():
    assert acceptance(0, 0.7) == 1.0
    assert math.isclose(acceptance(3, 0.5), 1 + 0.5 + 0.25 + 0.125)
    assert acceptance(4, 1.0) == 5.0


SPEC_PERF = st.builds(
    linear_model,
    base_s=st.sampled_from([0.002, 0.008, 0.02]),
    per_token_s=st.sampled_from([1e-5, 5e-5, 2e-4]),
)
SPEC_TIERS = st.lists(
    st.builds(Tier, st.sampled_from([0.02, 0.04, 0.08, 0.15]), st.integers(1, 64)), min_size=1, max_size=3
)


@settings(max_examples=100, deadline=None)
@given(SPEC_PERF, SPEC_TIERS, st.floats(0.0, 0.95), st.floats(0.0, 0.95))
def test_spec_length_non_decreasing_in_alpha(perf, tiers, a1, a2):
    lo, hi = sorted((a1, a2))
    assert (
        optimize_spec_lengths(perf, tiers, lo, uniform=True).steps
        <= optimize_spec_lengths(perf, tiers, hi, uniform=True).steps
    )
    one = [Tier(tiers[0].tpot_s, sum(t.requests for t in tiers))]
    assert optimize_spec_lengths(perf, one, lo).steps <= optimize_spec_lengths(perf, one, hi).steps


@settings(max_examples=100, deadline=None)
@given(SPEC_PERF, SPEC_TIERS, st.floats(0.05, 0.95), st.sampled_from([0.3, 0.5, 0.8]))
def test_tighter_tpot_never_gives_more_steps_when_batch_time_binds(perf, tiers, alpha, factor):
    tighter = optimize_spec_lengths(perf, [Tier(t.tpot_s * factor, t.requests) for t in tiers], alpha, uniform=True)
    looser = optimize_spec_lengths(perf, tiers, alpha, uniform=True)
    # (where no length can meet the tighter TPOT at all, speculating harder is the least bad)
    assume(tighter.feasible)
    assert tighter.steps <= looser.steps


def test_spec_helps_and_policy_sets_spec_steps():
    perf = linear_model(base_s=0.02, per_token_s=2e-5)
    choice = optimize_spec_lengths(perf, [Tier(0.03, 32)], 0.8)
    assert choice.steps > 0 and choice.prefill_rate > optimize_spec_lengths(perf, [Tier(0.03, 32)], 0.0).prefill_rate
    slo = SloSpec(ttft_ms=500, tpot_ms=30, slo_class=SloClass.LATENCY)
    running = [RequestView(f"r{i}", slo, 0.0, 100, generated=3, first_token_time=0.1) for i in range(32)]
    view = EngineView(1.0, [RequestView("w", slo, 1.0, 200)], running, 256, 8192, 10**6, 10**6)
    plan = make_policy("slos", perf_model=perf, acceptance_rate=0.8).plan(view)
    assert plan.spec_steps == choice.steps and plan.best_effort == set()
    assert make_policy("slos", perf_model=perf).plan(view).spec_steps is None


def test_the_dp_rates_a_capped_batch_over_t_and_the_engine_over_its_own_time():
    # 21 decoders at TPOT 40 ms, α = 0.6, chunk limit 512: without speculation 379 prefill tokens
    # fit in 40 ms; one draft stretches T to 64 ms, where the limit caps the budget at 512.
    perf = linear_model(base_s=0.02, per_token_s=5e-5)
    tiers = [Tier(0.04, 21)]
    planned = optimize_spec_lengths(perf, tiers, 0.6, chunk_cap=512, uniform=True)
    # the DP's plans are batches of T back to back: 512 per 64 ms loses to 379 per 40 ms
    assert (planned.steps, planned.prefill_budget) == (0, 379)
    assert planned.prefill_rate == pytest.approx(379 / 0.04, rel=1e-6)
    # the engine ends a capped batch early: 512 tokens in that batch's own 47.7 ms win
    run = best(choose_uniform(DraftsInModel(perf), tiers, 0.6, range(9), 0, 512))
    assert (run.steps, run.prefill_budget) == (1, 512)
    assert run.prefill_rate == pytest.approx(512 / perf.step_time(512, 21, 0, 21))


def test_a_lost_deadline_does_not_set_everyones_batch_time():
    perf = linear_model(base_s=0.01, per_token_s=1e-4)
    chat = SloSpec(ttft_ms=500, tpot_ms=50, slo_class=SloClass.LATENCY)
    late = SloSpec(deadline_ms=1000, slo_class=SloClass.DEADLINE)
    running = [RequestView(f"c{i}", chat, 0.0, 100, generated=5, first_token_time=0.2) for i in range(10)]
    running.append(RequestView("late", late, 0.0, 100, generated=5, predicted_output_len=200, first_token_time=0.2))
    view = EngineView(0.999, [RequestView("w", chat, 0.99, 300)], running, 256, 8192, 10**6, 10**6)
    plan = make_policy("slos", perf_model=perf).plan(view)
    assert plan.batch_cap == 256 and plan.chunk_size == 389  # the 50 ms tier sets the batch
    assert plan.best_effort == set()


def test_a_deadline_only_a_near_empty_batch_could_keep_does_not_shrink_every_batch():
    """A running deadline that needs a token every ~20 ms on an engine whose single-decoder
    step is ~10 ms: protecting it would cut every batch to a fifth of the chat tier's prefill.
    By default (4 steps) it decodes without a target; with the old one-step floor it binds."""
    perf = PACED
    view = chat_beside_a_deadline(4000)  # 195 tokens left in 3.9 s
    default = make_policy("slos", perf_model=perf).plan(view)
    one_step = make_policy("slos", perf_model=perf, derived_tpot_floor_steps=1.0).plan(view)
    assert default.batch_cap == 256 and default.chunk_size is not None and default.chunk_size >= 380
    assert one_step.chunk_size is not None and one_step.chunk_size < default.chunk_size / 4
    assert one_step.batch_cap is not None and one_step.batch_cap < 100


def test_derived_tpot_floor_steps_is_checked():
    with pytest.raises(ValueError, match="derived_tpot_floor_steps"):
        make_policy("slos", derived_tpot_floor_steps=-1.0)


def test_a_short_prefill_deadline_is_admitted_when_a_full_chunk_is_slow():
    """A slow engine (CPU) where a full 8192-token chunk outlasts the prefill deadline: the
    DP plans idle-length slices instead, so a 10-token prompt still fits and the burst beyond
    the decoder cap goes to the best-effort tier."""
    perf = linear_model(base_s=0.004, per_token_s=8e-4)
    spec = SloSpec(deadline_ms=546, slo_class=SloClass.DEADLINE)
    waiting = [RequestView(f"r{i}", spec, 100.0, 10, max_new_tokens=24) for i in range(12)]
    plan = make_policy("slos", perf_model=perf).plan(EngineView(100.0, waiting, [], 2, 8192, 16000, 16384))
    assert len(plan.best_effort) == 10
    assert plan.order is not None and not set(plan.order[:2]) & plan.best_effort
