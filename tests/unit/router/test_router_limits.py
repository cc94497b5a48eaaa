"""What clients and workers can make the router hold: the TPOT tiers a client's numbers mint (mix
tracker keys and metric labels stay a small fixed set), and a registered worker's large frames
still arrive (the transport decodes them only from connections that registered)."""

from __future__ import annotations

import re

import zmq.asyncio
from prometheus_client import CollectorRegistry, generate_latest

from router.monitoring import MAX_TIER_LABELS, RouterCollector
from router.pd_sizing import MAX_TIER_MS, MIN_TIER_MS, TIER_STEPS, tpot_tier
from router.protocol import Register
from router.service import RouterConfig, RouterService
from scheduler.core.slo import SloSpec
from tests.unit.router._router_harness import router, run

GRID_SIZE = len(TIER_STEPS) * 5 + 1  # five decades from MIN_TIER_MS, and MAX_TIER_MS itself


def _register(service: RouterService, wid: str, role: str) -> None:
    reg = Register(
        worker_id=wid,
        gpu="h100",
        model="m",
        kv_capacity_tokens=10_000,
        max_running=64,
        role=role,
        bootstrap_port=9100 if role == "prefill" else None,
    )
    assert service.registry.register(reg, service.clock()).accepted


def _labels(metrics: str, family: str) -> set[str]:
    return set(re.findall(rf'^{family}\{{tier_ms="([^"]*)"', metrics, re.M))


def test_ten_thousand_distinct_tpots_make_a_bounded_set_of_tiers_and_labels() -> None:
    now = [1000.0]
    service = RouterService(RouterConfig(routing_policy="goodserve"), clock=lambda: now[0])
    _register(service, "p0", "prefill")
    _register(service, "d0", "decode")
    for i in range(10_000):
        now[0] += 0.001
        slo = SloSpec(ttft_ms=1000, tpot_ms=0.5 + i * 13.37)  # every one distinct, up to ~134 s
        service.mix.on_arrival(service.tier_of(slo), 100, now[0])
        service.mix.on_finished(service.tier_of(slo), 10, now[0])
    keys = set(service.mix.snapshot(now[0]))
    assert len(keys) <= GRID_SIZE
    assert all(MIN_TIER_MS <= k <= MAX_TIER_MS for k in keys if k is not None)
    metrics = generate_latest(service.reports.metrics.registry).decode()
    labels = _labels(metrics, "sglang_slo_router_pd_tier_rate_rps")
    assert 10 < len(labels) <= GRID_SIZE


def test_a_tier_is_never_looser_than_its_requests() -> None:
    for tpot in (1.0, 7.77, 50.0, 60.0, 99.9, 100.0, 333.0, 99_999.0):
        tier = tpot_tier(tpot)
        assert tier is not None and tier <= tpot and tier > tpot / 1.3


def test_a_policy_with_a_tier_per_tpot_gets_a_bounded_number_of_labels() -> None:
    tiers = {f"{t:g}": {"instances": 1, "routed": 2} for t in range(1, 10_001)}
    registry = CollectorRegistry()
    registry.register(RouterCollector(lambda: {}, lambda: [], lambda: {"tiers": tiers}))
    metrics = generate_latest(registry).decode()
    labels = _labels(metrics, "sglang_slo_router_tier_instances")
    assert len(labels) == MAX_TIER_LABELS and "other" in labels
    total = sum(
        float(v) for v in re.findall(r'^sglang_slo_router_tier_instances\{tier_ms="[^"]*"\} (\S+)', metrics, re.M)
    )
    assert total == 10_000  # nothing lost: the rest are summed


def test_a_registered_workers_large_chunks_arrive(ctx: zmq.asyncio.Context) -> None:
    script = [100 + i % 300 for i in range(30_000)]  # one chunk far larger than a stranger may send

    async def go() -> None:
        async with router(ctx, [{"script": script, "chunk": len(script)}]) as h:
            body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": len(script)}}
            resp = await h.client.post("/generate", json=body)
            assert resp.status_code == 200, resp.text
            assert resp.json()["output_ids"] == script

    run(go, 60.0)
