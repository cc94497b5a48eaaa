"""The SLOs-Serve speculation-length optimiser (§3.2.3, App. D) and the speculative step cost.

Most cases use a one-term roofline with power-of-two coefficients, so every time below is an
exact binary fraction and the budgets can be worked out by hand in units of 1/16384 s:

    step_time(P, n, spec, draft) = (P + n + spec)/16384 + 64/16384 + draft · r · (n + 64)/16384
"""

from __future__ import annotations

import random

import pytest

from scheduler.core.perf_model import RooflinePerfModel, RooflineTerm, load_perf_model, profile_path
from scheduler.core.slos_serve.spec_length import (
    LengthChoice,
    Tier,
    acceptance,
    best,
    choose_per_tier,
    choose_uniform,
)
from scheduler.core.speculation_cost import SpecCost

UNIT = 2.0**-14  # seconds per token: 1/16384
B = 64 * UNIT  # 2^-8 s per pass
HAND = RooflinePerfModel([RooflineTerm(k_tokens=UNIT, k_spec=0.0, k_kv=0.0, b=B)])


def hand_cost(draft_ratio: float = 0.25) -> SpecCost:
    return SpecCost(HAND, draft_ratio)


def assert_budget_is_maximal(cost: SpecCost, tiers: list[Tier], c: LengthChoice, kv: int, limit: int) -> None:
    """The budget fits the batch time and one more prefill token would not (or the limit binds);
    the context the decodes attend is what costs KV reads (Time2BS, as the policy core has it)."""
    n = sum(t.requests for t in tiers)
    spec = sum(t.requests * c.per_tier[t.tpot_s] for t in tiers)
    if not c.feasible:
        assert c.prefill_budget == 0
        return
    if c.prefill_budget > 0:
        assert cost.step_time(c.prefill_budget, n, kv, spec, c.steps) <= c.batch_time_s
    if c.prefill_budget < limit:
        over = c.prefill_budget + 1
        assert cost.step_time(over, n, kv, spec, c.steps) > c.batch_time_s


# ---------------------------------------------------------------- SpecCost


def test_spec_cost_adds_draft_passes_to_the_verify() -> None:
    cost = hand_cost(0.25)
    # 16 decodes, 2 drafts each: verify of 16 + 32 tokens, then 2 draft passes at 1/4 a decode pass
    verify = (16 + 32 + 64) * UNIT
    draft = 2 * 0.25 * (16 + 64) * UNIT
    assert cost.draft_time(16, 0, 2) == draft
    assert cost.step_time(0, 16, 0, 32, 2) == verify + draft
    assert cost.at_steps(2).step_time(0, 16, 0) == verify + draft
    assert cost.at_steps(2).step_time(100, 16, 0) == verify + draft + 100 * UNIT


def test_spec_cost_without_drafting_is_the_target_alone() -> None:
    assert hand_cost(0.0).step_time(10, 16, 0, 32, 2) == HAND.step_time(10, 16, 0, 32)
    assert hand_cost(0.5).draft_time(16, 0, 0) == 0.0
    assert hand_cost(0.5).draft_time(0, 0, 3) == 0.0
    assert hand_cost(0.5).at_steps(-2).steps == 0
    with pytest.raises(ValueError):
        SpecCost(HAND, -0.1)


def test_at_steps_inverse_sizes_speculative_batches() -> None:
    # with 2 drafts per decode, a decode costs 3 tokens + 2 · 0.25 of a draft token
    at2 = hand_cost(0.25).at_steps(2)
    budget = 512 * UNIT  # 512 units - 64 (b) - 32 (draft b) = 416 = 3.5 · n  → n = 118
    assert at2.max_batch_within(budget, 0.0) == 118
    assert HAND.max_batch_within(budget, 0.0) == 448


# ---------------------------------------------------------------- choose_uniform by hand

# One tier, TPOT 2^-5 s, 16 decodes, α = 0.5, draft ratio 1/4: in units of 1/16384 s
# T(s) = 512·Acc(s), exec(s) = 16(1+s) + 64 + s·(16+64)/4 = 80 + 36 s, budget = T - exec.
ONE_TIER = [Tier(2.0**-5, 16)]
HAND_TABLE = {  # s: (Acc(s), exec units, budget)
    0: (1.0, 80, 432),
    1: (1.5, 116, 652),
    2: (1.75, 152, 744),
    3: (1.875, 188, 772),
    4: (1.9375, 224, 768),
}


