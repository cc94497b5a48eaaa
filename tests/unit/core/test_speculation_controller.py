"""SloSpeculation: the SLO-driven speculation length behind SGLang's adaptive-speculation hooks.

Views are real RequestView/EngineView/SloSpec objects on a hand-set clock; the performance
model is a one-term roofline (7.8 ms per pass plus 15 µs per token) with draft passes at 1/4.
"""

from __future__ import annotations

import json

import pytest

from scheduler.core.estimates import next_token_due
from scheduler.core.perf_model import RooflinePerfModel, RooflineTerm
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.slos_serve.spec_length import Tier, acceptance, best, choose_uniform
from scheduler.core.speculation_controller import LEAD_MIXED_STEPS, SloSpeculation, effective_tpot_s, tiers_of
from scheduler.core.speculation_cost import SpecCost
from scheduler.core.types import EngineView, RequestView

PERF = RooflinePerfModel([RooflineTerm(k_tokens=2.0**-16, k_spec=0.0, k_kv=0.0, b=2.0**-7)])
DRAFT_RATIO = 0.25
CANDIDATES = [0, 1, 2, 3, 4]
CHUNK = 8192
NOW = 1.0


def latency_slo(tpot_ms: float, ttft_ms: float = 10_000.0) -> SloSpec:
    return SloSpec(ttft_ms=ttft_ms, tpot_ms=tpot_ms, slo_class=SloClass.LATENCY)


def decoding(rid: str, tpot_ms: float, generated: int = 10, ttft_ms: float = 10_000.0) -> RequestView:
    """A request decoding since t = 0.05, its next token due at ttft + generated·tpot."""
    return RequestView(
        rid=rid,
        slo=latency_slo(tpot_ms, ttft_ms),
        arrival=0.0,
        prompt_len=1000,
        generated=generated,
        first_token_time=0.05,
    )


def view(
    *groups: tuple[float, int],
    now: float = NOW,
    extra: list[RequestView] | None = None,
    backlog: int = 65536,
    lead_s: float | None = None,
) -> EngineView:
    """Decoding groups (TPOT ms, count) and `backlog` prompt tokens waiting for prefill. `lead_s`:
    every decode's next token due that long after `now` (None: long after, a 10 s TTFT)."""

    def ttft_ms(tpot: float) -> float:  # next token due at ttft + generated·tpot (generated = 10)
        return 10_000.0 if lead_s is None else 1000.0 * (now + lead_s) - 10 * tpot

    running = [decoding(f"{tpot}-{i}", tpot, ttft_ms=ttft_ms(tpot)) for tpot, n in groups for i in range(n)]
    running += extra or []
    waiting = [RequestView("queued", latency_slo(100), arrival=now, prompt_len=backlog)] if backlog else []
    return EngineView(
        now=now,
        waiting=waiting,
        running=running,
        max_running_requests=256,
        chunk_size=CHUNK,
        free_kv_tokens=100_000,
        total_kv_tokens=200_000,
    )


def uniform_choices(tpot_ms: float, n: int, alpha: float = 0.7) -> dict:
    return choose_uniform(SpecCost(PERF, DRAFT_RATIO), [Tier(tpot_ms / 1000, n)], alpha, CANDIDATES, 0, CHUNK)


def controller(**kw) -> SloSpeculation:
    return SloSpeculation(CANDIDATES, DRAFT_RATIO, **kw)


# ---------------------------------------------------------------- construction and SGLang's hooks


def test_constructor_normalises_candidates() -> None:
    c = SloSpeculation([3, 1, 3, 2], 0.1)
    assert c.candidate_steps == [1, 2, 3]
    assert c.get_steps_for_batch(1) == 3  # no valid initial: the longest
    assert SloSpeculation([1, 2, 3], 0.1, initial=2).get_steps_for_batch(64) == 2
    assert SloSpeculation([1, 2, 3], 0.1, initial=7).get_steps_for_batch(64) == 3
    for bad in ([], [-1, 2]):
        with pytest.raises(ValueError):
            SloSpeculation(bad, 0.1)


