"""SLOs-Serve per-replica admission: the core DP on the router's view of one replica."""

from __future__ import annotations

from typing import Any

import pytest

from router.policies import RoutingContext, make_routing_policy
from router.policies.slos_admission import AdmissionParams, ReplicaAdmission
from router.policies.slos_routing import SlosRoutingParams
from router.routing_views import RunningView
from scheduler.core.perf_model import DEFAULT_COEFFICIENTS, LinearCoefficients
from tests.unit.router._policy_views import deadline_slo, latency_slo, request, worker

NOW = 10.0
FAST = {"prefill_s_per_token": 5e-5, "decode_s_per_token": 0.012, "iteration_s": 0.015}
REQ = request("new", prompt=500, arrival=NOW, slo=latency_slo(1000, 50), predicted_output_tokens=200)


def admission(running: dict[str, list[RunningView]] | None = None, **params: Any) -> ReplicaAdmission:
    table = running or {}
    return ReplicaAdmission(lambda wid: table.get(wid, []), AdmissionParams(**params), clock=lambda: NOW)


def decoding(wid: str, n: int, tpot_ms: float) -> list[RunningView]:
    """n requests already streaming on `wid` under a TTFT 500 ms / TPOT `tpot_ms` SLO."""
    slo = latency_slo(500, tpot_ms)
    reqs = [request(f"{wid}-d{i}", arrival=NOW - 1, slo=slo, predicted_output_tokens=500) for i in range(n)]
    return [RunningView(r, wid, generated=10, first_token_s=NOW - 0.5) for r in reqs]


def test_idle_fast_replica_admits_and_a_too_slow_decoder_refuses() -> None:
    admit = admission()
    assert admit(REQ, worker("fast", **FAST))
    slow = worker("slow", prefill_s_per_token=5e-5, decode_s_per_token=0.08, iteration_s=0.08)
    assert not admit(REQ, slow)  # 80 ms per token cannot hold a 50 ms TPOT
    assert admit(request("loose", arrival=NOW, slo=latency_slo(1000, 100)), slow)


def test_a_replica_full_of_tight_decoders_refuses_while_an_empty_one_admits() -> None:
    # Both report the same hardware: 19 ms per step plus 1 ms per token, so a 25 ms TPOT holds 6 decoders.
    busy = worker("busy", running=6, prefill_s_per_token=1e-3, decode_s_per_token=0.025)
    empty = worker("empty", running=0, prefill_s_per_token=1e-3, decode_s_per_token=0.020)
    admit = admission({"busy": decoding("busy", 6, 25)})
    req = request("new", prompt=100, arrival=NOW, slo=latency_slo(1000, 25), predicted_output_tokens=100)
    assert admit.coefficients(busy).base_s == pytest.approx(admit.coefficients(empty).base_s)
    assert not admit(req, busy)
    assert admit(req, empty)


def test_forced_prefills_keep_their_deadline_and_missed_ones_do_not_block() -> None:
    # ~780 prefill tokens fit in a second at 1 ms per token beside 11 ms steps: one 600-token prompt, not two.
    w = worker("w", prefill_s_per_token=1e-3, decode_s_per_token=0.012)
    req = request("new", prompt=600, arrival=NOW, slo=latency_slo(1000, 100), predicted_output_tokens=50)
    queued = request("q", prompt=600, arrival=NOW, slo=latency_slo(1000, 100), predicted_output_tokens=50)
    late = request("late", prompt=600, arrival=NOW - 5, slo=latency_slo(1000, 100), predicted_output_tokens=50)
    assert admission()(req, w)
    assert not admission({"w": [RunningView(queued, "w", 0)]})(req, w)
    assert admission({"w": [RunningView(late, "w", 0)]})(req, w)  # already missed: best effort, no budget


