"""Co-located vs prefill-decode disaggregated pools, side by side.

The same number of emulated H100s (Llama-3-8B profile, every forward pass K = --slowdown times
slower) serve the same planned workload in two layouts: all co-located, or split into prefill
and decode workers (KV moved by Mooncake over TCP). In each layout every routing policy gets a
fresh router on the same workers. PolyServe's evaluation (§5.2) compares PD-PolyServe with
PD/CO-Random and PD/CO-Minimal (here: random and least_request) and reports goodput at 90 %
attainment; this prints, per mix, attainment and goodput at each rate and the rate where
attainment crosses the target (linear between the measured rates around it), plus SLOs-Serve
App. A's goodput bound for the mix on this many devices (the router's /slo/status sizing, in
the emulation's dilated time), the "optimal" PolyServe's 92.5 % refers to.

Mixes: polyserve (PolyServe's TTFT choices and TPOT tiers on Azure conversation lengths),
chatbot (SLOs-Serve's tight/loose tiers on Azure conversation lengths: decode-heavy) and
summarizer (the same SLOs on Azure code lengths: long prompts, short answers, prefill-heavy; the
paper's Summarizer uses arXiv-summary lengths, which we do not have).

  PYTHONPATH=launch:. .venv/bin/python -m benchmarks.experiments.pd_layouts          # ~60 min
  PYTHONPATH=launch:. .venv/bin/python -m benchmarks.experiments.pd_layouts --quick \\
      --mixes polyserve --policies polyserve
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from benchmarks._server import prepare_live_cluster, resolve_model
from benchmarks.cli import doc_parser
from benchmarks.experiments.emulated_routing import (
    _metrics,
    measure,
    mix_scale,
    prompt_builder,
    router_line,
    router_spec,
    warm_up,
    workload,
)
from benchmarks.goodput.emulation_validity import invalid_note, verdict
from benchmarks.goodput.harness import add_drain_args, header_run, uniform_length_control
from benchmarks.goodput.report import describe, write_results
from benchmarks.goodput.scoring import check_consistency
from benchmarks.goodput.workload import plan
from benchmarks.workloads.text import PromptText
from launch_cluster import Cluster, WorkerSpec
from launch_cluster_spec import parse_cluster
from router.policies import ROUTING_POLICIES

MIX_SETUPS = {  # name -> (SLO mix, trace)
    "polyserve": ("polyserve", "azure-conv"),
    "chatbot": ("slos-serve", "azure-conv"),
    "summarizer": ("slos-serve", "azure-code"),
}
FULL = {"units": 60, "rates": "3,6", "max_output": 96, "drain_timeout": 120.0, "warmup": 6}
QUICK = {"units": 12, "rates": "3", "max_output": 24, "drain_timeout": 60.0, "warmup": 2}


@dataclass(frozen=True)
class Layout:
    name: str  # "co4", "pd1+3"
    prefill: int  # 0: co-located
    decode: int

    @property
    def size(self) -> int:
        return self.prefill + self.decode


def parse_layout(text: str) -> Layout:
    """`co:N` (N co-located workers) or `pd:P+D` (P prefill and D decode workers)."""
    kind, _, count = text.partition(":")
    try:
        if kind == "co":
            n = int(count)
            if n >= 1:
                return Layout(f"co{n}", 0, n)
        elif kind == "pd":
            p, _, d = count.partition("+")
            if int(p) >= 1 and int(d) >= 1:
                return Layout(f"pd{int(p)}+{int(d)}", int(p), int(d))
    except ValueError:
        pass
    raise ValueError(f"a layout is co:N or pd:P+D with positive counts, got {text!r}")


def layout_workers(layout: Layout, args: argparse.Namespace) -> list[WorkerSpec]:
    common = ["--emulate-slowdown", f"{args.slowdown:g}", "--slo-policy", args.slo_policy]
    common += ["--max-running-requests", str(args.max_running_requests)]
    if not layout.prefill:
        workers: list[dict[str, Any]] = [{"gpu": args.gpu} for _ in range(layout.decode)]
    else:
        workers = [{"gpu": args.gpu, "role": "prefill"} for _ in range(layout.prefill)]
        workers += [{"gpu": args.gpu, "role": "decode"} for _ in range(layout.decode)]
    return parse_cluster({"args": common, "workers": workers})


def crossing(points: list[tuple[float, float]], target: float) -> tuple[float | None, str]:
    """The rate where attainment falls to `target`, linear between measured rates, with how it
    was found: "interpolated", "below" (even the lowest rate missed: None) or "above" (every
    rate met it: the highest rate, a lower bound)."""
    points = sorted(points)
    if not points:
        return None, "below"
    if points[0][1] < target:
        return None, "below"
    for (r0, a0), (r1, a1) in zip(points, points[1:]):
        if a0 >= target > a1:
            return r0 + (r1 - r0) * (a0 - target) / (a0 - a1), "interpolated"
    return points[-1][0], "above"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser("python -m benchmarks.experiments.pd_layouts", __doc__)
    p.add_argument("--layouts", default="co:4,pd:1+3", help="co:N and pd:P+D layouts, comma-separated")
    p.add_argument("--gpu", default="h100", help="emulated card of every worker")
    p.add_argument("--slowdown", type=float, default=8.0)
    p.add_argument("--slo-policy", default="edf")
    p.add_argument("--max-running-requests", type=int, default=32)
    p.add_argument("--policies", default="polyserve,least_request,random")
    p.add_argument("--mixes", default="polyserve,chatbot,summarizer", help=f"of {', '.join(MIX_SETUPS)}")
    p.add_argument("--units", type=int)
    p.add_argument("--rates", help="units/s in wall time, comma-separated")
    p.add_argument(
        "--mix-rates", action="append", default=[], metavar="MIX=R1,R2", help="rates of one mix (repeatable)"
    )
    p.add_argument("--target", type=float, default=0.9, help="attainment at which goodput is reported")
    p.add_argument("--length-scale", type=float, default=0.5)
    p.add_argument("--max-prompt", type=int, default=1024)
    p.add_argument("--max-output", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--drain-timeout", type=float)
    add_drain_args(p)
    p.add_argument("--warmup", type=int)
    p.add_argument("--data-dir")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--out", type=Path, default=Path("results/pd"))
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        args.layout_list = [parse_layout(x.strip()) for x in args.layouts.split(",") if x.strip()]
    except ValueError as e:
        p.error(str(e))
    args.policy_list = [x.strip() for x in args.policies.split(",") if x.strip()]
    args.mix_list = [x.strip() for x in args.mixes.split(",") if x.strip()]
    args.rate_list = [float(x) for x in args.rates.split(",") if x.strip()]
    args.rates_of = {m: args.rate_list for m in MIX_SETUPS}
    for item in args.mix_rates:
        mix, _, rates = item.partition("=")
        if mix not in MIX_SETUPS or not rates:
            p.error(f"--mix-rates takes MIX=R1,R2 with MIX one of {', '.join(MIX_SETUPS)}, got {item!r}")
        args.rates_of[mix] = [float(x) for x in rates.split(",") if x.strip()]
    if bad := [x for x in args.policy_list if x not in ROUTING_POLICIES]:
        p.error(f"unknown routing policy {bad[0]!r}")
    if bad := [x for x in args.mix_list if x not in MIX_SETUPS]:
        p.error(f"unknown mix {bad[0]!r}; known: {', '.join(MIX_SETUPS)}")
    # what the shared routing/goodput helpers read
    args.slo_scale = args.slowdown
    args.client_max_tokens = args.max_output
    args.overrides = {}
    args.router_arg = []
    args.control = uniform_length_control("hint", [])
    args.duration, args.bin_s = None, None
    return args


def mix_args(args: argparse.Namespace, mix_name: str) -> argparse.Namespace:
    mine = copy.copy(args)
    mine.mix_list = [MIX_SETUPS[mix_name][0]]
    mine.trace = MIX_SETUPS[mix_name][1]
    return mine


def sizing_bound(url: str) -> dict[str, Any] | None:
    """The router's App. A sizing of the mix it just served (per device, in emulated-card time)."""
    try:
        sizing = requests.get(url + "/slo/status", timeout=5).json().get("pd_sizing")
    except (requests.RequestException, ValueError):
        return None
    if not sizing:
        return None
    keep = ("ratio", "goodput_per_device_rps", "prefill_instances", "decode_instances")
    return {k: sizing.get(k) for k in keep} | {"split": sizing.get("pool", {}).get("split_for_this_pool")}