def test_adaptive_controller_interface() -> None:
    c = controller(initial=2)
    assert c.candidate_steps == CANDIDATES
    assert all(c.get_steps_for_batch(bs) == 2 for bs in (1, 7, 64, 512))  # one length per batch
    assert c.cuda_graph_bs_for_step(2) is None  # CUDA graphs off until told otherwise
    c.set_cuda_graph_bs([16, 1, 8])
    assert [c.cuda_graph_bs_for_step(s) for s in CANDIDATES] == [[1, 8, 16]] * len(CANDIDATES)
    c.set_cuda_graph_bs([])
    assert c.cuda_graph_bs_for_step(1) is None
    c.set_cuda_graph_bs(None)
    assert c.cuda_graph_bs_for_step(1) is None


def test_on_verify_complete_feeds_alpha_and_counts_steps() -> None:
    c = controller(initial=2, alpha_prior=0.7)
    assert c.on_verify_complete([2, 2, 2, 2], 4) is None  # never switches from the verify path
    # 8 of 8 judged drafts accepted, pooled with the prior's 5.6 of 8
    assert c.acceptance.alpha == pytest.approx((0.98 * 5.6 + 8) / (0.98 * 8 + 8))
    c.on_verify_complete([0, 1], 2)
    assert c.acceptance.verifies == 2
    assert c.acceptance.mean_accepted() == pytest.approx(9 / 6)
    assert c.steps_used == {2: 2}
    assert c.tokens_per_verify() == pytest.approx(1 + c.acceptance.alpha + c.acceptance.alpha**2)


def test_verifies_without_drafts_count_but_teach_nothing() -> None:
    c = controller(initial=0, alpha_prior=0.6)
    c.on_verify_complete([0, 0, 0], 3)
    assert c.steps_used == {0: 1}
    assert c.acceptance.alpha == 0.6
    assert c.acceptance.verifies == 0


def test_learned_alpha_drives_the_length() -> None:
    c = controller(initial=2, margin=0.0, dwell=1)
    for _ in range(60):
        c.on_verify_complete([0] * 8, 8)  # every draft rejected
    assert c.acceptance.alpha < 0.01
    assert c.update(view((30, 32)), PERF) == 0  # drafts are pure cost now
    assert c.get_steps_for_batch(32) == 0
    assert c.switches == 1


# ---------------------------------------------------------------- hysteresis


def test_scenarios_are_what_the_hysteresis_tests_assume() -> None:
    tight = uniform_choices(8, 32)
    assert not tight[0].feasible and best(tight).feasible and best(tight).steps == 2
    base = uniform_choices(30, 32)
    assert best(base).steps == 2 and base[0].feasible
    assert best(uniform_choices(30, 128)).steps == 1
    loose = uniform_choices(100, 32)  # loose TPOT: speculation gains next to nothing
    assert best(loose).prefill_rate < 1.01 * loose[0].prefill_rate


def test_small_gain_never_switches() -> None:
    choices = uniform_choices(30, 32)
    gain = best(choices).prefill_rate / choices[0].prefill_rate - 1  # ≈ 10 %
    assert gain > 0.05
    c = controller(initial=0, margin=gain + 0.005, dwell=2)
    for _ in range(30):
        assert c.update(view((30, 32)), PERF) == 0
    assert c.switches == 0
    assert c.decisions == 30
    assert c.last_best.steps == 2  # it did see the better length


def test_clear_gain_switches_after_dwell_updates() -> None:
    choices = uniform_choices(30, 32)
    gain = best(choices).prefill_rate / choices[0].prefill_rate - 1
    c = controller(initial=0, margin=gain - 0.005, dwell=3, draft_for_prefill=True)
    assert c.update(view((30, 32)), PERF) == 0
    assert c.update(view((30, 32)), PERF) == 0
    assert c.update(view((30, 32)), PERF) == 2
    assert c.get_steps_for_batch(32) == 2
    assert c.switches == 1
    assert c.last.steps == 2
    for _ in range(5):  # and it stays
        assert c.update(view((30, 32)), PERF) == 2
    assert c.switches == 1


@pytest.mark.parametrize(
    "interruption",
    [
        ((100, 32),),  # no clear gain over the current length for a moment: pending reset
        ((30, 128),),  # a different winner for a moment: the count restarts for it
    ],
)
def test_dwell_needs_consecutive_updates(interruption: tuple) -> None:
    c = controller(initial=0, margin=0.05, dwell=3, draft_for_prefill=True)
    a = view((30, 32))
    assert [c.update(a, PERF), c.update(a, PERF)] == [0, 0]
    c.update(view(*interruption), PERF)
    assert c.get_steps_for_batch(32) == 0
    assert [c.update(a, PERF), c.update(a, PERF)] == [0, 0]
    assert c.update(a, PERF) == 2
    assert c.switches == 1