def test_exhausted_kv_memory_refuses_even_before_the_report_shows_it() -> None:
    admit = admission()
    assert not admit(REQ, worker("full", kv_used_tokens=99_800, **FAST))
    hog = request("hog", prompt=99_500, arrival=NOW - 5)  # no SLO, decoding: holds its tokens
    stale = worker("stale", kv_used_tokens=0, **FAST)
    assert admit(REQ, stale)
    assert not admission({"stale": [RunningView(hog, "stale", generated=100, first_token_s=NOW - 1)]})(REQ, stale)


def test_before_any_report_the_default_model_still_checks_tpot_and_slots() -> None:
    fresh = worker("fresh", max_running=4)  # every EMA still zero
    assert admission().coefficients(fresh) == DEFAULT_COEFFICIENTS
    nominal = LinearCoefficients(base_s=0.008, per_token_s=5e-5)
    admit = admission(default_perf=nominal)
    assert admit.coefficients(fresh) == nominal
    assert admit(REQ, fresh)
    assert not admit(request("tight", arrival=NOW, slo=latency_slo(1000, 5)), fresh)  # below the 8 ms base step
    others = [RunningView(request(f"o{i}", arrival=NOW), "fresh", 0) for i in range(4)]
    assert not admission({"fresh": others}, default_perf=nominal)(REQ, fresh)  # no batch slot left


def test_measured_decode_step_is_reproduced_at_the_reported_batch() -> None:
    w = worker("w", running=8, prefill_s_per_token=1e-4, decode_s_per_token=0.03)
    assert admission().coefficients(w).per_token_s == 1e-4
    perf = admission().perf_model(w)
    assert perf.step_time(0, 8, 0) == pytest.approx(0.03)
    assert admission().perf_model(worker("i", iteration_s=0.02)).step_time(0, 1, 0) == pytest.approx(0.02)


def test_deadline_requests_use_the_cores_derived_prefill_deadline() -> None:
    admit = admission()
    fast = worker("fast", **FAST)
    assert admit(request("d", prompt=500, arrival=NOW, slo=deadline_slo(20_000), predicted_output_tokens=200), fast)
    assert not admit(request("gone", arrival=NOW - 30, slo=deadline_slo(20_000)), fast)  # past its deadline
    # 200 tokens in 1 s need 4 ms per token (80 % of the time left): faster than one lone decoder here.
    assert not admit(request("rush", arrival=NOW, slo=deadline_slo(1000), predicted_output_tokens=200), fast)


def test_routing_takes_the_first_admitting_replica_and_falls_back_best_effort() -> None:
    workers = [
        worker("slow", inflight=0, prefill_s_per_token=5e-5, decode_s_per_token=0.08),
        worker("busy", inflight=6, running=6, prefill_s_per_token=1e-3, decode_s_per_token=0.025),
        worker("ok", inflight=7, **FAST),
        worker("later", inflight=9, **FAST),
    ]
    loose = [RunningView(request(f"b{i}", arrival=NOW - 1), "ok", 5, NOW - 0.5) for i in range(7)]
    running = {"busy": decoding("busy", 6, 25), "ok": loose}
    # Through the registry: the factory builds the admission over the router's view and clock.
    policy = make_routing_policy("slos", RoutingContext(running_on=lambda wid: running.get(wid, []), clock=lambda: NOW))
    req = request("new", prompt=100, arrival=NOW, slo=latency_slo(1000, 25), predicted_output_tokens=100)
    d = policy.choose(req, workers, NOW)
    assert (d.worker_id, d.reason, d.best_effort, d.detail["refusals"]) == ("ok", "admitted", False, 2)
    d = policy.choose(request("x", arrival=NOW, slo=latency_slo(1000, 5)), workers, NOW)
    assert (d.worker_id, d.reason, d.best_effort, d.detail["refusals"]) == ("slow", "refused_everywhere", True, 4)


