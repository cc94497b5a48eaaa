"""The five papers' headline experiments in the cluster simulator, at their own scale and setup as
far as our profiles and traces allow, several seeds each; one row per claim: the paper's figure,
ours, the ratio, and what differs.

Every experiment runs the very policy objects the server runs (engines on the one plan path,
routers on the live router's views) over the live benchmarks' workloads and SLO mixes, scored by
the live benchmarks' metrics. Setups (each paper's evaluation section):

- tempo: one A100 (Llama-3.1-8B -> our a100 profile), Tempo's 3:1:1 mix (latency TTFT 2 s /
  TBT 100 ms, deadline 20 s, compound 20 s x stages) on Azure conversation lengths (their chatbot
  mix of Alpaca/LMSys is not here), Poisson load sweep; vLLM-FCFS, Sarathi, Autellix (LAS),
  SJF, EDF, Tempo and Tempo with the true lengths.
- jitserve: one A100, JITServe's 1:1:1 mix, Azure conversation arrivals rescaled (their
  Microsoft trace); vLLM, Sarathi, Autellix, SJF (in place of LTR), GMAX and its oracle.
- slos-serve: one A100 (OPT-7B -> Llama-3-8B), capacity at 90 % attainment (bisection) for
  ChatBot (loose SLOs, Azure conversation), Coder (5x TTFT, 50 ms TPOT, bursty Azure code
  arrivals) and Mixed (tight/loose pairs); vLLM, Sarathi, SLOs-Serve, SLOs-Serve with
  speculation (prefill in verify batches as the paper does, alpha 0.7, draft 5 % of a decode);
  ChatBot also on 4 replicas behind its sequential router (round-robin first pick, as in §6.2).
- polyserve: 20 H100s (the paper's H200 is not profiled), PolyServe's TTFT choices and TPOT tiers
  on Azure conversation lengths (the "splitwise" trace of its Table 1), Poisson load from 50 to
  115 % of the PD-optimal rate (SLOs-Serve App. A sizing of the mix); co-located and PD pools
  (split from the same sizing); PolyServe routing on engines with the SLO levers against random
  and least-request routing on stock chunked engines.
- goodserve: one H100, one A100 and two A40s (the paper's H800/A800/A40/V100; no V100 profile),
  E2E deadlines U(1, 3) x the solo latency on the A100 (its A800 rule) times an SLO scale, on
  Mooncake conversation arrivals, lengths and prefix blocks (their agent benchmarks are not
  here); every router on stock engines.

  python -m benchmarks.experiments.headline --seeds 0,1,2 --out results/headline
  python -m benchmarks.experiments.headline --only tempo --quick
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.cli import doc_parser
from benchmarks.goodput.capacity import search_capacity
from benchmarks.goodput.mixes import POLYSERVE_TPOT_TIERS, Scale
from benchmarks.goodput.records import PlannedRequest
from benchmarks.goodput.scoring import RunMetrics, Scored, offered_window
from benchmarks.goodput.workload import WorkloadSpec, plan
from benchmarks.simulator.cluster import ClusterConfig
from benchmarks.simulator.pool import PoolSpec, card
from benchmarks.simulator.runner import Run, simulate, slo_scale
from benchmarks.simulator.worker import EngineOptions
from router.pd_sizing import TierMix, pd_sizing, split_devices

TARGET = 0.9


@dataclass
class Row:
    """One claim: the paper's number, ours (mean over seeds, range in `ours_text`), their ratio."""

    paper: str
    claim: str
    paper_value: str
    ours_text: str
    ratio: str
    why: str


@dataclass
class Experiment:
    rows: list[Row] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0


# ---- running a grid ---------------------------------------------------------------------------


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
    spec_mixed: bool = False
    report_s: float = 0.25  # the worker agents' load-report period (the live default)

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
            spec_alpha=0.7,
            draft_ratio=0.05,
            spec_mixed=self.spec_mixed,
            report_s=self.report_s,
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
        key = (spec, rate, scale.number, scale.calibration)
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