def test_infeasible_current_switches_at_once() -> None:
    c = controller(initial=0, margin=10.0, dwell=100)  # hysteresis as sticky as it gets
    assert c.update(view((8, 32)), PERF) == 2  # 8 ms with no drafts cannot carry 32 decodes
    assert c.switches == 1
    assert c.last.feasible


def test_no_tpot_requests_keep_the_length() -> None:
    c = controller(initial=3)
    assert c.update(view(), PERF) == 3
    best_effort = RequestView("be", SloSpec(), arrival=0.0, prompt_len=100, generated=5, first_token_time=0.1)
    declined = decoding("declined", 8)
    declined.best_effort_tier = True
    assert c.update(view(extra=[best_effort, declined]), PERF) == 3
    assert c.decisions == 0 and c.tiers == []


# ---------------------------------------------------------------- tightening behind-schedule requests


def test_effective_tpot_on_time_is_the_slo() -> None:
    r = decoding("r", 50, generated=10, ttft_ms=100)  # token 10 due at 0.1 + 0.5 = 0.6 s
    assert next_token_due(r) == pytest.approx(0.6)
    assert effective_tpot_s(r, 0.5, 16, 0.25) == pytest.approx(0.05)
    assert effective_tpot_s(r, 0.6, 16, 0.25) == pytest.approx(0.05)


def test_effective_tpot_tightens_when_behind() -> None:
    r = decoding("r", 50, generated=10, ttft_ms=100)
    # 0.16 s late, repaid over 16 tokens: 10 ms less per token
    assert effective_tpot_s(r, 0.76, 16, 0.25) == pytest.approx(0.04)
    assert effective_tpot_s(r, 0.76, 8, 0.25) == pytest.approx(0.03)
    # never below floor · TPOT
    assert effective_tpot_s(r, 5.0, 16, 0.25) == pytest.approx(0.0125)
    assert effective_tpot_s(r, 5.0, 16, 0.5) == pytest.approx(0.025)


def test_effective_tpot_leaves_other_requests_alone() -> None:
    not_started = RequestView("q", latency_slo(50, 100), arrival=0.0, prompt_len=10)
    assert effective_tpot_s(not_started, 5.0, 16, 0.25) == pytest.approx(0.05)
    no_tpot = RequestView("t", SloSpec(ttft_ms=100, slo_class=SloClass.LATENCY), 0.0, 10, first_token_time=0.1)
    assert effective_tpot_s(no_tpot, 5.0, 16, 0.25) is None
    declined = decoding("d", 50, ttft_ms=100)
    declined.best_effort_tier = True
    assert effective_tpot_s(declined, 5.0, 16, 0.25) is None


def test_tiers_group_requests_by_effective_tpot() -> None:
    late = decoding("late", 50, generated=10, ttft_ms=100)
    on_time = [decoding(f"r{i}", 50) for i in range(3)]
    loose = [decoding(f"l{i}", 200) for i in range(2)]
    tiers = tiers_of([late, *on_time, *loose], 0.76, 16, 0.25)
    assert tiers == [Tier(0.04, 1), Tier(0.05, 3), Tier(0.2, 2)]


def test_update_counts_tightened_requests_and_binds_their_tier() -> None:
    late = decoding("late", 30, generated=10, ttft_ms=100)  # due at 0.4 s
    c = controller(initial=1)
    c.update(view((30, 8), now=0.56, extra=[late]), PERF)  # 0.16 s late: 30 → 20 ms
    assert c.tightened == 1
    assert c.tiers == [Tier(0.02, 1), Tier(0.03, 8)]
    assert c.last.batch_time_s == pytest.approx(0.02 * c.tokens_per_verify())


# ---------------------------------------------------------------- status


STATUS_KEYS = {
    "steps",
    "candidate_steps",
    "alpha",
    "mean_accepted_drafts",
    "verifies",
    "steps_used",
    "tokens_per_verify",
    "draft_ratio",
    "decode_only_drafts",
    "tiers",
    "tightened_requests",
    "switches",
    "decisions",
    "current",
    "best_uniform",
    "per_tier_optimum",
}