def test_uniform_choices_match_hand_computation() -> None:
    choices = choose_uniform(hand_cost(), ONE_TIER, 0.5, list(HAND_TABLE), kv_tokens=0)
    assert set(choices) == set(HAND_TABLE)
    for s, (acc, exec_units, budget) in HAND_TABLE.items():
        c = choices[s]
        assert c.steps == s
        assert c.batch_time_s == 2.0**-5 * acc  # T = TPOT · Acc(s)
        assert c.exec_time_s == exec_units * UNIT
        assert c.feasible
        assert c.prefill_budget == budget
        assert c.prefill_rate == pytest.approx(budget / (2.0**-5 * acc))
        assert c.per_tier == {2.0**-5: s}
        assert_budget_is_maximal(hand_cost(), ONE_TIER, c, 0, 16384)
    # rates 13824, 13909.3, 13604.6, 13175.5, 12684.4: one draft wins; more wastes rejected drafts
    assert best(choices).steps == 1


def test_budget_that_fills_the_batch_exactly_is_kept() -> None:
    # s = 2 above: 152 + 744 = 896 = 512 · 1.75 units exactly, the boundary counts as fitting
    c = choose_uniform(hand_cost(), ONE_TIER, 0.5, [2], kv_tokens=0)[2]
    assert hand_cost().step_time(744, 16, 744, 32, 2) == c.batch_time_s


def test_batch_time_is_bound_by_the_tightest_tier() -> None:
    tiers = [Tier(2.0**-3, 8), Tier(2.0**-5, 8)]
    choices = choose_uniform(hand_cost(), tiers, 0.5, [0, 1, 2], kv_tokens=0)
    for s, c in choices.items():
        assert c.batch_time_s == min(t.tpot_s * acceptance(s, 0.5) for t in tiers)
        assert c.batch_time_s == 2.0**-5 * acceptance(s, 0.5)
        assert c.per_tier == {2.0**-3: s, 2.0**-5: s}
        assert_budget_is_maximal(hand_cost(), tiers, c, 0, 16384)


def test_prefill_limit_caps_the_budget() -> None:
    choices = choose_uniform(hand_cost(), ONE_TIER, 0.5, list(HAND_TABLE), kv_tokens=0, prefill_limit=500)
    assert [choices[s].prefill_budget for s in HAND_TABLE] == [432, 500, 500, 500, 500]
    # a capped budget over a longer batch is a lower rate: no speculation wins now
    assert best(choices).steps == 0


def test_kv_tokens_enter_the_budget() -> None:
    kv_model = RooflinePerfModel([RooflineTerm(k_tokens=UNIT, k_spec=0.0, k_kv=UNIT / 64, b=B)])
    cost = SpecCost(kv_model, 0.0)
    plain = choose_uniform(cost, ONE_TIER, 0.5, [0], kv_tokens=0)[0]
    long_ctx = choose_uniform(cost, ONE_TIER, 0.5, [0], kv_tokens=64 * 100)[0]
    # each prefill token costs 1 unit: P ≤ 512 - 16 - 64
    assert plain.prefill_budget == 432
    # 6400 KV tokens the decodes attend cost 100 units more
    assert long_ctx.prefill_budget == 332
    assert_budget_is_maximal(cost, ONE_TIER, long_ctx, 64 * 100, 16384)


def test_infeasible_when_decodes_alone_exceed_the_batch_time() -> None:
    # 80 decodes at TPOT 2^-7 (128 units); free drafts: exec(s) = 80(1+s) + 64 = 144 + 80 s
    tiers = [Tier(2.0**-7, 80)]
    choices = choose_uniform(hand_cost(0.0), tiers, 0.9, [0, 1, 2, 3, 4], kv_tokens=0)
    no_spec = choices[0]
    assert no_spec.exec_time_s == 144 * UNIT > no_spec.batch_time_s == 128 * UNIT
    assert not no_spec.feasible
    assert no_spec.prefill_budget == 0 and no_spec.prefill_rate == 0.0
    # T(s) = 128·Acc(s): 243.2, 346.88, 440.19, 524.17 units against 224, 304, 384, 464
    assert [choices[s].prefill_budget for s in (1, 2, 3, 4)] == [19, 42, 56, 60]
    assert all(choices[s].feasible for s in (1, 2, 3, 4))
    winner = best(choices)
    assert winner.steps == 3  # 56/440.19 beats 42/346.88 and 60/524.17
    for c in choices.values():
        assert c.feasible == (c.exec_time_s <= c.batch_time_s)
        assert_budget_is_maximal(hand_cost(0.0), tiers, c, 0, 16384)


def test_all_infeasible_prefers_the_smallest_overrun() -> None:
    # as above with draft passes at 1/4: exec(s) = 144 + 116 s never fits 128·Acc(s)
    choices = choose_uniform(hand_cost(0.25), [Tier(2.0**-7, 80)], 0.9, [0, 1, 2, 3], kv_tokens=0)
    assert not any(c.feasible for c in choices.values())
    overrun = {s: c.exec_time_s / c.batch_time_s for s, c in choices.items()}
    assert overrun[0] == pytest.approx(144 / 128)
    assert overrun[1] == pytest.approx(260 / 243.2)
    assert best(choices).steps == min(overrun, key=overrun.get) == 1


