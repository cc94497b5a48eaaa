"""Simulate a pool of GPUs behind the router: every routing and engine policy as the server runs it.

The live benchmarks' workloads (trace, SLO mix, rate, seed) go to a simulated pool: N engines
of the shipped GPU profiles (mixed types, co-located or PD), each running the server's engine
policy on the one plan path, behind the router's own routing policy, which reads the workers'
load reports as the live router does. One run per seed x rate x routing policy x engine policy;
results.json, results.md and plots in --out, in the live benchmarks' format.

  python -m benchmarks.simulator --pool h100:4,a40:4 --routing goodserve,least_request --mix goodserve \\
      --slo-relative-to a100 --rates 20,40 --seeds 0,1,2 --out results/cluster
  python -m benchmarks.simulator --pool h100:2:prefill,h100:6:decode --routing polyserve --policy slos \\
      --mix polyserve --rates 60
  python -m benchmarks.simulator --pool h100:1 --policy slos --mix slos-chatbot --speculation slo --rates 10

A simulated run is an instrument for scales and sweeps no machine here runs live; where it and
an emulated run disagree, the emulated one (real SGLang) is the truth (benchmarks/experiments/
simulator_validation.py compares them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.cli import doc_parser
from benchmarks.goodput.mixes import MIXES
from benchmarks.goodput.report import describe, markdown_table, plot, write_results
from benchmarks.goodput.scoring import check_consistency
from benchmarks.goodput.workload import WorkloadSpec, plan
from benchmarks.simulator.cluster import ClusterConfig
from benchmarks.simulator.pool import PoolSpec
from benchmarks.simulator.runner import Run, simulate, slo_scale
from benchmarks.simulator.speculative_decoding import add_speculation_flags
from benchmarks.simulator.worker import EngineOptions
from benchmarks.workloads.lengths import LENGTH_SOURCES
from benchmarks.workloads.traces import TRACES
from router.pd import PREFILL_PLACEMENTS, SPREAD
from router.policies import ROUTING_POLICIES
from scheduler.core.analyzer.spec import DEFAULT_LENGTH_PREDICTOR
from server.agent_load import REPORT_S


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser("python -m benchmarks.simulator", __doc__)
    c = p.add_argument_group("cluster")
    c.add_argument("--pool", default="h100:4", help="gpu:count[:role],..: h100:2,a40:4, h100:1:prefill,h100:3:decode")
    c.add_argument("--model", default="llama3-8b")
    c.add_argument("--routing", default="least_request", help=f"comma list of {', '.join(ROUTING_POLICIES.names())}")
    c.add_argument("--routing-param", action="append", default=[], metavar="NAME=VALUE", help="routing parameter")
    c.add_argument("--policy", default="fcfs", help="engine policies: fcfs, sarathi, edf, tempo, gmax, slos, ...")
    c.add_argument("--policy-param", action="append", default=[], metavar="NAME=VALUE", help="engine policy parameter")
    c.add_argument("--max-running", type=int, default=256)
    c.add_argument("--chunk", type=int, help="chunked prefill size (default: SGLang's for the card's memory)")
    c.add_argument("--batching", choices=["mixed", "separate"], default="mixed")
    c.add_argument("--fcfs-batching", choices=["stock", "same"], default="stock", help="stock: separate steps")
    c.add_argument(
        "--length-predictor", default=DEFAULT_LENGTH_PREDICTOR, help="the router's --length-predictor (none: off)"
    )
    c.add_argument("--migrate-interval-s", type=float, default=0.1, help="0: never ask for migrations")
    c.add_argument("--report-s", type=float, default=REPORT_S, help="the worker agents' load-report period")
    c.add_argument(
        "--pd-prefill-placement", choices=PREFILL_PLACEMENTS, default=SPREAD, help="the router's --pd-prefill-placement"
    )
    c.add_argument("--kv-link-gb-s", type=float, default=50.0, help="PD KV transfer bandwidth per pair")
    c.add_argument("--kv-latency-ms", type=float, default=1.0)
    add_speculation_flags(c)
    c.add_argument("--no-prefix-cache", action="store_true")
    c.add_argument("--no-overlap", action="store_true", help="engines without SGLang's overlap schedule")
    c.add_argument("--host-latency-ms", type=float, default=0.0, help="client send to engine queue (real time)")
    w = p.add_argument_group("workload")
    w.add_argument("--trace", default="azure-conv", choices=sorted(TRACES))
    w.add_argument("--lengths", choices=sorted(LENGTH_SOURCES), help="lengths from this source, not the trace's")
    w.add_argument("--data-dir")
    w.add_argument("--units", type=int, default=1000, help="arrival units per run")
    w.add_argument("--cycle", action="store_true", help="repeat the trace when it has fewer units")
    w.add_argument("--arrivals", choices=("trace", "poisson"), default="poisson")
    w.add_argument("--rates", default="10", help="comma-separated units/s")
    w.add_argument("--length-scale", type=float, default=1.0)
    w.add_argument("--max-prompt", type=int, default=8192)
    w.add_argument("--max-output", type=int, default=2048)
    w.add_argument("--mix", default="tempo", choices=sorted(MIXES))
    w.add_argument("--slo-scale", type=float, default=1.0, help="every target times this")
    w.add_argument("--slo-relative-to", help="rescale the targets to this card's zero-load speed (goodserve: a100)")
    w.add_argument("--seeds", default="0", help="comma-separated seeds (workload draw and every seeded policy)")
    r = p.add_argument_group("run")
    r.add_argument("--horizon-s", type=float, help="stop this long after the last arrival (default: drain)")
    r.add_argument("--stream-scores", action="store_true", help="keep no token times (long runs: no timeline)")
    r.add_argument("--out", type=Path, default=Path("results/cluster"))
    r.add_argument("--no-plots", action="store_true")
    r.add_argument("--no-records", action="store_true", help="leave per-request records out of results.json")
    args = p.parse_args(argv)
    args.routing_list, args.policy_list = _csv(args.routing), _csv(args.policy)
    args.rate_list = [float(x) for x in _csv(args.rates)]
    args.seed_list = [int(x) for x in _csv(args.seeds)]
    return args


def _params(items: list[str]) -> tuple[tuple[str, Any], ...]:
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"parameter {item!r}: expected NAME=VALUE")
        out.append((name.strip(), _value(value.strip())))
    return tuple(out)


def cluster_config(args: argparse.Namespace, routing: str, policy: str, seed: int) -> ClusterConfig:
    routing_params = dict(_params(args.routing_param))
    if routing in ("random", "power_of_two", "jit"):
        routing_params.setdefault("seed", seed)
    return ClusterConfig(
        pool=PoolSpec.parse(args.pool, args.model),
        engine=EngineOptions(
            policy=policy,
            policy_params=_params(args.policy_param),
            max_running=args.max_running,
            chunk=args.chunk,
            mixed=args.batching == "mixed",
            stock_fcfs=args.fcfs_batching == "stock",
            overlap=not args.no_overlap,
        ),
        host_latency_s=args.host_latency_ms / 1000.0,
        routing=routing,
        routing_params=tuple(routing_params.items()),
        length_predictor=None if args.length_predictor == "none" else args.length_predictor,
        migrate_interval_s=args.migrate_interval_s or None,
        report_s=args.report_s,
        prefill_placement=args.pd_prefill_placement,
        kv_link_gb_s=args.kv_link_gb_s,
        kv_latency_s=args.kv_latency_ms / 1000.0,
        speculation=None if args.speculation == "none" else args.speculation,
        spec_alpha=args.spec_alpha,
        draft_ratio=args.draft_ratio,
        spec_layout=args.spec_layout,
        prefix_cache=not args.no_prefix_cache,
        seed=seed,
        horizon_s=args.horizon_s,
        stream_scores=args.stream_scores,
    )


def workload_spec(args: argparse.Namespace, seed: int) -> WorkloadSpec:
    return WorkloadSpec.from_flags(args, seed, data_dir=args.data_dir, cycle=args.cycle, lengths=args.lengths)


def summary(runs: list[dict[str, Any]]) -> str:
    """Mean (min-max) over seeds per label and rate."""
    groups: dict[tuple[str, float | None], list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        groups[(run["label"], run["rate"])].append(run)
    lines = [
        "| label | rate | seeds | attainment | goodput req/s | TTFT p90 ms | TPOT p90 ms | decision µs (mean) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (label, rate), mine in sorted(groups.items(), key=lambda kv: (kv[0][1] or 0, kv[0][0])):
        att = [r["metrics"].attainment for r in mine]
        gp = [r["metrics"].goodput_rps or 0.0 for r in mine]
        ttft = [r["metrics"].ttft_ms["p90"] or 0.0 for r in mine]
        tpot = [r["metrics"].tpot_ms["p90"] or 0.0 for r in mine]
        dec = [r["config"]["sim"]["decision_us"]["mean"] or 0.0 for r in mine]
        lines.append(
            f"| {label} | {rate:g} | {len(mine)} | {statistics.mean(att):.3f} ({min(att):.3f}-{max(att):.3f}) | "
            f"{statistics.mean(gp):.2f} ({min(gp):.2f}-{max(gp):.2f}) | {statistics.mean(ttft):.0f} | "
            f"{statistics.mean(tpot):.1f} | {statistics.mean(dec):.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs: list[dict[str, Any]] = []
    for seed in args.seed_list:
        spec = workload_spec(args, seed)
        scale = slo_scale(args.slo_scale, args.slo_relative_to, args.model)
        for rate in args.rate_list:
            planned = plan(spec, rate, scale)
            for routing in args.routing_list:
                for policy in args.policy_list:
                    label = routing if len(args.policy_list) == 1 else f"{routing}/{policy}"
                    run = Run(label, spec, rate, scale, cluster_config(args, routing, policy, seed))
                    body, result = simulate(run, planned)
                    runs.append(body)
                    us = result.decision_us()
                    print(
                        describe(body) + f"  [seed {seed}, sim {result.wall_s:.1f}s wall, "
                        f"decision {us['mean'] or 0:.0f}µs mean]",
                        flush=True,
                    )
                    if args.no_records:
                        body["records"] = []
    write_results(args.out, runs, baseline_label=runs[0]["label"] if runs else None)
    table = summary(runs)
    (args.out / "results.md").write_text(table + "\n\n" + markdown_table(runs) + "\n")
    if not args.no_plots:
        plot(args.out, runs)
    print("\n" + table + f"\n\nresults: {args.out / 'results.json'}")
    bad = [r for r in runs if check_consistency(r["metrics"])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