def test_status_before_any_decision_is_json() -> None:
    st = controller(initial=1).status()
    assert set(st) == STATUS_KEYS
    assert json.loads(json.dumps(st, allow_nan=False)) == st
    assert st["steps"] == 1 and st["current"] is None and st["per_tier_optimum"] is None
    assert st["mean_accepted_drafts"] is None


def test_status_after_decisions_is_json_and_consistent() -> None:
    c = controller(initial=0, margin=0.05, dwell=1)
    c.on_verify_complete([1, 2, 0], 3)
    c.update(view((30, 16), (100, 8)), PERF)
    st = c.status()
    assert set(st) == STATUS_KEYS
    assert json.loads(json.dumps(st, allow_nan=False)) == st  # plain JSON types, string keys
    assert st["steps"] == c.get_steps_for_batch(24) == st["current"]["steps"]
    assert st["steps_used"] == {"0": 1}
    assert st["tiers"] == [{"tpot_ms": 30.0, "requests": 16}, {"tpot_ms": 100.0, "requests": 8}]
    assert st["decisions"] == 1 and st["switches"] == c.switches
    assert set(st["current"]) == {"steps", "batch_time_ms", "prefill_budget", "prefill_tokens_per_s", "feasible"}
    assert set(st["per_tier_optimum"]["lengths"]) == {"30.0", "100.0"}
    assert st["per_tier_optimum"]["prefill_tokens_per_s"] >= st["best_uniform"]["prefill_tokens_per_s"]


# ---------------------------------------------------------------- drafting must pay (issue #48)


def test_loose_tpot_backs_off_to_no_drafting() -> None:
    """TTFT-bound: the TPOTs are loose, so a longer batch only spends prefill time on drafts and
    verify tokens; a controller started at the longest length returns to 0 although the gain of
    0 over it is within the margin (the old rule kept whatever length was in force)."""
    loose = uniform_choices(100, 8)
    assert loose[4].feasible and loose[0].prefill_rate > loose[4].prefill_rate
    assert best(loose).prefill_rate < loose[4].prefill_rate * 1.05  # nothing beats 4 by the margin
    assert best(loose).prefill_rate < loose[0].prefill_rate * 1.05  # nor 0: drafting does not pay
    c = controller(initial=4, dwell=3)
    steps = [c.update(view((100, 8)), PERF) for _ in range(4)]
    assert steps == [4, 4, 0, 0]
    assert c.switches == 1


def test_compute_bound_batch_backs_off_to_no_drafting() -> None:
    """Compute-bound: a batch so large that its verify tokens, not the weights' read, set the
    step time; drafting shortens no TPOT that binds and costs prefill, so the length goes to 0."""
    c = controller(initial=2, dwell=2)
    for _ in range(3):
        c.update(view((200, 512), lead_s=0.0), PERF)
    assert c.get_steps_for_batch(512) == 0
    assert c.last.feasible


def test_prefill_budget_drafts_only_when_asked() -> None:
    """With a 30 ms TPOT and 32 decodes drafting lengthens the batch the TPOT allows by more
    than the drafts cost (SLOs-Serve's objective): by default no drafts keep the TPOT, so the
    length stays 0; with `draft_for_prefill` a controller started at 0 goes to a length > 0."""
    c = controller(initial=2, dwell=2)
    assert [c.update(view((30, 32)), PERF) for _ in range(3)] == [2, 0, 0]
    c = controller(initial=0, dwell=3, draft_for_prefill=True)
    steps = [c.update(view((30, 32)), PERF) for _ in range(6)]
    assert steps[:2] == [0, 0] and all(s > 0 for s in steps[2:])
    assert c.switches == 1


def test_tpot_bound_batch_with_no_prefill_waiting_does_not_draft() -> None:
    """The longer batch drafting allows buys prefill budget; with nothing waiting for it (all
    pending prompt tokens fit the batch without drafts) it only lengthens every step."""
    choices = uniform_choices(30, 32)
    assert best(choices).steps > 0 and choices[0].prefill_budget > 500
    c = controller(initial=0, dwell=1, draft_for_prefill=True)
    for _ in range(3):
        assert c.update(view((30, 32), backlog=500), PERF) == 0
    c = controller(initial=2, dwell=2, draft_for_prefill=True)
    steps = [c.update(view((30, 32), backlog=0), PERF) for _ in range(3)]
    assert steps == [2, 0, 0]


