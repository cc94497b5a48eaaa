"""Dynamic batch cap and prefill chunk from the perf model, and the online perf model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.analyzer.online import BoundAccuracy
from scheduler.core.batch_limits import MIN_CHUNK, STEP_MARGIN, batch_levers, tightest_tpot
from scheduler.core.online_perf import OnlinePerfModel
from scheduler.core.perf_model import RooflinePerfModel, RooflineTerm
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import EngineView, RequestView
from tests.unit.core.policy_cases import policy_view

PERF = RooflinePerfModel([RooflineTerm(k_tokens=1e-3, k_spec=0.0, k_kv=0.0, b=0.01)])  # 10 ms + 1 ms/token


def _req(
    rid: str, tpot_ms: float | None = None, ttft_ms: float | None = 10_000.0, prompt: int = 100, **kw
) -> RequestView:
    if tpot_ms is None and ttft_ms is None:
        slo = SloSpec()
    else:
        slo = SloSpec(ttft_ms=ttft_ms, tpot_ms=tpot_ms, slo_class=SloClass.LATENCY)
    return RequestView(rid=rid, slo=slo, arrival=0.0, prompt_len=prompt, **kw)


def _view(running, waiting=(), chunk=512, max_running=256, now=0.0) -> EngineView:
    return policy_view(waiting, running, cap=max_running, now=now, chunk=chunk, total_kv=10**6)


def test_no_tpot_target_leaves_everything_to_sglang() -> None:
    levers = batch_levers(_view([_req("a", ttft_ms=None)], [_req("b", ttft_ms=None)]), PERF)
    assert levers.batch_cap is None and levers.chunk_size is None


@settings(max_examples=60, deadline=None)
@given(tpot_ms=st.floats(min_value=12, max_value=400), running=st.integers(min_value=0, max_value=40))
def test_cap_is_the_largest_batch_meeting_the_tightest_tpot(tpot_ms: float, running: int) -> None:
    view = _view([_req(f"r{i}", tpot_ms=1000.0) for i in range(running)], [_req("w", tpot_ms=tpot_ms)])
    cap = batch_levers(view, PERF).batch_cap
    assert cap is not None and cap >= 1
    tpot = tpot_ms / 1000
    assert tightest_tpot(view) == pytest.approx(tpot)
    if cap > 1:
        assert PERF.step_time(0, cap, 0) <= tpot
    if cap < view.max_running_requests:
        assert PERF.step_time(0, cap + 1, 0) > tpot


def _decoding(rid: str, tpot_ms: float, generated: int, ttft_ms: float = 100.0) -> RequestView:
    """A running latency request that has `generated` tokens; token i is due at
    ttft + i·tpot after its arrival at 0.0."""
    return _req(rid, tpot_ms=tpot_ms, ttft_ms=ttft_ms, generated=generated, first_token_time=0.05)


def _due(tpot_ms: float, index: int, ttft_ms: float = 100.0) -> float:
    return (ttft_ms + index * tpot_ms) / 1000.0


def test_tighter_tpot_gives_a_smaller_cap_and_chunk() -> None:
    # Both just emitted token 9 exactly on time: the next is due one TPOT from now.
    loose = batch_levers(_view([_decoding(f"r{i}", 200.0, 10) for i in range(4)], now=_due(200.0, 9)), PERF)
    tight = batch_levers(_view([_decoding(f"r{i}", 30.0, 10) for i in range(4)], now=_due(30.0, 9)), PERF)
    assert tight.batch_cap < loose.batch_cap
    assert tight.chunk_size < loose.chunk_size <= 512
    assert PERF.step_time(tight.chunk_size, 4, 4 * 110 + tight.chunk_size) <= 0.030
    assert PERF.step_time(tight.chunk_size + 1, 4, 4 * 110 + tight.chunk_size + 1) * (1 + STEP_MARGIN) > 0.030


def test_a_request_ahead_of_its_schedule_lends_its_slack_to_prefill() -> None:
    on_pace = batch_levers(_view([_decoding("r", 40.0, 10)], now=_due(40.0, 9)), PERF)
    ahead = batch_levers(_view([_decoding("r", 40.0, 10)], now=_due(40.0, 9) - 0.2), PERF)  # 200 ms banked
    assert ahead.chunk_size > on_pace.chunk_size


def test_a_chunk_leaves_a_margin_for_the_perf_models_error() -> None:
    # 200 ms to the next token: the chunk's predicted step fits with STEP_MARGIN to spare, and
    # is the largest that does (a chunk sized to the whole slack is late on any underestimate).
    view = _view([_decoding("r", 200.0, 10)], now=_due(200.0, 9))
    chunk = batch_levers(view, PERF).chunk_size
    assert chunk is not None and MIN_CHUNK < chunk < 512
    assert PERF.step_time(chunk, 1, 110 + chunk) * (1 + STEP_MARGIN) <= 0.200
    assert PERF.step_time(chunk + 1, 1, 111 + chunk) * (1 + STEP_MARGIN) > 0.200


def test_a_late_request_constrains_nothing() -> None:
    late = _decoding("late", 30.0, 10)
    levers = batch_levers(_view([late], now=_due(30.0, 10) + 0.5), PERF)  # its next token is already late
    assert levers.chunk_size is None and levers.prefill


def _deadline_decoding(deadline_s: float, generated: int = 10, cap: int = 110) -> RequestView:
    slo = SloSpec(deadline_ms=deadline_s * 1000.0, slo_class=SloClass.DEADLINE)
    return RequestView("d", slo, 0.0, 100, generated=generated, max_new_tokens=cap, first_token_time=0.05)


def test_a_deadline_request_holds_the_chunk_to_its_pace() -> None:
    # 10 s for at most 100 more tokens: a step may take 100 ms, less the margin.
    chunk = batch_levers(_view([_deadline_decoding(10.0)]), PERF).chunk_size
    assert chunk is not None and MIN_CHUNK < chunk < 512
    kv = 110
    assert PERF.step_time(chunk, 1, kv + chunk) * (1 + STEP_MARGIN) <= 0.1
    assert PERF.step_time(chunk + 1, 1, kv + chunk + 1) * (1 + STEP_MARGIN) > 0.1
    # a longer deadline, a longer pace, a larger chunk; the client's cap is the bound on tokens left
    assert batch_levers(_view([_deadline_decoding(20.0)]), PERF).chunk_size > chunk
    assert batch_levers(_view([_deadline_decoding(10.0, cap=60)]), PERF).chunk_size > chunk


def test_a_pace_under_two_decode_steps_leaves_the_chunk_alone() -> None:
    # 1.5 s for 100 tokens: 15 ms a token, where a plain decode step takes 11 ms
    assert batch_levers(_view([_deadline_decoding(1.5)]), PERF).chunk_size is None


def test_separate_prefill_steps_must_leave_room_for_the_decode_step_after_them() -> None:
    view = _view([_decoding(f"r{i}", 60.0, 10) for i in range(4)], now=_due(60.0, 9))
    mixed = batch_levers(view, PERF, mixed_batching=True)
    separate = batch_levers(view, PERF, mixed_batching=False)
    assert separate.chunk_size < mixed.chunk_size
    decode = PERF.step_time(0, 4, 440)
    assert PERF.step_time(separate.chunk_size, 0, 440 + separate.chunk_size) + decode <= 0.060


def test_no_room_for_a_chunk_decodes_only_unless_a_ttft_needs_prefill() -> None:
    running = [_decoding(f"r{i}", 20.0, 10) for i in range(4)]  # 14 ms of decode, 20 ms TPOT
    now = _due(20.0, 9) + 0.015  # 5 ms left before the next token is due
    calm = batch_levers(_view(running, [_req("w", tpot_ms=20.0, ttft_ms=60_000.0)], now=now), PERF)
    assert not calm.prefill
    # 20 prompt tokens beside 4 decodes take 34 ms: due in 45 ms, it cannot wait out a decode step
    soon = _req("w", tpot_ms=20.0, ttft_ms=now * 1000 + 45.0, prompt=20)
    urgent = batch_levers(_view(running, [soon], now=now), PERF)
    assert urgent.prefill and urgent.chunk_size >= MIN_CHUNK
    lost = _req("w", tpot_ms=20.0, ttft_ms=now * 1000 + 30.0, prompt=20)  # no chunk makes it in time
    assert not batch_levers(_view(running, [lost], now=now), PERF).prefill


def test_chunk_never_exceeds_startup() -> None:
    levers = batch_levers(_view([_decoding("r", 10_000.0, 10)], chunk=256, now=_due(10_000.0, 9)), PERF)
    assert levers.chunk_size == 256


def _one_stream_due_in_40_ms() -> tuple[list[RequestView], float]:
    """One running stream whose next token is due in 40 ms: about 25 prompt tokens fit its slack."""
    return [_decoding("r", 40.0, 10)], _due(40.0, 9)


def _ttft_in(now: float, ms: float, rid: str, prompt: int = 100) -> RequestView:
    return _req(rid, tpot_ms=1_000.0, ttft_ms=now * 1000 + ms, prompt=prompt)


def test_a_larger_chunk_wins_when_it_saves_more_first_tokens_than_next_tokens_it_makes_late() -> None:
    running, now = _one_stream_due_in_40_ms()
    calm = batch_levers(_view(running, [_req("w", tpot_ms=1_000.0, ttft_ms=60_000.0)], now=now), PERF)
    assert calm.chunk_size is not None and calm.chunk_size < 100
    # two 100-token prompts due in 130 ms: each needs its whole prompt in one 111 ms step, which
    # makes the stream's next token late; two first tokens are worth more than one stream
    two = batch_levers(_view(running, [_ttft_in(now, 130.0, "a"), _ttft_in(now, 130.0, "b")], now=now), PERF)
    assert two.chunk_size == 100


def test_the_chunk_stays_within_the_running_slack_when_the_trade_is_not_worth_it() -> None:
    running, now = _one_stream_due_in_40_ms()
    calm = batch_levers(_view(running, [_req("w", tpot_ms=1_000.0, ttft_ms=60_000.0)], now=now), PERF)
    one = batch_levers(_view(running, [_ttft_in(now, 130.0, "a")], now=now), PERF)  # one for one: no gain
    assert one.chunk_size == calm.chunk_size
    many_running = [_decoding(f"r{i}", 40.0, 10) for i in range(4)]
    two = [_ttft_in(now, 200.0, "a"), _ttft_in(now, 200.0, "b")]
    assert batch_levers(_view(many_running, two, now=now), PERF).chunk_size < 100  # 2 saved, 4 late


def test_a_ttft_no_chunk_can_save_does_not_raise_the_chunk() -> None:
    running, now = _one_stream_due_in_40_ms()
    calm = batch_levers(_view(running, [_req("w", tpot_ms=1_000.0, ttft_ms=60_000.0)], now=now), PERF)
    # 2 000 tokens need four 512-token steps of over half a second each; the windows are 50 ms
    lost = [_ttft_in(now, 50.0, f"w{i}", prompt=2000) for i in range(5)]
    assert batch_levers(_view(running, lost, now=now), PERF).chunk_size == calm.chunk_size
    missed = [_req(f"m{i}", tpot_ms=40.0, ttft_ms=10.0, prompt=2000) for i in range(5)]  # already past
    assert batch_levers(_view(running, missed, now=now), PERF).chunk_size == calm.chunk_size


def test_online_model_is_not_ready_until_it_has_measured_enough() -> None:
    model = OnlinePerfModel(min_samples=32)
    assert not model.ready and model.step_time(10, 0, 0) > 0  # the crude prior still predicts
    for i in range(40):
        decodes = 1 + i % 16
        model.observe(0, decodes, 100 * decodes, 0, 0.02 + 0.002 * decodes)
    assert model.ready
    assert model.step_time(0, 8, 800) == pytest.approx(0.036, rel=0.05)
    assert model.recent_error() is not None


def test_online_model_ignores_empty_or_nonpositive_iterations() -> None:
    model = OnlinePerfModel()
    model.observe(0, 0, 0, 0, 0.01)
    model.observe(0, 4, 10, 0, 0.0)
    assert model.observed == 0


def test_bound_accuracy_summary() -> None:
    acc = BoundAccuracy(window=3)
    assert acc.summary() is None
    for predicted, actual in ((10, 12), (20, 10), (30, 30), (40, 50)):
        acc.record(predicted, actual)
    s = acc.summary()
    assert s == {"requests": 3, "mae_tokens": pytest.approx((10 + 0 + 10) / 3, abs=0.01), "under_estimate_rate": 0.3333}


def test_an_unmeetable_target_sets_no_levers() -> None:
    running = [_req(f"r{i}", tpot_ms=1000.0) for i in range(8)]
    levers = batch_levers(_view(running, [_req("w", tpot_ms=5.0)]), PERF)  # one decode alone takes 11 ms
    assert levers.batch_cap is None and levers.chunk_size is None and levers.tightest_tpot_s == 0.005


def test_online_model_with_large_recent_error_is_not_ready() -> None:
    model = OnlinePerfModel(min_samples=32)
    for i in range(64):  # the same shape measured at wildly different times: unpredictable host
        model.observe(0, 4, 400, 0, 0.01 if i % 2 else 0.5)
    assert model.observed == 64 and model.recent_error() > model.max_error
    assert not model.ready


def test_a_given_profile_is_ready_at_once_and_never_refitted() -> None:
    model = OnlinePerfModel(prior=PERF, min_samples=8)
    assert model.ready
    for _ in range(40):
        model.observe(0, 4, 400, 0, 1.0)  # a far slower host than the profile
    assert model.ready and model.step_time(0, 4, 400) == pytest.approx(PERF.step_time(0, 4, 400))
    assert model.recent_error() > 0.9  # the mismatch is still measured and reported


def test_refits_keep_to_their_share_of_the_schedulers_time() -> None:
    clock = [0.0]

    def timer() -> float:
        clock[0] += 0.05  # every reading 50 ms later: a fit "takes" 50 ms
        return clock[0]

    model = OnlinePerfModel(min_samples=8, refit_every=4, fit_budget=0.01, timer=timer)
    for i in range(200):  # each observe is ~4 timer readings: ~0.2 s of model time per step
        decodes = 1 + i % 8
        model.observe(0, decodes, 100 * decodes, 0, 0.02 + 0.002 * decodes)
    # without the budget: a fit every 4 steps (48); with it, one per 50 ms / 1 % = 5 s of time
    assert 2 <= model.fits <= 12, model.fits
    unlimited = OnlinePerfModel(min_samples=8, refit_every=4, fit_budget=1.0, timer=timer)
    for i in range(200):
        decodes = 1 + i % 8
        unlimited.observe(0, decodes, 100 * decodes, 0, 0.02 + 0.002 * decodes)
    assert unlimited.fits > 3 * model.fits


def test_a_fit_budget_outside_0_1_is_refused() -> None:
    with pytest.raises(ValueError, match="fit_budget"):
        OnlinePerfModel(fit_budget=0.0)
