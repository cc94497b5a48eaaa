"""The PolyServe headline's --tier-scale: the router's tiers must be the very targets its
requests carry (a tier no request has, or a request with no tier, turns tiers into best effort),
and a scaled run must not reuse the unscaled run's planned requests."""

from __future__ import annotations

import pytest

from benchmarks.experiments import headline_grid
from benchmarks.experiments.headline_grid import Grid, workload_spec
from benchmarks.experiments.headline_polyserve import TierScale, router_tiers
from benchmarks.goodput.mixes import POLYSERVE_TPOT_TIERS, apply_mix
from benchmarks.simulator.runner import slo_scale
from benchmarks.workloads.traces import TraceRequest


def _requests(n: int = 400) -> list[TraceRequest]:
    return [TraceRequest(arrival_s=0.1 * i, prompt_tokens=200 + i, output_tokens=50, rid=f"r{i}") for i in range(n)]


def test_unscaled_tiers_are_the_papers() -> None:
    assert router_tiers(slo_scale()) == [t for t, _ in POLYSERVE_TPOT_TIERS]


@pytest.mark.parametrize("tier", [1.0, 0.457, 0.3])
def test_tiers_are_the_requests_targets(tier: float) -> None:
    scale = TierScale(1.0, tier=tier)
    targets = {p.slo["tpot_ms"] for p in apply_mix(_requests(), "polyserve", scale, seed=0)}
    assert targets == set(router_tiers(scale))


def test_tier_scale_leaves_ttft_alone() -> None:
    plain = apply_mix(_requests(), "polyserve", slo_scale(), seed=0)
    tight = apply_mix(_requests(), "polyserve", TierScale(1.0, tier=0.457), seed=0)
    assert [p.slo["ttft_ms"] for p in plain] == [p.slo["ttft_ms"] for p in tight]
    assert all(t.slo["tpot_ms"] < p.slo["tpot_ms"] for p, t in zip(plain, tight))


def test_grid_plans_a_scaled_run_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(headline_grid, "plan", lambda spec, rate, scale: [scale.tpot_factor])
    grid = Grid(lambda line: None)
    spec = workload_spec("azure-conv", "polyserve", 10, 0)
    assert grid.planned(spec, 1.0, slo_scale()) == [1.0]
    assert grid.planned(spec, 1.0, TierScale(1.0, tier=0.5)) == [0.5]
