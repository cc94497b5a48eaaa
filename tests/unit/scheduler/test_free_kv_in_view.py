"""The plan's free KV counts the radix cache's evictable prefixes, as SGLang's admission does:
once finished requests' prefixes fill the cache, free slots alone are next to none, and
SLOs-Serve's DP (which checks memory) declined every new request."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from scheduler.core.perf_model import LinearCoefficients, constant_model
from tests.unit.scheduler._stand_in_engine import StandInReq, slo_scheduler


def test_a_request_fitting_in_evictable_cache_is_admitted() -> None:
    s = slo_scheduler(policy="slos", startup_chunk=2048, perf=constant_model(0.01))
    s.token_to_kv_pool_allocator = SimpleNamespace(available_size=lambda: 100)  # free slots: few
    s.tree_cache.evictable_size = lambda: 50_000  # finished requests' prefixes, evictable
    s.waiting_queue = [StandInReq("r", prompt=1000, ttft_ms=60_000.0, max_new_tokens=64)]
    views = []
    view_of = s._slo_view
    s._slo_view = lambda batch: (v := view_of(batch), views.append(v))[0]  # type: ignore[method-assign]
    out = s.get_new_batch_prefill(s.running_batch)
    assert views and views[0].free_kv_tokens == 50_100
    assert s.slo.counters.best_effort_waiting == 0  # admitted, not declined for memory
    assert out.batch_to_run is not None and [r.rid for r in out.batch_to_run.reqs] == ["r"]
    assert s.slo_status_snapshot()["kv_used_tokens"] == s.max_total_num_tokens - 50_100


def test_the_status_reports_the_models_plain_decode_step_for_the_routers_admission() -> None:
    perf = LinearCoefficients(base_s=0.01, per_token_s=1e-4, per_kv_token_s=1e-8).model()
    s = slo_scheduler(policy="slos", startup_chunk=2048, perf=perf)
    s.token_to_kv_pool_allocator = SimpleNamespace(available_size=lambda: 100)
    s.tree_cache.evictable_size = lambda: 0
    kv_used = s.max_total_num_tokens - 100
    # nothing running: one decode, over the KV the pool holds
    assert s.slo_status_snapshot()["decode_step_ms"] == pytest.approx(1000 * (0.01 + 1e-4 + 1e-8 * kv_used))


@pytest.mark.parametrize(("policy", "levers"), [("slos", True), ("edf", True), ("sarathi", False), ("fcfs", False)])
def test_the_status_says_whether_the_slo_levers_size_the_steps(policy: str, levers: bool) -> None:
    # the router keeps a TPOT tier on such an engine by its plain decode step (PolyServe); the
    # helper runs edf with the levers, as the server does for edf with `slo_levers=true`
    s = slo_scheduler(policy=policy, startup_chunk=2048, perf=constant_model(0.01))
    s.token_to_kv_pool_allocator = SimpleNamespace(available_size=lambda: 100)
    s.tree_cache.evictable_size = lambda: 0
    assert s.slo_status_snapshot()["slo_levers"] is levers