def test_capped_budgets_are_rated_per_their_own_batch_time() -> None:
    # α = 0: every length gives one token per batch, the same T; the limit caps every budget, so
    # the batch ends before T and each length's drafts and verify tokens make it slower
    choices = choose_uniform(hand_cost(), ONE_TIER, 0.0, [4, 3, 2, 1], kv_tokens=0, prefill_limit=100)
    assert {c.prefill_budget for c in choices.values()} == {100}
    for c in choices.values():
        took = hand_cost().step_time(100, ONE_TIER[0].requests, 100, ONE_TIER[0].requests * c.steps, c.steps)
        assert took < c.batch_time_s
        assert c.prefill_rate == pytest.approx(100 / took)
    rates = [choices[s].prefill_rate for s in (1, 2, 3, 4)]
    assert rates == sorted(rates, reverse=True)
    assert best(choices).steps == 1
    # and without the cap α = 0 makes every draft pure waste
    assert best(choose_uniform(hand_cost(), ONE_TIER, 0.0, [3, 0, 1], kv_tokens=0)).steps == 0


def _choice(steps: int, rate: float, feasible: bool, exec_s: float = 1.0, batch_s: float = 1.0) -> LengthChoice:
    return LengthChoice(steps, batch_s, int(rate * batch_s) if feasible else 0, rate, feasible, exec_s)


def test_best_orders_feasible_then_rate_then_shorter() -> None:
    assert best({}) is None
    infeasible_fast = _choice(1, 9e9, False)  # a stale rate on an infeasible choice never wins
    feasible_slow = _choice(5, 10.0, True)
    assert best({1: infeasible_fast, 5: feasible_slow}) is feasible_slow
    assert best({5: feasible_slow, 1: infeasible_fast}) is feasible_slow
    faster = _choice(6, 11.0, True)
    assert best({5: feasible_slow, 6: faster}) is faster
    tie = _choice(2, 10.0, True)
    assert best({5: feasible_slow, 2: tie}) is tie
    assert best({2: tie, 5: feasible_slow}) is tie
    small_overrun = _choice(4, 0.0, False, exec_s=1.1)
    big_overrun = _choice(2, 0.0, False, exec_s=1.5)
    assert best({2: big_overrun, 4: small_overrun}) is small_overrun


def test_tiers_without_requests_are_ignored() -> None:
    assert choose_uniform(hand_cost(), [Tier(0.01, 0)], 0.5, [0, 1], kv_tokens=0) == {}
    assert choose_per_tier(hand_cost(), [Tier(0.01, 0)], 0.5, [0, 1], kv_tokens=0) is None
    with_empty = choose_uniform(hand_cost(), [Tier(2.0**-7, 0), *ONE_TIER], 0.5, [1], kv_tokens=0)[1]
    assert with_empty == choose_uniform(hand_cost(), ONE_TIER, 0.5, [1], kv_tokens=0)[1]


# ---------------------------------------------------------------- choose_per_tier (App. D)


def test_per_tier_on_one_tier_is_the_uniform_optimum() -> None:
    per_tier = choose_per_tier(hand_cost(), ONE_TIER, 0.5, list(HAND_TABLE), kv_tokens=0)
    assert per_tier == best(choose_uniform(hand_cost(), ONE_TIER, 0.5, list(HAND_TABLE), kv_tokens=0))


def test_per_tier_by_hand_loose_tier_stops_drafting() -> None:
    # tight 2^-5 and loose 2^-3, 16 decodes each, α = 0.5
    tiers = [Tier(2.0**-5, 16), Tier(2.0**-3, 16)]
    cands = [0, 1, 2, 3]
    uniform = best(choose_uniform(hand_cost(), tiers, 0.5, cands, kv_tokens=0))
    # uniform: s = 0 → T 512, exec 32 + 64 = 96 → 416; s = 1 → T 768, exec 64 + 64 + 24 = 152 → 616
    assert (uniform.steps, uniform.prefill_budget) == (0, 416)
    per_tier = choose_per_tier(hand_cost(), tiers, 0.5, cands, kv_tokens=0)
    # tight tier drafts 1 (T = 2^-5 · 1.5 = 768 units), the loose one keeps up with none (2048 units):
    # exec = 48 + 64 + 1 · 0.25 · (32 + 64) = 136 → budget 632
    assert per_tier.per_tier == {2.0**-5: 1, 2.0**-3: 0}
    assert per_tier.steps == 1
    assert per_tier.batch_time_s == 768 * UNIT
    assert per_tier.exec_time_s == 136 * UNIT
    assert per_tier.prefill_budget == 632
    assert per_tier.prefill_rate > uniform.prefill_rate


