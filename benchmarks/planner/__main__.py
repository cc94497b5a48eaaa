r"""Capacity planning: the cheapest pool of GPUs that serves a workload at a target SLO attainment.

Give the workload (a trace, an SLO mix, the load in requests/s), the candidate GPU types with
their prices, and the attainment you need. Every candidate pool is simulated with the cluster
simulator (benchmarks/simulator: the server's own engine and routing policies on the shipped GPU
profiles), and the cheapest one that meets the target is printed with its simulated attainment
and goodput per class; cost_vs_attainment.png plots every pool tried.

The search: for each GPU type alone, the fewest cards that meet the target (doubling, then
bisection; attainment grows with cards); then mixed pools of two types, trading the pricier
type's cards for the cheaper one's along the frontier; with --pd, disaggregated pools of each
type split by the mix's prefill:decode sizing (SLOs-Serve App. A). With --speculation none,slo the
whole search runs once per setting (decode engines draft; a PD pool's prefill engines never do),
so the plan says whether speculative decoding buys a cheaper pool for this traffic. Each verdict
is the mean over --seeds; simulated, so a plan is a starting point to confirm on real hardware.

  python -m benchmarks.planner --trace azure-conv --mix polyserve --rate 60 --gpus h100,a100,a40 --target 0.9
  python -m benchmarks.planner --mix slos-chatbot --rate 20 --gpus h100=4.0,a40=1.1 --pd --seeds 0,1
  python -m benchmarks.planner --mix slos-chat-tight10 --slo-relative-to h100 --rate 5 --gpus h100 \
      --speculation none,slo --spec-layout decode-only --spec-alpha 0.8 --policy edf
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.cli import doc_parser
from benchmarks.goodput.mixes import MIXES
from benchmarks.goodput.workload import WorkloadSpec, plan
from benchmarks.simulator.cluster import ClusterConfig
from benchmarks.simulator.pool import PoolSpec, card, parse_prices
from benchmarks.simulator.runner import Run, simulate, slo_scale
from benchmarks.simulator.speculative_decoding import add_speculation_flags
from benchmarks.simulator.worker import EngineOptions
from benchmarks.workloads.traces import TRACES
from router.pd_sizing import TierMix, pd_sizing, split_devices

PLATEAU = 0.01  # attainment two doublings of a pool must add before the search gives up


@dataclass
class Verdict:
    pool: str
    cost_per_hour: float
    attainment: float
    goodput_rps: float
    by_class: dict[str, float]
    seeds: int
    speculation: str = "none"

    @property
    def label(self) -> str:
        return verdict_label(self.pool, self.speculation)

    def meets(self, target: float) -> bool:
        return self.attainment >= target


def verdict_label(pool: str, speculation: str) -> str:
    return pool if speculation == "none" else f"{pool} +spec {speculation}"


@dataclass
class Planner:
    args: argparse.Namespace
    prices: dict[str, float]
    tried: dict[str, Verdict] = field(default_factory=dict)

    def evaluate(self, pool: str, speculation: str = "none") -> Verdict:
        """Simulate `pool` with `speculation` on the workload (mean over seeds); each once."""
        key = verdict_label(pool, speculation)
        if key in self.tried:
            return self.tried[key]
        a = self.args
        spec_pool = PoolSpec.parse(pool, a.model)
        runs = []
        for seed in a.seed_list:
            workload = WorkloadSpec.from_flags(a, seed, cycle=True)
            scale = slo_scale(a.slo_scale, a.slo_relative_to, a.model)
            config = ClusterConfig(
                pool=spec_pool,
                engine=EngineOptions(policy=a.policy),
                routing=a.routing,
                seed=seed,
                stream_scores=True,
                speculation=None if speculation == "none" else speculation,
                spec_alpha=a.spec_alpha,
                draft_ratio=a.draft_ratio,
                spec_layout=a.spec_layout,
            )
            body, _ = simulate(Run(pool, workload, a.rate, scale, config), plan(workload, a.rate, scale))
            runs.append(body["metrics"])
        classes = sorted({c for m in runs for c in m.attainment_by_class})
        verdict = Verdict(
            pool=pool,
            cost_per_hour=spec_pool.cost_per_hour(self.prices),
            attainment=statistics.mean(m.attainment for m in runs),
            goodput_rps=statistics.mean(m.goodput_rps or 0.0 for m in runs),
            by_class={c: statistics.mean(m.attainment_by_class.get(c, 0.0) for m in runs) for c in classes},
            seeds=len(runs),
            speculation=speculation,
        )
        self.tried[key] = verdict
        mark = "meets" if verdict.meets(a.target) else "misses"
        print(f"   {key:<40} ${verdict.cost_per_hour:7.2f}/h  attainment {verdict.attainment:.3f} ({mark})", flush=True)
        return verdict

    def fewest(self, pool_of: Any, start: int = 1, limit: int = 1024, speculation: str = "none") -> int | None:
        """Smallest n in [start, limit] whose pool_of(n) meets the target (doubling, then
        bisection); None past `limit`, or once two doublings in a row gained under a point of
        attainment (a target these cards cannot reach, e.g. a TPOT below their fastest step)."""
        target = self.args.target
        lo, n = start - 1, start  # lo: a count known to miss (or below the range)
        history: list[float] = []
        while n <= limit:
            verdict = self.evaluate(pool_of(n), speculation)
            if verdict.meets(target):
                break
            history.append(verdict.attainment)
            if len(history) >= 3 and history[-1] - history[-3] < PLATEAU:
                return None
            lo, n = n, n * 2
        if n > limit:
            return None
        while n - lo > 1:
            mid = (lo + n) // 2
            if self.evaluate(pool_of(mid), speculation).meets(target):
                n = mid
            else:
                lo = mid
        return n


def pd_split(args: argparse.Namespace, gpu: str) -> float:
    """The prefill share of devices the mix wants on `gpu` (App. A sizing of the planned mix)."""
    planned = plan(
        WorkloadSpec(trace=args.trace, units=args.units, mix=args.mix, seed=args.seed_list[0], cycle=True,
                     max_prompt=args.max_prompt, max_output=args.max_output, length_scale=args.length_scale),
        args.rate, slo_scale(args.slo_scale, args.slo_relative_to, args.model),
    )  # fmt: skip
    groups: dict[float | None, list[Any]] = {}
    for p in planned:
        groups.setdefault(p.slo.get("tpot_ms"), []).append(p)
    mix = [
        TierMix(t, args.rate * len(ps) / len(planned), statistics.mean(p.req.prompt_tokens for p in ps),
                statistics.mean(p.req.output_tokens for p in ps), len(ps), len(ps))
        for t, ps in groups.items()
    ]  # fmt: skip
    c = card(gpu, args.model)
    sizing = pd_sizing(mix, c.plan_with, kv_capacity_tokens=c.kv_tokens)
    split = split_devices(sizing, 100)
    return split["prefill"] / 100.0


def search(planner: Planner, gpus: list[str]) -> list[Verdict]:
    """Under each speculation setting: the homogeneous frontier, then two-type trades along it,
    then PD pools; the verdicts that met."""
    args = planner.args
    for speculation in args.speculation:
        search_setting(planner, gpus, speculation)
    return [v for v in planner.tried.values() if v.meets(args.target)]


def search_setting(planner: Planner, gpus: list[str], speculation: str) -> None:
    args = planner.args
    alone: dict[str, int] = {}
    for gpu in gpus:
        n = planner.fewest(lambda k, gpu=gpu: f"{gpu}:{k}", limit=args.max_gpus, speculation=speculation)
        if n is not None:
            alone[gpu] = n
    by_price = sorted(gpus, key=lambda g: planner.prices[g], reverse=True)
    for i, dear in enumerate(by_price):
        for cheap in by_price[i + 1 :]:
            if dear not in alone or cheap not in alone:
                continue
            # keep k of the pricier cards, find the fewest cheap ones that still meet the target
            for k in range(alone[dear] - 1, 0, -1):

                def mixed(m: int, k: int = k, dear: str = dear, cheap: str = cheap) -> str:
                    return f"{dear}:{k},{cheap}:{m}"

                if planner.fewest(mixed, start=1, limit=alone[cheap], speculation=speculation) is None:
                    break
    if args.pd:
        for gpu in gpus:
            share = pd_split(args, gpu)

            def pd_pool(total: int, gpu: str = gpu, share: float = share) -> str:
                total = max(total, 2)
                p = min(max(1, round(share * total)), total - 1)
                return f"{gpu}:{p}:prefill,{gpu}:{total - p}:decode"

            planner.fewest(pd_pool, start=2, limit=args.max_gpus, speculation=speculation)


def cheapest(verdicts: list[Verdict]) -> Verdict | None:
    """The lowest cost per hour; of equal costs the higher attainment, then no speculation (the
    settings' order as given)."""
    return min(verdicts, key=lambda v: (v.cost_per_hour, -v.attainment), default=None)


def cheapest_by_setting(met: list[Verdict], settings: list[str]) -> dict[str, Verdict | None]:
    return {s: cheapest([v for v in met if v.speculation == s]) for s in settings}


def plot(path: Path, verdicts: list[Verdict], best: Verdict | None, target: float) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    markers = dict(zip(dict.fromkeys(v.speculation for v in verdicts), "o^sDv<>"))
    for v in verdicts:
        color = "tab:green" if v.attainment >= target else "tab:gray"
        ax.scatter(v.cost_per_hour, v.attainment, color=color, marker=markers.get(v.speculation, "o"), s=18)
    if len(markers) > 1:  # one legend entry per speculation setting
        for mode, marker in markers.items():
            ax.scatter([], [], color="tab:gray", marker=marker, s=18, label=f"speculation {mode}")
    if best is not None:
        ax.scatter(best.cost_per_hour, best.attainment, color="tab:red", s=60, label=f"cheapest: {best.label}")
    if best is not None or len(markers) > 1:
        ax.legend(loc="lower right", fontsize=8)
    ax.axhline(target, color="tab:red", linestyle=":", linewidth=1)
    ax.set(xlabel="pool cost (USD per hour)", ylabel="simulated SLO attainment", title="Cost vs attainment")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser("python -m benchmarks.planner", __doc__)
    w = p.add_argument_group("workload")
    w.add_argument("--trace", default="azure-conv", choices=sorted(TRACES))
    w.add_argument("--mix", default="tempo", choices=sorted(MIXES))
    w.add_argument("--rate", type=float, required=True, help="the load to serve, requests (units) per second")
    w.add_argument("--units", type=int, help="requests simulated per verdict (default: 60 s of the load)")
    w.add_argument("--arrivals", choices=("trace", "poisson"), default="poisson")
    w.add_argument("--length-scale", type=float, default=1.0)
    w.add_argument("--max-prompt", type=int, default=8192)
    w.add_argument("--max-output", type=int, default=2048)
    w.add_argument("--slo-scale", type=float, default=1.0)
    w.add_argument("--slo-relative-to", help="rescale the mix's targets to this card's zero-load speed")
    w.add_argument("--seeds", default="0")
    g = p.add_argument_group("pools")
    g.add_argument("--gpus", default="h100,a100,a40", help="candidate types, optionally with prices: h100=4.0,a40")
    g.add_argument("--prices", help="USD per GPU-hour, e.g. h100=3.5,a100=2.2 (defaults are illustrative)")
    g.add_argument("--model", default="llama3-8b")
    g.add_argument("--target", type=float, default=0.9, help="SLO attainment to meet")
    g.add_argument("--pd", action="store_true", help="also try prefill-decode disaggregated pools")
    g.add_argument("--max-gpus", type=int, default=256)
    g.add_argument("--routing", default="least_request")
    g.add_argument("--policy", default="slos", help="every engine's SLO policy")
    add_speculation_flags(p.add_argument_group("speculative decoding"), several=True)
    p.add_argument("--out", type=Path, default=Path("results/plan"))
    args = p.parse_args(argv)
    args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()]
    args.units = args.units or max(200, int(60 * args.rate))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    given = {}
    gpus = []
    for item in (x.strip() for x in args.gpus.split(",")):
        if item:
            gpu, sep, price = item.partition("=")
            gpus.append(gpu.lower())
            if sep:
                given[gpu.lower()] = float(price)
    prices = {**parse_prices(args.prices), **given}
    planner = Planner(args, prices)
    print(f"workload: {args.trace}, mix {args.mix}, {args.rate:g} req/s; target attainment {args.target:g}", flush=True)
    met = search(planner, gpus)
    best = cheapest(met)
    args.out.mkdir(parents=True, exist_ok=True)
    verdicts = sorted(planner.tried.values(), key=lambda v: v.cost_per_hour)
    plot(args.out / "cost_vs_attainment.png", verdicts, best, args.target)
    (args.out / "plan.json").write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "prices": prices,
                    "best": None if best is None else best.__dict__, "tried": [v.__dict__ for v in verdicts]}, indent=1)
    )  # fmt: skip
    if best is None:
        print(f"\nno pool up to {args.max_gpus} cards per type met {args.target:g}; see {args.out}")
        return 1
    print(f"\ncheapest pool meeting {args.target:g}: {best.label}  (${best.cost_per_hour:.2f}/h)")
    print(f"  simulated attainment {best.attainment:.3f}, goodput {best.goodput_rps:.2f} req/s")
    for cls, att in best.by_class.items():
        print(f"  {cls:<10} attainment {att:.3f}")
    if len(args.speculation) > 1:
        for speculation, v in cheapest_by_setting(met, args.speculation).items():
            found = "none met the target" if v is None else f"{v.pool} (${v.cost_per_hour:.2f}/h)"
            print(f"  speculation {speculation:<10} cheapest: {found}")
    print(f"pools tried: {len(verdicts)}; plot: {args.out / 'cost_vs_attainment.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
