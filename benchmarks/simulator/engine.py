"""The goodput benchmark's workloads on the virtual-time simulator, scored like live runs.

The same planned requests a live run sends (trace, mix, rate, seed) go to
`scheduler.core.sim.Simulator`, which runs the very policy objects the server runs through the
same plan path, on a GPU+model profile's step times (the table the emulator paces with; the
policies plan with the profile's roofline, as the server's do). Compound stages arrive
think time after their parents finish, as the load generator sends them. The records come back
as the load generator's `RequestRecord`s, so `metrics.score` scores both the same way.

It is an instrument for ranking policies at scales and sweeps a 2-core machine cannot run live;
where a simulated and an emulated run disagree, the emulated one (real SGLang) is the truth.

  .venv/bin/python -m benchmarks.simulator.engine --gpu h100 --mix tempo --rates 2,4,8 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from benchmarks.cli import policy_overrides
from benchmarks.goodput.mixes import MIXES
from benchmarks.goodput.records import PlannedRequest, RequestRecord
from benchmarks.goodput.scoring import RunMetrics, score
from benchmarks.goodput.workload import WorkloadSpec
from benchmarks.simulator.card import Card
from benchmarks.simulator.client import planned_workload, sim_requests, to_record
from scheduler.core.analyzer.spec import DEFAULT_LENGTH_PREDICTOR, live_length_bounds
from scheduler.core.compound import CompoundDeadlines
from scheduler.core.plan_path import settings_for
from scheduler.core.policies import POLICIES, make_policy
from scheduler.core.sim import EngineConfig, Simulator


def simulate(
    planned: Sequence[PlannedRequest],
    policy: str,
    card: Card,
    *,
    mixed: bool = True,
    stock_fcfs: bool = True,
    max_running: int = 256,
    chunk: int = 8192,
    horizon_s: float | None = None,
    overlap: bool = True,
    length_predictor: str | None = DEFAULT_LENGTH_PREDICTOR,
    policy_params: Mapping[str, Mapping[str, Any]] | None = None,
    program_idle_s: float | None = None,
) -> list[RequestRecord]:
    """One policy over one planned workload on one card. fcfs is stock SGLang: no levers, and
    separate prefill steps (SGLang's default) unless `stock_fcfs` is False; `overlap` is
    SGLang's overlap schedule (its GPU default: see scheduler.core.sim_engine); `length_predictor`
    is the server's --slo-length-predictor (a fresh one per run, as a freshly started server);
    `policy_params` the server's --slo-policy-param, per policy; `program_idle_s`, when given,
    runs the server's compound stage sub-deadlines (`CompoundDeadlines`: a program joins the
    pattern library after that many card-seconds idle; the server's 60 s are real seconds,
    so 60 / its --emulate-slowdown card-seconds). Off by default: the tables were made without."""
    if policy == "fcfs" and stock_fcfs:
        mixed = False
    engine_policy = make_policy(policy, card.plan_with, **(policy_params or {}).get(policy, {}))
    sim = Simulator(
        engine_policy,
        card.pace,
        EngineConfig(
            max_running_requests=max_running, chunk_size=chunk, total_kv_tokens=card.kv_tokens, overlap=overlap
        ),
        settings=settings_for(engine_policy, mixed_batching=mixed),
        plan_perf=card.plan_with,
        lengths=live_length_bounds(length_predictor),
        compound=None if program_idle_s is None else CompoundDeadlines(idle_s=program_idle_s),
    )
    reqs = sim_requests(planned)
    last = max((r.arrival for r in reqs), default=0.0)
    result = sim.run(reqs, until=None if horizon_s is None else last + horizon_s)
    starts = {rid: rec.req.arrival for rid, rec in result.records.items()}
    program_starts: dict[str, float] = {}
    for p in planned:
        pid = p.req.program_id
        if pid is not None and p.req.rid in starts:
            program_starts[pid] = min(program_starts.get(pid, starts[p.req.rid]), starts[p.req.rid])
    return [to_record(p, result.records.get(p.req.rid), program_starts) for p in planned]


def run_point(
    spec: WorkloadSpec, rate: float, policies: Sequence[str], card: Card, **engine: object
) -> dict[str, RunMetrics]:
    """Every policy on the same planned workload; goodput is per offered second."""
    planned = planned_workload(spec, rate, card)
    arrivals = [p.req.arrival_s for p in planned]
    window = max(arrivals) - min(arrivals) if len(arrivals) > 1 else None
    return {name: score(simulate(planned, name, card, **engine), duration_s=window) for name in policies}  # type: ignore[arg-type]


def add_workload_args(ap: argparse.ArgumentParser, units: int, rates: str) -> None:
    """The flags that pick a planned workload and the card it runs on (shared with the ceiling
    estimate, which must see the same requests)."""
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--mix", default="tempo", choices=sorted(MIXES))
    ap.add_argument("--trace", default="azure-conv")
    ap.add_argument("--units", type=int, default=units)
    ap.add_argument("--rates", default=rates, help="arrival units per second, comma-separated")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--max-running", type=int, default=256)
    ap.add_argument("--max-prompt", type=int, default=4096)
    ap.add_argument("--max-output", type=int, default=1024)
    ap.add_argument("--json", action="store_true")
    ap.set_defaults(arrivals="poisson", length_scale=1.0)  # not flags here: Poisson at each --rates, trace lengths


def workload_spec(args: argparse.Namespace, seed: int) -> WorkloadSpec:
    """The workload `add_workload_args`' flags describe, for one seed (Poisson arrivals)."""
    return WorkloadSpec.from_flags(args, seed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_args(ap, units=300, rates="2,4,8")
    ap.add_argument("--policies", default=",".join(n for n in POLICIES if not n.endswith("_oracle")))
    ap.add_argument("--batching", choices=["mixed", "separate"], default="mixed")
    ap.add_argument("--fcfs-batching", choices=["stock", "same"], default="stock", help="stock: separate steps")
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument(
        "--length-predictor",
        default=DEFAULT_LENGTH_PREDICTOR,
        help="the server's --slo-length-predictor (trained[:Q], history[:Q], none, a table or an artifact)",
    )
    ap.add_argument(
        "--policy-param",
        action="append",
        default=[],
        metavar="POLICY:KEY=VALUE",
        help="a policy parameter, as the server's --slo-policy-param (repeatable)",
    )
    ap.add_argument(
        "--stage-deadlines",
        type=float,
        default=None,
        metavar="IDLE_S",
        help="run the server's compound stage sub-deadlines, a program joining the pattern library "
        "after IDLE_S card-seconds idle (the server's 60 real s: 60 / its --emulate-slowdown)",
    )
    args = ap.parse_args(argv)
    overrides = policy_overrides(args.policy_param, POLICIES)
    card = Card.load(args.gpu)
    policies = [p for p in args.policies.split(",") if p]
    rows: dict[tuple[float, str], list[RunMetrics]] = {}
    for seed in [int(s) for s in args.seeds.split(",")]:
        spec = workload_spec(args, seed)
        for rate in [float(r) for r in args.rates.split(",")]:
            results = run_point(
                spec,
                rate,
                policies,
                card,
                mixed=args.batching == "mixed",
                stock_fcfs=args.fcfs_batching == "stock",
                max_running=args.max_running,
                chunk=args.chunk,
                length_predictor=args.length_predictor,
                policy_params=overrides,
                program_idle_s=args.stage_deadlines,
            )
            for name, m in results.items():
                rows.setdefault((rate, name), []).append(m)
    summary = []
    for (rate, name), runs in sorted(rows.items()):
        ratio = goodput_ratios(runs, rows.get((rate, "fcfs")) or runs)
        ordering = [rows[(rate, b)] for b in ORDERING_BASELINES if (rate, b) in rows]
        best_base = [max(seed, key=lambda m: m.goodput_rps or 0.0) for seed in zip(*ordering, strict=True)]
        vs_best = goodput_ratios(runs, best_base) if best_base and name not in ORDERING_BASELINES + ("fcfs",) else None
        summary.append(
            {
                "rate": rate,
                "policy": name,
                "attainment": statistics.mean(m.attainment for m in runs),
                "attainment_min": min(m.attainment for m in runs),
                "attainment_max": max(m.attainment for m in runs),
                "goodput_rps": statistics.mean(m.goodput_rps or 0.0 for m in runs),
                "x_fcfs": statistics.mean(ratio),
                "x_fcfs_min": min(ratio),
                "x_fcfs_max": max(ratio),
                "x_best_ordering": None if vs_best is None else statistics.mean(vs_best),
                "x_best_ordering_min": None if vs_best is None else min(vs_best),
                "x_best_ordering_max": None if vs_best is None else max(vs_best),
                "by_class": {k: round(v, 3) for k, v in runs[0].attainment_by_class.items()},
                # at light load every request is served: latency, not tokens, shows a slower engine
                "tpot_p50_ms": _mean_of(m.tpot_ms.get("p50") for m in runs),
                "e2e_p50_ms": _mean_of(m.e2e_ms.get("p50") for m in runs),
            }
        )
    if args.json:
        json.dump(summary, sys.stdout, indent=1)
        return 0
    print(f"{card.name} {args.batching} mix={args.mix} units={args.units} seeds={args.seeds}")
    print(
        f"{'rate':>6} {'policy':<14} {'attain':>7} {'(min-max)':>13} {'goodput':>8} {'x fcfs':>7} {'(min-max)':>13}"
        f" {'x best ordering':>15} {'(min-max)':>13}"
    )
    for row in summary:
        vs = row["x_best_ordering"]
        best = "" if vs is None else f"{vs:>7.2f} ({row['x_best_ordering_min']:.2f}-{row['x_best_ordering_max']:.2f})"
        print(
            f"{row['rate']:>6.2f} {row['policy']:<14} {row['attainment']:>7.3f} "
            f"({row['attainment_min']:.2f}-{row['attainment_max']:.2f}) {row['goodput_rps']:>8.3f} "
            f"{row['x_fcfs']:>7.2f} ({row['x_fcfs_min']:.2f}-{row['x_fcfs_max']:.2f}) {best:>29}  {row['by_class']}"
        )
    return 0


ORDERING_BASELINES = ("edf", "sjf", "las", "sarathi")  # the "best ordering baseline"


def _mean_of(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.mean(present) if present else None


def goodput_ratios(runs: Sequence[RunMetrics], base: Sequence[RunMetrics]) -> list[float]:
    """Goodput over the same seed's baseline, per seed (a baseline that attained nothing has
    no ratio; nan when none has one)."""
    out = [(m.goodput_rps or 0.0) / b.goodput_rps for m, b in zip(runs, base, strict=False) if b.goodput_rps]
    return out or [float("nan")]


if __name__ == "__main__":
    raise SystemExit(main())
