"""The headline experiments' common machinery: a system under test (`Config`), the grid that runs
each (system, workload, rate, seed) once and keeps its summary, the workload shape every paper's
run shares, and where attainment falls through the target."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.goodput.mixes import Scale
from benchmarks.goodput.records import PlannedRequest
from benchmarks.goodput.scoring import RunMetrics, Scored, offered_window
from benchmarks.goodput.workload import WorkloadSpec, plan
from benchmarks.simulator.cluster import ClusterConfig
from benchmarks.simulator.pool import PoolSpec
from benchmarks.simulator.runner import Run, simulate
from benchmarks.simulator.speculative_decoding import APART
from benchmarks.simulator.worker import EngineOptions
from router.pd import SPREAD
from server.agent_load import REPORT_S

TARGET = 0.9


@dataclass(frozen=True)
class Config:
    """A system under test: pool, router, engine policy and their options."""

    label: str
    pool: str
    routing: str = "round_robin"
    policy: str = "fcfs"
    routing_params: tuple[tuple[str, Any], ...] = ()
    policy_params: tuple[tuple[str, Any], ...] = ()
    speculation: str | None = None
    spec_layout: str = APART
    spec_alpha: float = 0.7  # the draft's true acceptance (SLOs-Serve's OPT-125m draft)
    draft_ratio: float = 0.05  # a draft pass's cost / a target decode pass's
    report_s: float = REPORT_S  # the worker agents' load-report period (the live default)
    prefill_placement: str = SPREAD  # PD: the router's --pd-prefill-placement

    def cluster(self, seed: int) -> ClusterConfig:
        params = dict(self.routing_params)
        if self.routing in ("random", "power_of_two", "jit"):
            params.setdefault("seed", seed)
        return ClusterConfig(
            pool=PoolSpec.parse(self.pool),
            engine=EngineOptions(policy=self.policy, policy_params=self.policy_params),
            routing=self.routing,
            routing_params=tuple(params.items()),
            speculation=self.speculation,
            spec_alpha=self.spec_alpha,
            draft_ratio=self.draft_ratio,
            spec_layout=self.spec_layout,
            report_s=self.report_s,
            prefill_placement=self.prefill_placement,
            seed=seed,
            stream_scores=True,
        )


class Grid:
    """Runs (config, workload, rate, seed) once each; plans a workload once per (spec, rate)."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self._plans: dict[tuple[Any, ...], list[PlannedRequest]] = {}
        self.results: dict[tuple[str, str, float, int], dict[str, Any]] = {}

    def planned(self, spec: WorkloadSpec, rate: float, scale: Scale) -> list[PlannedRequest]:
        # tpot_factor too: a scale may tighten the TPOT targets alone (PolyServe's --tier-scale)
        key = (spec, rate, scale.number, scale.calibration, scale.tpot_factor)
        if key not in self._plans:
            self._plans[key] = plan(spec, rate, scale)
        return self._plans[key]

    def run(self, cfg: Config, spec: WorkloadSpec, rate: float, scale: Scale, tag: str = "") -> dict[str, Any]:
        key = (cfg.label, tag or spec.mix, round(rate, 6), spec.seed)
        if key in self.results:
            return self.results[key]
        body, result = simulate(
            Run(cfg.label, spec, rate, scale, cfg.cluster(spec.seed)), self.planned(spec, rate, scale)
        )
        m: RunMetrics = body["metrics"]
        makespan = body["config"]["sim"]["makespan_s"] or 0.0
        summary = {
            "attainment": m.attainment,
            "goodput_rps": m.goodput_rps or 0.0,
            "jitserve_tok_s": m.jitserve_tok_s or 0.0,
            "dslo_tok_s": m.dslo_tok_s or 0.0,
            "service_gain": m.service_gain,
            "gain_ratio": m.service_gain_ratio or 0.0,
            "throughput_tok_s": m.output_tokens / makespan if makespan else 0.0,
            "by_class": m.attainment_by_class,
            "by_tpot": _by_tpot(result.scored),
            "ttft_p90_ms": m.ttft_ms["p90"],
            "tpot_p90_ms": m.tpot_ms["p90"],
            "requests": m.requests,
            "window_s": offered_window(self.planned(spec, rate, scale)),
            "wall_s": result.wall_s,
            "decision_us": result.decision_us()["mean"],
            "migrated": result.counters.get("migrated", 0),
            "reasons": {k[len("reason:") :]: v for k, v in result.counters.items() if k.startswith("reason:")},
        }
        self.results[key] = summary
        self.log(
            f"   {tag or spec.mix} {cfg.label} @ {rate:.3g}/s seed {spec.seed}: attained {m.attainment:.3f}, "
            f"goodput {m.goodput_rps or 0:.2f}/s, {result.wall_s:.1f}s"
        )
        return summary

    def mean(self, label: str, tag: str, rate: float, seeds: Sequence[int], metric: str) -> float:
        return statistics.mean(self.results[(label, tag, round(rate, 6), s)][metric] for s in seeds)


def _by_tpot(scored: Sequence[Scored]) -> dict[str, float]:
    """Attainment per TPOT target (PolyServe's tiers)."""
    seen: dict[str, list[bool]] = defaultdict(list)
    for s in scored:
        tpot = s.record.slo.get("tpot_ms")
        if tpot is not None:
            seen[f"{tpot:g}"].append(s.outcome.attained)
    return {k: sum(v) / len(v) for k, v in sorted(seen.items(), key=lambda kv: float(kv[0]))}


def crossing(points: Sequence[tuple[float, float]], target: float = TARGET) -> float | None:
    """The rate where attainment falls through `target`, linear between the measured rates around
    it; the highest rate when it never does; None when even the lowest misses."""
    pts = sorted(points)
    if not pts or pts[0][1] < target:
        return None
    for (r0, a0), (r1, a1) in zip(pts, pts[1:]):
        if a1 < target:
            return r0 + (r1 - r0) * (a0 - target) / (a0 - a1)
    return pts[-1][0]


def workload_spec(trace: str, mix: str, units: int, seed: int, arrivals: str = "poisson", **kw: Any) -> WorkloadSpec:
    """The shape every headline run shares: the papers' prompt and output caps unless `kw` widens them."""
    shape = {"max_prompt": 8192, "max_output": 2048, **kw}
    return WorkloadSpec(trace=trace, mix=mix, units=units, seed=seed, arrivals=arrivals, **shape)
