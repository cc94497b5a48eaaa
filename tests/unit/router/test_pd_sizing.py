"""SLOs-Serve App. A's prefill:decode sizing over TPOT tiers, checked against hand-computed cases."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from router.monitoring import pd_sizing_metrics
from router.pd_sizing import (
    MixTracker,
    TierMix,
    pd_sizing,
    perf_constants,
    prefill_throughput,
    profile_inputs,
    split_devices,
    tracker_sizing,
)
from scheduler.core.perf_model import RooflinePerfModel, RooflineTerm


class Linear:
    """T = 5 ms + 0.1 ms per new token + 1 µs per KV token."""

    def step_time(self, prefill_tokens: int, decode_reqs: int, kv_tokens: int) -> float:
        return 0.005 + 1e-4 * (prefill_tokens + decode_reqs) + 1e-6 * kv_tokens


def mix(*tiers: tuple[float | None, float, float | None, float | None]) -> list[TierMix]:
    return [TierMix(t, rate, i, o, arrivals=1, finished=1) for t, rate, i, o in tiers]


# Two tiers, C = 10 ms, MaxTokenTpt = 10k tokens/s:
#   50 ms: λ=2, I=1000, O=100 → TPOT/(TPOT−C) = 1.25, decode 2·100·1.25 = 250 tok/s → 0.025 devices
#   20 ms: λ=1, I=500,  O=300 → 2.0,                   decode 1·300·2    = 600 tok/s → 0.06 devices
#   prefill (2000 + 500) / 10k = 0.25 devices; ratio 2500 / 850; g* = 10k / ((2500 + 850) / 3)
TWO_TIERS = mix((50, 2.0, 1000, 100), (20, 1.0, 500, 300))


def test_two_tiers_match_the_hand_computed_sizing() -> None:
    s = pd_sizing(TWO_TIERS, overhead_s=0.01, max_token_tpt=10_000)
    assert s["prefill_tpt"] == 10_000  # App. A's single constant when no model gives another
    assert s["tiers"]["50"]["decode_factor"] == pytest.approx(1.25)
    assert s["tiers"]["20"]["decode_factor"] == pytest.approx(2.0)
    assert s["tiers"]["50"]["slots_per_instance"] == pytest.approx(400)  # (50 − 10) ms · 10k tok/s
    assert s["tiers"]["50"]["decode_instances"] == pytest.approx(0.025)
    assert s["tiers"]["20"]["decode_instances"] == pytest.approx(0.06)
    assert s["prefill_instances"] == pytest.approx(0.25)
    assert s["decode_instances"] == pytest.approx(0.085)
    assert s["instances"] == pytest.approx(0.335)
    assert s["ratio"] == pytest.approx(2500 / 850)
    assert s["goodput_per_device_rps"] == pytest.approx(10_000 / ((2500 + 850) / 3))  # Eq. 4
    assert (s["prefill_tps"], s["decode_tps"]) == (pytest.approx(2500), pytest.approx(500))
    assert s["infeasible_tiers"] == [] and s["no_output"] == []
    json.dumps(s)  # JSON-able as is


def test_single_tier_goodput_is_eq_4() -> None:
    s = pd_sizing(mix((40, 3.0, 800, 200)), overhead_s=0.008, max_token_tpt=20_000)
    factor = 0.04 / (0.04 - 0.008)
    assert s["goodput_per_device_rps"] == pytest.approx(20_000 / (factor * 200 + 800))
    assert s["ratio"] == pytest.approx(800 / (factor * 200))


def test_a_tier_no_faster_than_one_step_is_infeasible_and_excluded() -> None:
    s = pd_sizing([*TWO_TIERS, *mix((10, 5.0, 100, 100))], overhead_s=0.01, max_token_tpt=10_000)
    assert s["infeasible_tiers"] == ["10"]  # TPOT = C: not even a batch of one meets it
    bad = s["tiers"]["10"]
    assert bad["feasible"] is False and bad["decode_factor"] is None
    assert bad["prefill_instances"] == 0 and bad["decode_instances"] == 0
    assert s["ratio"] == pytest.approx(2500 / 850)  # the two feasible tiers' numbers, unchanged
    assert s["goodput_per_device_rps"] == pytest.approx(3 / 0.335)


def test_requests_without_tpot_take_the_loosest_tier_or_the_default() -> None:
    s = pd_sizing([*TWO_TIERS, *mix((None, 1.0, 400, 100))], overhead_s=0.01, max_token_tpt=10_000)
    assert s["default_tpot_ms"] == 50 and s["tiers"]["no_tpot"]["tpot_ms"] == 50
    assert s["tiers"]["no_tpot"]["decode_instances"] == pytest.approx(100 * 1.25 / 10_000)
    alone = pd_sizing(mix((None, 1.0, 400, 100)), overhead_s=0.01, max_token_tpt=10_000)
    assert alone["default_tpot_ms"] == 100  # DEFAULT_TPOT_MS: 100 / 90
    assert alone["decode_instances"] == pytest.approx(100 * 0.1 / 0.09 / 10_000)
    own = pd_sizing(mix((None, 1.0, 400, 100)), overhead_s=0.01, max_token_tpt=10_000, default_tpot_ms=20)
    assert own["decode_instances"] == pytest.approx(100 * 2 / 10_000)


def test_a_tier_without_completions_needs_a_fallback_output() -> None:
    data = mix((50, 2.0, 1000, None))
    s = pd_sizing(data, overhead_s=0.01, max_token_tpt=10_000)
    assert s["no_output"] == ["50"] and s["ratio"] is None and s["goodput_per_device_rps"] is None
    assert s["prefill_instances"] == pytest.approx(0.2)  # its prompts still need prefill
    s = pd_sizing(data, overhead_s=0.01, max_token_tpt=10_000, fallback_output=100)
    assert s["tiers"]["50"]["sized_output"] == 100 and s["tiers"]["50"]["mean_output"] is None
    assert s["decode_instances"] == pytest.approx(0.025)


def test_the_kv_cache_caps_a_decode_instance() -> None:
    # 10k KV tokens at 1000 + 100/2 per request: 9.52 slots, not (50 − 10) ms · 10k = 400
    s = pd_sizing(mix((50, 2.0, 1000, 100)), overhead_s=0.01, max_token_tpt=10_000, kv_capacity_tokens=10_000)
    tier = s["tiers"]["50"]
    assert tier["memory_bound"] is True and tier["slots_per_instance"] == pytest.approx(10_000 / 1050)
    # the memory-bound batch steps in 9.52/10k + 10 ms, not the 50 ms TPOT: λ·O·step in flight
    slots = 10_000 / 1050
    step = slots / 10_000 + 0.01
    assert tier["decode_instances"] == pytest.approx(2 * 100 * step / slots)


def test_perf_constants_from_a_step_time_model() -> None:
    assert perf_constants(Linear()) == (pytest.approx(0.0051), pytest.approx(10_000))
    # 100 KV tokens per request: C = 5.2 ms; slope (56.2 − 5.2) ms / 255 = 0.2 ms → 5000 tokens/s
    assert perf_constants(Linear(), 100) == (pytest.approx(0.0052), pytest.approx(5_000))
    assert prefill_throughput(Linear(), 1000) == pytest.approx(1000 / (0.005 + 0.1 + 0.001))
    roofline = RooflinePerfModel([RooflineTerm(k_tokens=1e-4, k_spec=0.0, k_kv=1e-6, b=0.005)])
    assert perf_constants(roofline, 100) == (pytest.approx(0.0052), pytest.approx(5_000))
    with pytest.raises(ValueError):
        perf_constants(RooflinePerfModel([RooflineTerm(0.0, 0.0, 0.0, 0.01)]))  # flat: no per-token cost


def test_a_perf_model_is_probed_at_the_mix_mean_context() -> None:
    data = mix((50, 1.0, 100, 100), (100, 3.0, 300, 200))  # context 150 and 400, weighted 1:3 → 337.5
    s = pd_sizing(data, Linear())
    assert s["kv_tokens_per_req"] == pytest.approx(337.5)
    c, tpt = perf_constants(Linear(), 337.5)
    assert (s["overhead_s"], s["max_token_tpt"]) == (pytest.approx(c), pytest.approx(tpt))
    assert s["prefill_tpt"] == pytest.approx(prefill_throughput(Linear()))
    with pytest.raises(ValueError, match="perf model"):
        pd_sizing(data)


def test_the_tracker_keeps_a_sliding_window_per_tier() -> None:
    m = MixTracker(window_s=10, start=0)
    m.on_arrival(50, 100, now=1)
    m.on_arrival(50.0, 300, now=2)  # same tier as 50
    m.on_finished(50, 40, now=3)
    m.on_arrival(None, 7, now=4)
    snap = m.snapshot(5)
    assert set(snap) == {50.0, None}
    assert snap[50.0] == TierMix(50.0, rate_rps=2 / 5, mean_input=200, mean_output=40, arrivals=2, finished=1)
    assert snap[None].mean_output is None and snap[None].rate_rps == pytest.approx(1 / 5)
    m.on_arrival(50, 1000, now=12)  # horizon 2: the arrival at 1 expires, the one at 2 stays
    snap = m.snapshot(12)
    assert (snap[50.0].arrivals, snap[50.0].mean_input, snap[50.0].rate_rps) == (2, 650, pytest.approx(0.2))
    assert snap[50.0].mean_output == 40
    snap = m.snapshot(13.5)  # horizon 3.5: the completion at 3 is gone too
    assert (snap[50.0].arrivals, snap[50.0].mean_input, snap[50.0].finished) == (1, 1000, 0)
    assert snap[50.0].mean_output is None and snap[None].arrivals == 1
    assert None not in m.snapshot(14.5)  # the no-TPOT arrival at 4 expires on its own
    assert m.snapshot(30) == {}


def test_the_tracker_rates_divide_by_the_time_observed() -> None:
    m = MixTracker(window_s=60)
    m.on_arrival(50, 10, now=100)  # start = first event
    assert m.snapshot(100)[50.0].rate_rps == 1.0  # floored at min_span_s = 1 s, not infinite
    m.on_arrival(50, 10, now=110)
    assert m.snapshot(110)[50.0].rate_rps == pytest.approx(2 / 10)
    assert m.snapshot(200) == {} and m.span_s(200) == 60


def test_tracker_sizing_falls_back_to_the_pooled_output() -> None:
    m = MixTracker(window_s=60, start=0)
    for t in range(10):
        m.on_arrival(50, 1000, now=t)
        m.on_arrival(100, 100, now=t)
    m.on_finished(100, 300, now=5)
    m.on_finished(100, 100, now=6)
    s = tracker_sizing(m, 10.0, overhead_s=0.01, max_token_tpt=10_000)
    assert (s["window_s"], s["span_s"]) == (60, 10)
    assert s["tiers"]["50"]["sized_output"] == 200  # no completion of its own: the pooled mean
    assert s["tiers"]["100"]["sized_output"] == 200
    assert s["tiers"]["50"]["decode_instances"] == pytest.approx(1.0 * 200 * 1.25 / 10_000)
    assert s["no_output"] == []


def test_shipped_profiles_size_a_mix() -> None:
    perf, capacity = profile_inputs("h100")
    assert capacity and capacity > 100_000
    s = pd_sizing(mix((50, 2.0, 1000, 200), (100, 1.0, 200, 800)), perf, kv_capacity_tokens=capacity)
    assert 0.005 < s["overhead_s"] < 0.01  # an 8B model's weights read once per step on an H100
    assert s["prefill_tpt"] > s["max_token_tpt"] > 0  # decode tokens also read their context
    assert s["ratio"] > 0 and s["goodput_per_device_rps"] > 0


def test_split_devices_rounds_by_largest_remainder_and_keeps_both_stages() -> None:
    s = pd_sizing(TWO_TIERS, overhead_s=0.01, max_token_tpt=10_000)  # demands 0.25 : 0.025 : 0.06
    assert split_devices(s, 3) == {"prefill": 2, "decode": {"50": 0, "20": 1}}
    assert split_devices(s, 2) == {"prefill": 1, "decode": {"50": 0, "20": 1}}  # 2 : 0 would serve nothing
    assert split_devices(s, 1) == {"prefill": 1, "decode": {"50": 0, "20": 0}}
    assert split_devices(s, 67) == {"prefill": 50, "decode": {"50": 5, "20": 12}}
    empty = pd_sizing([], overhead_s=0.01, max_token_tpt=10_000)
    assert split_devices(empty, 4) == {"prefill": 0, "decode": {}}


def test_prometheus_gauges_of_the_sizing() -> None:
    s = pd_sizing([*TWO_TIERS, *mix((10, 1.0, 1, None))], overhead_s=0.01, max_token_tpt=10_000)

    class One(Collector):
        def collect(self):  # type: ignore[no-untyped-def]
            yield from pd_sizing_metrics(s)

    registry = CollectorRegistry()
    registry.register(One())
    text = generate_latest(registry).decode()
    assert f"sglang_slo_router_pd_ratio {2500 / 850!r}" in text
    assert 'sglang_slo_router_pd_tier_decode_instances{tier_ms="20"} 0.06' in text
    assert 'sglang_slo_router_pd_tier_feasible{tier_ms="10"} 0.0' in text
    assert 'sglang_slo_router_pd_tier_mean_output_tokens{tier_ms="10"}' not in text  # None: left out
    assert list(pd_sizing_metrics(None)) == []
    no_decode = pd_sizing(mix((50, 1.0, 10, None)), overhead_s=0.01, max_token_tpt=10_000)
    names = {f.name for f in pd_sizing_metrics(no_decode)}
    assert "sglang_slo_router_pd_ratio" not in names and "sglang_slo_router_pd_prefill_instances" in names