def _random_case(rng: random.Random) -> tuple[SpecCost, list[Tier], float, list[int], int, int]:
    model = RooflinePerfModel(
        [
            RooflineTerm(k_tokens=rng.choice([UNIT / 4, UNIT]), k_spec=0.0, k_kv=rng.choice([0.0, 1e-8]), b=B),
            RooflineTerm(k_tokens=rng.choice([2 * UNIT, 4 * UNIT]), k_spec=0.0, k_kv=0.0, b=0.0),
        ]
    )
    cost = SpecCost(model, rng.choice([0.0, 0.05, 0.25, 1.0]))
    tiers = [
        Tier(tpot, rng.randint(1, 64)) for tpot in rng.sample([0.005, 0.01, 0.02, 0.03, 0.05, 0.1], rng.randint(1, 3))
    ]
    alpha = rng.choice([0.0, 0.3, 0.6, 0.8, 0.95])
    cands = sorted(rng.sample(range(9), rng.randint(1, 5)))
    return cost, tiers, alpha, cands, rng.randint(0, 50_000), rng.choice([256, 2048, 16384])


def test_per_tier_keeps_every_tier_and_never_loses_to_uniform() -> None:
    # Per tier contains the uniform choice: binding the tightest tier at s, every looser tier's
    # shortest keeping length is ≤ s, so T is the same with fewer drafted tokens to verify.
    rng = random.Random(2024)
    strictly_better = 0
    for _ in range(100):
        cost, tiers, alpha, cands, kv, limit = _random_case(rng)
        uniform = best(choose_uniform(cost, tiers, alpha, cands, kv, limit))
        per_tier = choose_per_tier(cost, tiers, alpha, cands, kv, limit)
        assert per_tier is not None
        lengths = [per_tier.per_tier[t.tpot_s] for t in sorted(tiers, key=lambda t: t.tpot_s)]
        assert lengths == sorted(lengths, reverse=True)  # looser tiers draft no more
        assert per_tier.steps == max(lengths)
        allowances = [t.tpot_s * acceptance(per_tier.per_tier[t.tpot_s], alpha) for t in tiers]
        assert per_tier.batch_time_s == min(allowances)  # some tier binds ...
        assert all(a >= per_tier.batch_time_s for a in allowances)  # ... and every tier keeps up
        assert_budget_is_maximal(cost, tiers, per_tier, kv, limit)
        if uniform.feasible:
            assert per_tier.feasible
            assert per_tier.prefill_rate >= uniform.prefill_rate
            strictly_better += per_tier.prefill_rate > uniform.prefill_rate * 1.001
        else:
            assert per_tier.feasible or per_tier.exec_time_s / per_tier.batch_time_s <= (
                uniform.exec_time_s / uniform.batch_time_s
            )
    assert strictly_better > 0  # the comparison is not vacuous


# ---------------------------------------------------------------- the H100 profile


@pytest.fixture(scope="module")
def h100_cost() -> SpecCost:
    return SpecCost(load_perf_model(profile_path("h100"), kind="table"), 0.05)


CANDIDATES = list(range(9))


def test_h100_tight_tpot_drafts_more_than_loose(h100_cost: SpecCost) -> None:
    tight = best(choose_uniform(h100_cost, [Tier(0.010, 32)], 0.8, CANDIDATES, kv_tokens=32000))
    loose = best(choose_uniform(h100_cost, [Tier(0.100, 32)], 0.8, CANDIDATES, kv_tokens=32000))
    assert tight.feasible and loose.feasible
    assert tight.steps > loose.steps
    # speculation relaxes the binding batch time: several TPOTs per batch at 10 ms
    assert tight.batch_time_s > 2.5 * 0.010


def test_h100_no_speculation_starves_prefill_at_tight_tpot(h100_cost: SpecCost) -> None:
    choices = choose_uniform(h100_cost, [Tier(0.010, 32)], 0.8, CANDIDATES, kv_tokens=32000)
    plain, winner = choices[0], best(choices)
    assert plain.feasible and plain.batch_time_s == pytest.approx(0.010)
    assert winner.steps > 0
    assert plain.prefill_rate < 0.3 * winner.prefill_rate
    for c in choices.values():
        assert_budget_is_maximal(h100_cost, [Tier(0.010, 32)], c, 32000, 16384)


def test_h100_per_tier_with_mixed_tiers(h100_cost: SpecCost) -> None:
    tiers = [Tier(0.010, 16), Tier(0.100, 32)]
    uniform = best(choose_uniform(h100_cost, tiers, 0.8, CANDIDATES, kv_tokens=32000))
    per_tier = choose_per_tier(h100_cost, tiers, 0.8, CANDIDATES, kv_tokens=32000)
    assert per_tier.per_tier[0.010] >= per_tier.per_tier[0.100]
    assert per_tier.prefill_rate >= uniform.prefill_rate