def summary(mix: str, runs: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """Per configuration: attainment and goodput per rate, the rate at the target, and ratios."""
    by_config: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_config.setdefault(run["label"], []).append(run)
    rates = args.rates_of[mix]
    lines = [f"### {mix}", "", "| layout / policy | " + " | ".join(f"att @ {r:g}" for r in rates)]
    lines[-1] += f" | rate @ {args.target:.0%} | App. A bound (units/s) |"
    lines.append("|---|" + "---|" * (len(rates) + 2))
    capacity: dict[str, float | None] = {}
    for label, mine in by_config.items():
        points = [(run["rate"], _metrics(run)["attainment"]) for run in mine]
        att = {r: a for r, a in points}
        rate, how = crossing(points, args.target)
        capacity[label] = rate
        shown = "-" if rate is None else (f"{rate:.2f}" if how == "interpolated" else f">= {rate:g}")
        bound = mine[-1]["config"].get("pd_sizing") or {}
        per_device = bound.get("goodput_per_device_rps")
        size = mine[-1]["config"].get("layout_size", 0)
        optimum = None if per_device is None else per_device * size  # the router sized it in wall time
        invalid = {run["rate"] for run in mine if verdict(run["config"].get("pacing"))["valid"] is False}
        cells = [f"{att[r]:.1%}" + (" INVALID" if r in invalid else "") if r in att else "-" for r in rates]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {shown} | {_fmt(optimum)} |")
    if note := invalid_note(runs):
        lines += ["", note]
    best_baseline = max(
        (c for label, c in capacity.items() if c is not None and not label.endswith("/polyserve")), default=None
    )
    for label, c in capacity.items():
        if label.endswith("/polyserve") and c is not None and best_baseline:
            lines.append(f"\n{label}: {c / best_baseline:.2f}x the best baseline's rate at {args.target:.0%}")
    return "\n".join(lines) + "\n"


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prepare_live_cluster()
    text = PromptText(resolve_model("tiny"))
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in args.mix_list}
    for layout in args.layout_list:
        first = mix_args(args, args.mix_list[0])
        scale0 = mix_scale(first.mix_list[0], args.slo_scale)
        print(f"== layout {layout.name}: {layout.prefill} prefill + {layout.decode} decode/co-located", flush=True)
        with Cluster(layout_workers(layout, args), router=router_spec(args.policy_list[0], scale0, args)) as cluster:
            warm_up(cluster.url, first, scale0, text)
            k = 0
            for mix_name in args.mix_list:
                margs = mix_args(args, mix_name)
                scale = mix_scale(margs.mix_list[0], args.slo_scale)
                spec = workload(margs, margs.mix_list[0])
                for policy in args.policy_list:
                    for rate in args.rates_of[mix_name]:
                        if k:
                            cluster.restart_router(router_spec(policy, scale, margs))
                        k += 1
                        label = f"{layout.name}/{policy}"
                        print(f"-- {mix_name} / {label} @ {rate:g} units/s", flush=True)
                        run = measure(cluster, label, plan(spec, rate, scale), prompt_builder(text, spec), margs, rate)
                        run["config"]["pd_sizing"] = sizing_bound(cluster.url)
                        run["config"]["layout_size"] = layout.size
                        runs[mix_name].append(header_run(run, {"layout": layout.name, "policy": policy}))
                        print(describe(run) + "\n" + router_line(run), flush=True)
                        write_results(args.out / mix_name, runs[mix_name])
    sections = [summary(m, runs[m], args) for m in args.mix_list]
    (args.out / "results.md").parent.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text("\n".join(sections))
    (args.out / "summary.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}}))
    print("\n" + "\n".join(sections), flush=True)
    bad = [r for mine in runs.values() for r in mine if r["metrics"].lost or check_consistency(r["metrics"])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