def test_tpot_bound_batch_drafts_by_default() -> None:
    """TPOT-bound: 8 ms cannot carry 32 decodes without drafts; the default controller drafts
    the length that keeps it, and returns to 0 when the batch no longer needs it."""
    c = controller(initial=0, dwell=2)
    assert c.update(view((8, 32)), PERF) == 2
    assert c.last.feasible
    steps = [c.update(view((30, 32)), PERF) for _ in range(3)]
    assert steps == [2, 0, 0]


def test_decode_only_drafts_take_the_least_time_per_token() -> None:
    """SGLang's EAGLE with mixed batches drafts only in decode-only steps (prefill rides beside
    plain decodes), where drafting takes no prefill's time: a memory-bound batch whose next
    tokens are due now (a mixed step would make them late) drafts, at the length with the least
    decode time per token, where the rule that stays at 0 while no TPOT binds would not."""
    plain = controller(initial=0, dwell=2)
    assert [plain.update(view((30, 32), lead_s=0.0), PERF) for _ in range(3)] == [0, 0, 0]
    c = controller(initial=0, dwell=2, decode_only_drafts=True)
    steps = [c.update(view((30, 32), lead_s=0.0), PERF) for _ in range(3)]
    choices = uniform_choices(30, 32)
    alpha = c.acceptance.alpha
    per_token = {s: ch.exec_time_s / acceptance(s, alpha) for s, ch in choices.items() if ch.feasible}
    assert steps[:1] == [0] and steps[-1] == min(per_token, key=per_token.get) > 0
    assert c.switches == 1


def test_decode_only_drafts_stay_at_none_while_the_schedules_outlast_the_prefill_in_view() -> None:
    """The same batch, its next tokens due later than a few steps with a full prefill chunk
    would take and nothing else waiting: the mixed steps keep the TPOTs unaided, and a longer
    decode-only step would only delay the next prefill (every arrival's TTFT). It stops
    drafting when the slack grows back, and drafts again when a burst of prompts (many mixed
    steps in a row) waits."""
    mixed_step_s = PERF.step_time(CHUNK, 32, 32 * 1010)
    slack = view((30, 32), lead_s=1.5 * LEAD_MIXED_STEPS * mixed_step_s, backlog=0)
    c = controller(initial=0, dwell=2, decode_only_drafts=True)
    assert [c.update(slack, PERF) for _ in range(3)] == [0, 0, 0]
    drafting = controller(initial=4, dwell=2, decode_only_drafts=True)
    assert [drafting.update(slack, PERF) for _ in range(3)] == [4, 0, 0]
    burst = view((30, 32), lead_s=1.5 * LEAD_MIXED_STEPS * mixed_step_s, backlog=4 * CHUNK)
    steps = [drafting.update(burst, PERF) for _ in range(3)]
    assert steps[0] == 0 and steps[1] == steps[2] > 0


def test_decode_only_drafts_stay_at_none_where_every_tpot_outlasts_the_mixed_steps() -> None:
    """Next tokens due now, but nothing waits beyond prompts the size of the running ones: a
    mixed step takes less than the 30 ms TPOT, so every step keeps the schedules and drafting
    would only lengthen the decode-only steps every arrival waits out. A burst of long prompts
    makes the mixed steps longer than the TPOT, and then it drafts."""
    assert PERF.step_time(1000, 32, 32 * 1010) < 0.030 < PERF.step_time(4000, 32, 32 * 1010)
    c = controller(initial=0, dwell=2, decode_only_drafts=True)
    assert [c.update(view((30, 32), lead_s=0.0, backlog=0), PERF) for _ in range(3)] == [0, 0, 0]
    steps = [c.update(view((30, 32), lead_s=0.0, backlog=4000), PERF) for _ in range(3)]
    assert steps[0] == 0 and steps[-1] > 0
    drafting = controller(initial=4, dwell=2, decode_only_drafts=True)
    assert [drafting.update(view((30, 32), lead_s=0.0, backlog=0), PERF) for _ in range(3)] == [4, 0, 0]


def test_decode_only_drafts_stay_at_none_on_a_compute_bound_batch() -> None:
    """Where the verify tokens set the step time, a longer verify takes as long per token as the
    plain decodes: no length beats none by the margin."""
    c = controller(initial=2, dwell=2, decode_only_drafts=True)
    for _ in range(3):
        c.update(view((200, 512), lead_s=0.0), PERF)
    assert c.get_steps_for_batch(512) == 0
