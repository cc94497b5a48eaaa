"""The worker agent's load estimates: what GoodServe's q_g, p_g, d_g and PolyServe's iteration wait
are computed from, before they reach the router."""

from __future__ import annotations

import pytest

from server.agent_load import LoadEstimator, prefill_s_per_token, queued_s


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def engine(**kw: object) -> dict:
    return {"waiting": 0, "running": 0, "perf_model": {"predicted_decode_ms": {"1": 20.0}}, **kw}


def test_queue_delay_is_ttft_minus_the_prompts_prefill_time_and_decays_when_idle() -> None:
    clock = Clock()
    est = LoadEstimator(clock)
    est.first_token(waited_s=1.5, prompt_tokens=1000, prefill_s_per_token=0.001)  # 1 s prefill: 0.5 s queued
    busy = est.report_fields(engine(waiting=3))
    assert busy["queue_delay_s"] == pytest.approx(0.5)
    assert busy["queue_len"] == 3
    idle = []
    for _ in range(3):
        clock.t += 0.25
        idle.append(est.report_fields(engine(waiting=0))["queue_delay_s"])
    assert idle == pytest.approx([0.25, 0.125, 0.0625])  # an old burst does not scare traffic away forever
    est.first_token(waited_s=0.1, prompt_tokens=1000, prefill_s_per_token=0.001)  # faster than the model: 0
    assert est.queue_delay.value is not None and est.queue_delay.value < 0.0625


def test_the_estimates_follow_time_not_the_report_interval() -> None:
    """Five reports 50 ms apart move the EMAs as far as one report after 250 ms."""
    results = []
    for interval, n in ((0.25, 1), (0.05, 5)):
        clock = Clock()
        est = LoadEstimator(clock)
        est.first_token(waited_s=1.5, prompt_tokens=1000, prefill_s_per_token=0.001)
        est.report_fields(engine(waiting=3, steps=0, time=0.0))
        est.report_fields(engine(waiting=3, steps=100, time=1.0))  # 10 ms per step so far
        steps, t = 100, 1.0
        for _ in range(n):
            clock.t += interval
            steps, t = steps + round(interval / 0.05), t + interval  # now 50 ms per step
            fields = est.report_fields(engine(waiting=0, steps=steps, time=t))
        results.append((fields["queue_delay_s"], fields["iteration_s"]))
    (delay_slow, iter_slow), (delay_fast, iter_fast) = results
    assert delay_fast == pytest.approx(delay_slow) == pytest.approx(0.25)
    assert iter_fast == pytest.approx(iter_slow, rel=0.02) and 0.01 < iter_slow < 0.05


def test_decode_time_per_token_falls_back_to_the_perf_model_until_measured() -> None:
    est = LoadEstimator(Clock())
    assert est.report_fields(engine())["decode_s_per_token"] == pytest.approx(0.020)
    est.decoded(gap_s=0.09, tokens=3)
    assert est.report_fields(engine())["decode_s_per_token"] == pytest.approx(0.030)
    est.decoded(gap_s=0.05, tokens=0)  # a chunk without tokens says nothing about speed
    assert est.report_fields(engine())["decode_s_per_token"] == pytest.approx(0.030)


def test_the_engines_predicted_decode_step_passes_through_in_seconds() -> None:
    est = LoadEstimator(Clock())
    assert est.report_fields(engine(decode_step_ms=14.5))["decode_step_s"] == pytest.approx(0.0145)
    assert est.report_fields(engine())["decode_step_s"] is None  # an engine that does not report one
    assert est.report_fields(engine(decode_step_ms="fast"))["decode_step_s"] is None


def test_iteration_time_comes_from_the_schedulers_step_counter() -> None:
    est = LoadEstimator(Clock())
    est.report_fields(engine(steps=100, time=10.0))
    fields = est.report_fields(engine(steps=150, time=11.0))
    assert fields["iteration_s"] == pytest.approx(0.02)
    again = est.report_fields(engine(steps=150, time=12.0))  # idle: no new steps, keep the estimate
    assert again["iteration_s"] == pytest.approx(0.02)


def test_tokens_per_minute_is_a_sliding_window() -> None:
    clock = Clock()
    est = LoadEstimator(clock)
    est.served(100)
    clock.t = 30.0
    est.served(50)
    assert est.report_fields(engine())["tokens_per_minute"] == 150
    clock.t = 61.0
    assert est.report_fields(engine())["tokens_per_minute"] == 50


def test_prefill_cost_is_read_from_the_scheduler_snapshot() -> None:
    assert prefill_s_per_token({"prefill_ms_per_token": 0.25}) == pytest.approx(0.00025)
    assert prefill_s_per_token({}) == 0.0
    assert prefill_s_per_token({"prefill_ms_per_token": "x"}) == 0.0


def test_requests_still_waiting_raise_the_queue_delay_at_once() -> None:
    """A growing queue shows up before its first request starts, not a queueing delay later."""
    est = LoadEstimator(Clock())
    est.first_token(waited_s=0.2, prompt_tokens=0, prefill_s_per_token=0.0)
    assert est.report_fields(engine(waiting=4), still_waiting=[3.0, 5.0])["queue_delay_s"] == pytest.approx(4.0)
    assert est.report_fields(engine(waiting=0), still_waiting=[0.1])["queue_delay_s"] == pytest.approx(0.2)
    assert est.queue_delay.value == pytest.approx(0.2)  # no idle decay while something still waits
    assert queued_s(2.0, 1000, 0.001) == pytest.approx(1.0) and queued_s(0.5, 1000, 0.001) == 0.0
