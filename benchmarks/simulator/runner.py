"""One simulated run, as the live benchmarks record one: planned workload in, run dict out.

The run dict is the one benchmarks/goodput/report.py writes and plots (label, rate, config,
metrics, timeline, records), so simulated and measured runs sit in the same results.json and
the same tables. Rates per second divide by the offered window (first to last planned arrival),
as benchmarks/experiments/emulated_routing.py does: every configuration serves the same arrivals.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.goodput.mixes import Calibration, Scale, profile_zero_load
from benchmarks.goodput.records import PlannedRequest
from benchmarks.goodput.scoring import RunMetrics, auto_bin_s, makespan_scored, offered_window, timeline
from benchmarks.goodput.workload import WorkloadSpec, plan
from benchmarks.simulator.cluster import ClusterConfig, ClusterResult, ClusterSim


def slo_scale(number: float = 1.0, relative_to: str | None = None, model: str = "llama3-8b") -> Scale:
    """The mixes' targets (written for an H100) times `number`; `relative_to` a card instead
    rescales them to that card's zero-load speed (GoodServe sets deadlines from a solo run on a
    mid-tier GPU)."""
    if relative_to is None:
        return Scale(number)
    return Scale(number, Calibration(**asdict(profile_zero_load(relative_to, model))))


@dataclass(frozen=True)
class Run:
    label: str
    workload: WorkloadSpec
    rate: float | None
    scale: Scale
    cluster: ClusterConfig


def simulate(run: Run, planned: list[PlannedRequest] | None = None) -> tuple[dict[str, Any], ClusterResult]:
    """Plan (unless given), simulate and score one run; returns the report's run dict."""
    planned = planned if planned is not None else plan(run.workload, run.rate, run.scale)
    result = ClusterSim(run.cluster).run(planned)
    window = offered_window(planned)
    metrics: RunMetrics = result.metrics(window)
    records = result.records
    config = {
        "simulated": True,
        "workload": asdict(run.workload),
        "slo_scale": run.scale.number,
        "calibration": None if run.scale.calibration is None else asdict(run.scale.calibration),
        "pool": str(run.cluster.pool),
        "routing": run.cluster.routing,
        "routing_params": dict(run.cluster.routing_params),
        "engine": asdict(run.cluster.engine),
        "speculation": run.cluster.speculation,
        "seed": run.cluster.seed,
        "sim": {
            "wall_s": round(result.wall_s, 3),
            "events": result.events,
            "end_s": round(result.end_s, 3),
            "makespan_s": makespan_scored(result.scored),
            "decision_us": result.decision_us(),
            "router": result.counters,
            "workers": result.workers,
        },
    }
    body = {
        "label": run.label,
        "rate": run.rate,
        "config": config,
        "metrics": metrics,
        "timeline": timeline(records, auto_bin_s(metrics.duration_s)) if records else [],
        "records": records,
    }
    return body, result