def test_a_deadline_running_behind_sets_no_tier_under_the_floor() -> None:
    # One deadline decoder needs 490 tokens in 7.6 s, about 1.3 lone steps (12 ms) each. As a
    # tier it leaves ~30 prefill tokens per batch: a 5000-token prompt would miss its 1 s TTFT.
    w = worker("w", running=1, **FAST)
    behind = request("behind", arrival=NOW - 1, slo=deadline_slo(8640), predicted_output_tokens=500)
    running = {"w": [RunningView(behind, "w", generated=10, first_token_s=NOW - 0.5)]}
    big = request("big", prompt=5000, arrival=NOW, slo=latency_slo(1000, 50), predicted_output_tokens=100)
    assert not admission(running, derived_tpot_floor_steps=1.0)(big, w)  # one lone step: its tier binds
    assert admission(running)(big, w)  # the default, 4 steps: it decodes without a target
    # A new deadline that tight is still taken at 4 steps (without a target), and still refused
    # when no lone step here could make it.
    rushed = request("rushed", arrival=NOW, slo=deadline_slo(9000), predicted_output_tokens=490)
    assert admission()(rushed, w)
    assert not admission()(request("rush", arrival=NOW, slo=deadline_slo(1000), predicted_output_tokens=200), w)


def test_the_floor_is_validated_as_a_routing_parameter() -> None:
    with pytest.raises(ValueError, match="derived_tpot_floor_steps"):
        SlosRoutingParams(derived_tpot_floor_steps=0.5)
    with pytest.raises(ValueError, match="derived_tpot_floor_steps"):
        AdmissionParams(derived_tpot_floor_steps=-1)


def test_decoders_ahead_of_schedule_lend_the_next_batch_their_banked_slack() -> None:
    # 5 decoders under a 25 ms TPOT on 19 ms + 1 ms per token leave 1 prompt token per batch: a
    # 300-token prompt misses its 1 s TTFT on the tier's batches alone.
    w = worker("w", running=5, prefill_s_per_token=1e-3, decode_s_per_token=0.024)
    req = request("new", prompt=300, arrival=NOW, slo=latency_slo(1000), predicted_output_tokens=100)

    def streaming(arrival: float) -> dict[str, list[RunningView]]:
        """5 decoders two tokens in under TTFT 500 ms / TPOT 25 ms, arrived at `arrival`."""
        slo = latency_slo(500, 25)
        reqs = [request(f"d{i}", arrival=arrival, slo=slo, predicted_output_tokens=500) for i in range(5)]
        return {"w": [RunningView(r, "w", generated=2, first_token_s=NOW) for r in reqs]}

    # Arrived now, their third token is due 0.55 s from now: one batch may carry the whole prompt.
    assert admission(streaming(NOW))(req, w)
    assert not admission(streaming(NOW), banked_slack=False)(req, w)
    # Arrived 0.55 s ago, that token is due now: they bank nothing.
    assert not admission(streaming(NOW - 0.55))(req, w)


def test_the_engines_predicted_decode_step_sets_the_base_not_the_token_gaps() -> None:
    # Token gaps of 40 ms at 30 running carry the prefill chunks mixed into the steps; the engine
    # predicts a 15 ms plain decode step. Batches last idle_batch_s (50 ms) here: 380 prompt tokens
    # each on the 12 ms base, 130 on the 37 ms one, so a 700-token prompt due in 150 ms fits only
    # the first.
    gaps = {"running": 30, "prefill_s_per_token": 1e-4, "decode_s_per_token": 0.04}
    stepped = worker("stepped", decode_step_s=0.015, **gaps)
    unstepped = worker("gaps", **gaps)
    admit = admission()
    assert admit.coefficients(stepped).base_s == pytest.approx(0.015 - 30 * 1e-4)
    assert admit.coefficients(unstepped).base_s == pytest.approx(0.04 - 30 * 1e-4)
    req = request("new", prompt=700, arrival=NOW, slo=latency_slo(150), predicted_output_tokens=50)
    assert admit(req, stepped)
    assert not admit(req, unstepped)
