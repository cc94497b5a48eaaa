"""The router publishes the PD sizing signals of its live mix in /slo/status and /metrics."""

from __future__ import annotations

from prometheus_client import generate_latest

from router.protocol import Register
from router.service import RouterConfig, RouterService
from scheduler.core.slo import SloSpec


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _register(
    service: RouterService, wid: str, role: str, gpu: str = "h100", tier: float | None = None, scale: float = 1.0
) -> None:
    port = 9100 if role == "prefill" else None
    reg = Register(
        worker_id=wid,
        gpu=gpu,
        model="m",
        kv_capacity_tokens=10_000,
        max_running=64,
        role=role,
        bootstrap_port=port,
        tier_ms=tier,
        time_scale=scale,
    )
    assert service.registry.register(reg, service.clock()).accepted


def test_status_sizes_the_pool_from_the_live_mix_by_policy_tier() -> None:
    clock = Clock()
    service = RouterService(
        RouterConfig(routing_policy="polyserve", policy_params={"tiers_ms": [50, 100]}), clock=clock
    )
    _register(service, "p0", "prefill")
    _register(service, "d0", "decode", tier=50)
    _register(service, "d1", "decode", tier=100)
    assert service.registry.views(clock())[1].tpot_tier_ms == 50.0  # the registered tier seeds the view
    for i in range(20):
        clock.t += 0.5
        slo = SloSpec(ttft_ms=1000, tpot_ms=60 if i % 2 else 150)  # binned to tiers 50 and 100
        service.mix.on_arrival(service.tier_of(slo), 800, clock())
        service.mix.on_finished(service.tier_of(slo), 200, clock())
    sizing = service.status()["pd_sizing"]
    assert sizing["gpu"] == "h100"
    assert set(sizing["tiers"]) == {"50", "100"}
    assert abs(sizing["tiers"]["50"]["rate_rps"] - sizing["tiers"]["100"]["rate_rps"]) < 1e-9
    assert sizing["tiers"]["50"]["mean_input"] == 800 and sizing["tiers"]["100"]["mean_output"] == 200
    # the tighter tier's batch time bounds it harder (App. A's TPOT/(TPOT - C))
    assert sizing["tiers"]["50"]["decode_factor"] > sizing["tiers"]["100"]["decode_factor"] > 1
    assert sizing["tiers"]["50"]["decode_instances"] > 0 and sizing["tiers"]["100"]["decode_instances"] > 0
    assert sizing["ratio"] > 0 and sizing["prefill_instances"] > 0
    pool = sizing["pool"]
    assert pool["prefill_workers"] == 1 and pool["decode_workers"] == 2 and pool["co_located_workers"] == 0
    split = pool["split_for_this_pool"]
    assert split["prefill"] + sum(split["decode"].values()) == 3 and split["prefill"] >= 1
    metrics = generate_latest(service.reports.metrics.registry).decode()
    assert "sglang_slo_router_pd_ratio " in metrics
    assert 'sglang_slo_router_pd_tier_decode_instances{tier_ms="50"}' in metrics


def test_no_sizing_without_a_profile_for_the_gpu() -> None:
    service = RouterService(RouterConfig(routing_policy="round_robin"), clock=Clock())
    _register(service, "c0", "mixed", gpu="cpu")
    assert service.status()["pd_sizing"] is None
    assert "sglang_slo_router_pd_ratio" not in generate_latest(service.reports.metrics.registry).decode()


def test_an_emulated_pool_is_sized_in_its_dilated_time() -> None:
    plain = RouterService(RouterConfig(routing_policy="round_robin"), clock=Clock())
    slowed = RouterService(RouterConfig(routing_policy="round_robin"), clock=Clock())
    _register(plain, "d0", "mixed")
    _register(slowed, "d0", "mixed", scale=16)
    for service in (plain, slowed):
        service.mix.on_arrival(100.0, 500, service.clock())
        service.mix.on_finished(100.0, 50, service.clock())
    a, b = plain.pd_sizing(), slowed.pd_sizing()
    assert a is not None and b is not None and b["time_scale"] == 16.0
    assert abs(b["overhead_s"] - 16 * a["overhead_s"]) < 1e-9
    assert abs(b["max_token_tpt"] - a["max_token_tpt"] / 16) < 1e-6 * a["max_token_tpt"]