def _range(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "-"
    if len(values) == 1 or min(values) == max(values):
        return fmt.format(values[0])
    return f"{fmt.format(min(values))}–{fmt.format(max(values))}"


def _best_of(per_load: dict[float, float]) -> str:
    """The largest ratio over the loads, and each load's."""
    each = ", ".join(f"{r:g}/s {v:.2f}" for r, v in per_load.items())
    return f"{max(per_load.values()):.2f}× (per load: {each})"


def _ratio(ours: float | None, paper: float) -> str:
    return "-" if ours is None or not paper else f"{ours / paper:.2f}"


def geomean(values: Sequence[float]) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0


def _workload(trace: str, mix: str, units: int, seed: int, arrivals: str = "poisson", **kw: Any) -> WorkloadSpec:
    shape = {"max_prompt": 8192, "max_output": 2048, **kw}
    return WorkloadSpec(trace=trace, mix=mix, units=units, seed=seed, arrivals=arrivals, **shape)


# ---- Tempo ------------------------------------------------------------------------------------


def tempo(grid: Grid, seeds: Sequence[int], quick: bool) -> Experiment:
    units, rates = (500, [6.0, 10.0]) if quick else (2000, [5.0, 6.5, 8.0, 10.0, 12.0])
    policies = ["fcfs", "sarathi", "las", "sjf", "edf", "tempo", "tempo_oracle"]
    scale = slo_scale()
    for seed in seeds:
        spec = _workload("azure-conv", "tempo", units, seed)
        for rate in rates:
            for p in policies:
                grid.run(Config(p, "a100:1", policy=p), spec, rate, scale)

    def mean(p: str, rate: float, metric: str) -> float:
        return grid.mean(p, "tempo", rate, seeds, metric)

    gain = {r: mean("tempo", r, "service_gain") / max(mean("fcfs", r, "service_gain"), 1e-9) for r in rates}
    good = {r: mean("tempo", r, "goodput_rps") / max(mean("fcfs", r, "goodput_rps"), 1e-9) for r in rates}
    top = max(rates)
    tput = mean("tempo", top, "throughput_tok_s") / max(mean("sarathi", top, "throughput_tok_s"), 1e-9)
    oracle = {r: mean("tempo", r, "goodput_rps") / max(mean("tempo_oracle", r, "goodput_rps"), 1e-9) for r in rates}
    why_gain = (
        "one A100 and Azure chat lengths for the paper's A100s and chatbot/LC mixes; runs of "
        f"{units} arrivals, not an hour, so the cascading HOL blocking the paper's ratios grow from has "
        "less time to build; "
        "no length predictor is deployed by default, so Tempo bounds lengths by the client's cap"
    )
    exp = Experiment()
    exp.rows = [
        Row(
            "Tempo",
            "service gain vs vLLM-FCFS (up to)",
            "8.3×",
            _best_of(gain),
            _ratio(max(gain.values()), 8.3),
            why_gain,
        ),
        Row(
            "Tempo",
            "SLO goodput vs vLLM-FCFS (up to)",
            "10.3×",
            _best_of(good),
            _ratio(max(good.values()), 10.3),
            why_gain,
        ),
        Row(
            "Tempo",
            "throughput vs Sarathi-Serve",
            "96–98 %",
            f"{100 * tput:.0f} % (at {top:g}/s, over the makespan)",
            _ratio(tput, 0.97),
            "the same engine speed model for both; Tempo's preemptions and reordering cost recomputation only",
        ),
        Row(
            "Tempo",
            "Tempo / its precise-knowledge oracle (goodput)",
            "close to 1",
            _range(list(oracle.values())),
            "-",
            "the oracle maximises Tempo's objective, service gain (where it leads), not request goodput: "
            "knowing compound stages are short, it ranks them lower by density",
        ),
    ]
    exp.details = {
        "service_gain_x_fcfs": gain,
        "goodput_x_fcfs": good,
        "throughput_x_sarathi": tput,
        "x_oracle": oracle,
        "rates": rates,
        "policies": policies,
    }
    return exp


# ---- JITServe ---------------------------------------------------------------------------------


def jitserve(grid: Grid, seeds: Sequence[int], quick: bool) -> Experiment:
    units, rates = (500, [5.0, 8.0]) if quick else (2000, [4.0, 5.0, 6.5, 8.0, 10.0])
    baselines = ["fcfs", "sarathi", "las", "sjf"]
    policies = baselines + ["gmax", "gmax_oracle"]
    scale = slo_scale()
    for seed in seeds:
        spec = _workload("azure-conv", "jitserve", units, seed, arrivals="trace")
        for rate in rates:
            for p in policies:
                # The paper's headline is token-level service goodput: GMAX maximises that here
                # (the server's default objective is request-level).
                params = (("objective", "tokens"),) if p.startswith("gmax") else ()
                grid.run(Config(p, "a100:1", policy=p, policy_params=params), spec, rate, scale)

    def mean(p: str, rate: float, metric: str) -> float:
        return grid.mean(p, "jitserve", rate, seeds, metric)

    per_base = {
        b: max(mean("gmax", r, "jitserve_tok_s") / max(mean(b, r, "jitserve_tok_s"), 1e-9) for r in rates)
        for b in baselines
    }
    req_base = {
        b: max(mean("gmax", r, "goodput_rps") / max(mean(b, r, "goodput_rps"), 1e-9) for r in rates) for b in baselines
    }
    gap = {
        r: 1 - mean("gmax", r, "jitserve_tok_s") / max(mean("gmax_oracle", r, "jitserve_tok_s"), 1e-9) for r in rates
    }
    tput = {r: mean("gmax", r, "throughput_tok_s") / max(mean("sarathi", r, "throughput_tok_s"), 1e-9) for r in rates}
    lo, hi = min(per_base.values()), max(per_base.values())
    exp = Experiment()
    exp.rows = [
        Row(
            "JITServe",
            "service (token) goodput vs baselines",
            "1.4–6.3×",
            f"{lo:.2f}–{hi:.2f}× (best load per baseline: "
            + ", ".join(f"{b} {v:.2f}" for b, v in per_base.items())
            + ")",
            f"{lo / 1.4:.2f}–{hi / 6.3:.2f}",
            "one A100 for the paper's 16; Azure chat lengths and a synthetic 1:1:1 draw for its four applications "
            "(deep research, code, math with long outputs); runs of minutes, not an hour; SJF stands in for LTR",
        ),
        Row(
            "JITServe",
            "request goodput vs baselines",
            "2.3–4.5× (vs LTR)",
            f"{min(req_base.values()):.2f}–{max(req_base.values()):.2f}×",
            "-",
            "as above",
        ),
        Row(
            "JITServe",
            "distance to its oracle",
            "3–9 %",
            _range([100 * g for g in gap.values()], "{:.1f}") + " %",
            "-",
            "the oracle sees the true lengths; ours bounds them with the server's default, trained:0.9 (quantiles of "
            "the answer's length given the prompt's, from the Azure conversation trace after the window replayed here)",
        ),
        Row(
            "JITServe",
            "throughput vs Sarathi-Serve",
            "96–98 %",
            _range([100 * t for t in tput.values()], "{:.0f}") + " %",
            "-",
            "makespan throughput of the same arrivals; GMAX pays only recomputation for its preemptions",
        ),
    ]
    exp.details = {
        "token_goodput_x_baseline": per_base,
        "request_goodput_x_baseline": req_base,
        "oracle_gap": gap,
        "throughput_x_sarathi": tput,
        "rates": rates,
    }
    return exp


# ---- SLOs-Serve -------------------------------------------------------------------------------

SLOS_SCENARIOS = {  # scenario: (trace, mix, arrivals)
    "chatbot": ("azure-conv", "slos-chatbot", "trace"),
    "coder": ("azure-code", "slos-coder", "trace"),
    "mixed": ("azure-conv", "slos-serve", "trace"),
}


def slos_serve(grid: Grid, seeds: Sequence[int], quick: bool) -> Experiment:
    units, probes = (400, 4) if quick else (1200, 8)
    systems = [
        Config("vllm", "a100:1", policy="fcfs"),
        Config("sarathi", "a100:1", policy="sarathi"),
        Config("slos", "a100:1", policy="slos"),
        Config("slos+spec", "a100:1", policy="slos", speculation="slo", spec_mixed=True),
    ]
    scale = slo_scale(1.0, "a100")  # TTFT as a slowdown over this card's own zero-load TTFT (Tab. 1)
    caps: dict[tuple[str, str], list[float]] = defaultdict(list)
    for scenario, (trace, mix, arrivals) in SLOS_SCENARIOS.items():
        for seed in seeds:
            spec = _workload(trace, mix, units, seed, arrivals=arrivals)
            for cfg in systems:
                result = search_capacity(
                    lambda r, cfg=cfg, spec=spec, scenario=scenario: grid.run(cfg, spec, r, scale, scenario)[
                        "attainment"
                    ],
                    start_rate=4.0,
                    target=TARGET,
                    max_probes=probes,
                    rel_tol=0.05,
                )
                caps[(scenario, cfg.label)].append(result.capacity_rate or 0.0)
    replicas: dict[str, list[float]] = defaultdict(list)
    if not quick:
        four = Config("slos x4", "a100:4", routing="slos", policy="slos", routing_params=(("order", "round_robin"),))
        trace, mix, arrivals = SLOS_SCENARIOS["chatbot"]
        for seed in seeds:
            spec = _workload(trace, mix, 4 * units, seed, arrivals=arrivals)
            result = search_capacity(
                lambda r, spec=spec: grid.run(four, spec, r, scale, "chatbot-x4")["attainment"],
                start_rate=16.0,
                target=TARGET,
                max_probes=probes,
                rel_tol=0.05,
            )
            replicas["x4"].append(result.capacity_rate or 0.0)

    def cap(scenario: str, label: str) -> float:
        return statistics.mean(caps[(scenario, label)])

    # a scenario where no baseline ever reaches 90 % has no finite ratio: left out of the geo-mean
    base = {s: max(cap(s, "vllm"), cap(s, "sarathi")) for s in SLOS_SCENARIOS}
    gains = {s: cap(s, "slos+spec") / base[s] for s in SLOS_SCENARIOS if base[s] > 0}
    gains_plain = {s: cap(s, "slos") / base[s] for s in SLOS_SCENARIOS if base[s] > 0}
    gains.update({s: math.inf for s in SLOS_SCENARIOS if base[s] <= 0})
    g = geomean([v for v in gains.values() if math.isfinite(v)])
    exp = Experiment()
    exp.rows = [
        Row(
            "SLOs-Serve",
            "capacity at 90 % attainment vs best of vLLM/Sarathi (geo-mean)",
            "2.2×",
            f"{g:.2f}× with speculation ("
            + ", ".join(f"{s} {v:.2f}" for s, v in gains.items())
            + f"); {geomean(list(gains_plain.values())):.2f}× without",
            _ratio(g, 2.2),
            "Llama-3-8B on our A100 profile for OPT-7B on A100-40GB; Azure lengths for ShareGPT/HumanEval; "
            "three of its six scenarios (no arXiv summaries, ToolBench or reasoning traces); its multi-replica "
            "router helps the paper's headline number, here one replica",
        ),
        Row(
            "SLOs-Serve",
            "Coder (bursty arrivals) capacity vs best baseline",
            "up to 2.1×",
            f"{gains['coder']:.2f}×",
            _ratio(gains["coder"] if math.isfinite(gains["coder"]) else None, 2.1),
            "Azure code arrivals and lengths, as the paper's Coder",
        ),
    ]
    if replicas:
        x4 = statistics.mean(replicas["x4"]) / max(cap("chatbot", "slos"), 1e-9)
        exp.rows.append(
            Row(
                "SLOs-Serve",
                "ChatBot capacity on 4 replicas / 1 replica",
                "4.61×",
                f"{x4:.2f}×",
                _ratio(x4, 4.61),
                "sequential SLO-driven routing over per-replica DP admission, round-robin first pick as in §6.2",
            )
        )
    exp.details = {
        "capacity_rps": {f"{s}/{c}": v for (s, c), v in caps.items()},
        "x_best_baseline": gains,
        "x_best_baseline_no_spec": gains_plain,
        "replicas": dict(replicas),
    }
    return exp


# ---- PolyServe --------------------------------------------------------------------------------


def _tier_mix(planned: Sequence[PlannedRequest], rate: float) -> list[TierMix]:
    by_tier: dict[float | None, list[PlannedRequest]] = defaultdict(list)
    for p in planned:
        by_tier[p.slo.get("tpot_ms")].append(p)
    n = len(planned)
    return [
        TierMix(
            tier_ms=t,
            rate_rps=rate * len(ps) / n,
            mean_input=statistics.mean(p.req.prompt_tokens for p in ps),
            mean_output=statistics.mean(p.req.output_tokens for p in ps),
            arrivals=len(ps),
            finished=len(ps),
        )
        for t, ps in by_tier.items()
    ]


def polyserve(grid: Grid, seeds: Sequence[int], quick: bool) -> Experiment:
    n = 8 if quick else 20
    units = 800 if quick else 3000
    factors = [0.6, 0.9, 1.1] if quick else [0.5, 0.7, 0.85, 1.0, 1.15]
    scale = slo_scale()
    h100 = card("h100")
    probe = plan(_workload("azure-conv", "polyserve", units, seeds[0]), 1.0, scale)
    sizing = pd_sizing(_tier_mix(probe, 1.0), h100.plan_with, kv_capacity_tokens=h100.kv_tokens)
    g_star = sizing["goodput_per_device_rps"]
    optimal = g_star * n
    split = split_devices(sizing, n)
    n_prefill = split["prefill"]
    pd_pool = f"h100:{n_prefill}:prefill,h100:{n - n_prefill}:decode"
    tiers = (("tiers_ms", [t for t, _ in POLYSERVE_TPOT_TIERS]),)
    levers = (("slo_levers", True),)
    systems = [
        Config("CO-PolyServe", f"h100:{n}", "polyserve", "edf", tiers, levers),
        Config("CO-Random", f"h100:{n}", "random", "sarathi"),
        Config("CO-Minimal", f"h100:{n}", "least_request", "sarathi"),
        Config("PD-PolyServe", pd_pool, "polyserve", "edf", tiers, levers),
        Config("PD-Random", pd_pool, "random", "fcfs"),
        Config("PD-Minimal", pd_pool, "least_request", "fcfs"),
        # the paper's simulator schedules on exact state; ours reads 0.25 s-old load reports
        Config("CO-PolyServe (10 ms reports)", f"h100:{n}", "polyserve", "edf", tiers, levers, report_s=0.01),
        Config("PD-PolyServe (10 ms reports)", pd_pool, "polyserve", "edf", tiers, levers, report_s=0.01),
    ]
    rates = [round(f * optimal, 2) for f in factors]
    for seed in seeds:
        spec = _workload("azure-conv", "polyserve", units, seed)
        for rate in rates:
            for cfg in systems:
                grid.run(cfg, spec, rate, scale)
    at90 = {
        cfg.label: crossing([(r, grid.mean(cfg.label, "polyserve", r, seeds, "attainment")) for r in rates])
        for cfg in systems
    }

    def best(prefix: str) -> float:
        return max((v or 0.0) for k, v in at90.items() if k.startswith(prefix) and "PolyServe" not in k)

    def tier_share(label: str) -> dict[float, float]:
        """Share of the label's placements that a TPOT tier decided (its own, a tighter one by lazy
        promotion, or one it scaled up), not the best-effort fallback; per rate over the seeds."""
        out = {}
        for r in rates:
            counts: defaultdict[str, int] = defaultdict(int)
            for s in seeds:
                for k, v in grid.results[(label, "polyserve", round(r, 6), s)]["reasons"].items():
                    counts[k] += v
            total = sum(counts.values())
            out[r] = sum(counts[k] for k in ("tier", "promoted", "scaled_up")) / total if total else 0.0
        return out

    fresh = " (10 ms reports)"
    pd_x = (at90["PD-PolyServe"] or 0.0) / max(best("PD-"), 1e-9)
    co_x = (at90["CO-PolyServe"] or 0.0) / max(best("CO-"), 1e-9)
    pd_fresh = (at90["PD-PolyServe" + fresh] or 0.0) / max(best("PD-"), 1e-9)
    co_fresh = (at90["CO-PolyServe" + fresh] or 0.0) / max(best("CO-"), 1e-9)
    of_opt = TARGET * (at90["PD-PolyServe"] or 0.0) / optimal
    why = (
        f"{n} H100s for the paper's 20 H200s; Azure conversation lengths only (one of its eight traces); "
        f"runs of {units} arrivals after no warm-up; capped at the highest rate tried ({rates[-1]:g}/s)"
    )
    exp = Experiment()
    exp.rows = [
        Row(
            "PolyServe",
            "PD goodput at 90 % attainment vs best PD baseline",
            "1.23×",
            f"{pd_x:.2f}× ({pd_fresh:.2f}× with 10 ms load reports)",
            _ratio(pd_x, 1.23),
            why + "; TTFT on the prefill pool decides attainment and every PD router shares the prefill "
            "chooser, while no router misses a TPOT tier on the decode pool (benchmarks/RESULTS.md)",
        ),
        Row(
            "PolyServe",
            "co-located goodput at 90 % attainment vs best baseline",
            "1.18×",
            f"{co_x:.2f}× ({co_fresh:.2f}× with 10 ms load reports)",
            _ratio(co_x, 1.18),
            why + "; the router places on load reports up to 0.25 s old, plus its own placements since",
        ),
        Row(
            "PolyServe",
            "PD goodput at 90 % attainment / optimal PD goodput",
            "92.5 %",
            f"{100 * of_opt:.1f} %",
            _ratio(of_opt, 0.925),
            f"optimal = SLOs-Serve App. A sizing of the mix on the H100 profile "
            f"({g_star:.2f} req/s per device, split {n_prefill} prefill : {n - n_prefill} decode)",
        ),
    ]
    exp.details = {
        "rate_at_90": at90,
        "rates": rates,
        "optimal_rps": optimal,
        "sizing": sizing,
        "pd_pool": pd_pool,
        "tier_share": {label: tier_share(label) for label in ("PD-PolyServe", "PD-PolyServe" + fresh)},
    }
    for label, shares in exp.details["tier_share"].items():
        grid.log(
            f"   {label}: decode placements a tier decided, per rate: "
            + ", ".join(f"{r:g}/s {v:.2f}" for r, v in shares.items())
        )
    return exp


# ---- GoodServe --------------------------------------------------------------------------------


def goodserve(grid: Grid, seeds: Sequence[int], quick: bool, scale_json: Sequence[Path] = ()) -> Experiment:
    units = 400 if quick else 1200
    rate = 1.0
    slo_scales = [1.0] if quick else [0.5, 1.0, 1.5]
    routers = ["goodserve", "round_robin", "random", "least_request", "lowest_tpm", "cache_aware", "llumnix_load"]
    pool = "h100:1,a100:1,a40:2"
    for number in slo_scales:
        scale = slo_scale(number, "a100")
        tag = f"goodserve@{number:g}"
        for seed in seeds:
            spec = _workload("mooncake-conversation", "goodserve", units, seed, arrivals="trace", max_prompt=16384)
            for r in routers:
                grid.run(Config(r, pool, routing=r), spec, rate, scale, tag)
    lead = {}
    for number in slo_scales:
        tag = f"goodserve@{number:g}"
        good = {r: grid.mean(r, tag, rate, seeds, "goodput_rps") for r in routers}
        second = max(v for k, v in good.items() if k != "goodserve")
        lead[number] = (good["goodserve"] / max(second, 1e-9) - 1.0, good)
    mid = lead[1.0][0]
    exp = Experiment()
    exp.rows = [
        Row(
            "GoodServe",
            "goodput over the second-best router (SLO scale 2)",
            "+27.4 %",
            f"{100 * mid:+.1f} % "
            "(mean relaxation 2; " + ", ".join(f"x{k:g}: {100 * v[0]:+.1f} %" for k, v in lead.items()) + ")",
            _ratio(1 + mid, 1.274),
            "H100/A100/2xA40 for H800/A800/A40/V100; Mooncake conversation lengths for "
            "BIRD/SWE-bench/LiveCodeBench; deadlines U(1,3) x solo on the A100 times the SLO scale; the router's "
            "history predictor for its MoE predictor",
        ),
    ]
    for path in scale_json:
        if path.is_file():
            s = json.loads(path.read_text())
            exp.rows.append(
                Row(
                    "GoodServe",
                    f"routing decision at {s['instances']} instances, {s['rate_rps']:g} req/s ({s['routing']})",
                    "5 ms",
                    f"{s['decision_us']['mean'] / 1000:.2f} ms mean, {s['decision_us']['p99'] / 1000:.2f} ms p99",
                    _ratio(s["decision_us"]["mean"] / 1000, 5.0),
                    "measured inside the scale run, one Python router "
                    "process on this 2-core machine; the paper's router batches its predictor on the instances",
                )
            )
    exp.details = {
        "lead_over_second": {str(k): v[0] for k, v in lead.items()},
        "goodput": {str(k): v[1] for k, v in lead.items()},
        "rate": rate,
        "pool": pool,
    }
    return exp


EXPERIMENTS: dict[str, Callable[..., Experiment]] = {
    "tempo": tempo,
    "jitserve": jitserve,
    "slos-serve": slos_serve,
    "polyserve": polyserve,
    "goodserve": goodserve,
}


def table(rows: Sequence[Row]) -> str:
    lines = [
        "| paper | claim | paper's figure | ours (simulated) | ours / paper | why they differ |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {r.paper} | {r.claim} | {r.paper_value} | {r.ours_text} | {r.ratio} | {r.why} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = doc_parser("python -m benchmarks.experiments.headline", __doc__)
    p.add_argument("--only", default=",".join(EXPERIMENTS), help="comma list of experiments")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--quick", action="store_true", help="small runs (a smoke test, not the numbers)")
    p.add_argument("--scale-json", action="append", default=[], type=Path, help="scale-run summaries to include")
    p.add_argument("--out", type=Path, default=Path("results/headline"))
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    grid = Grid(lambda line: print(line, flush=True))
    rows: list[Row] = []
    for name in [n.strip() for n in args.only.split(",") if n.strip()]:
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        before = set(grid.results)
        fn = EXPERIMENTS[name]
        exp = fn(grid, seeds, args.quick, args.scale_json) if name == "goodserve" else fn(grid, seeds, args.quick)
        exp.wall_s = time.perf_counter() - t0
        rows += exp.rows
        body = {
            "rows": [asdict(r) for r in exp.rows],
            "details": exp.details,
            "seeds": seeds,
            "wall_s": exp.wall_s,
            "runs": {"|".join(map(str, k)): v for k, v in grid.results.items() if k not in before},
        }
        (args.out / f"{name}.json").write_text(json.dumps(body, indent=1, default=str) + "\n")
        print(table(exp.rows) + f"\n({exp.wall_s:.0f} s)\n", flush=True)
    (args.out / "headline.md").write_text(table(rows) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
