"""Compare policies and servers side by side on the same workload.

For each target (a policy of our server, stock SGLang, or a URL you started yourself) it starts
the server on 127.0.0.1 (one at a time: these machines have 2 cores), runs the same planned
workload at each rate (or searches the highest rate at the target attainment), and writes
results.json, results.md and PNG plots into --out. SLOs are calibrated once, on the first
target, and the same SLOs go to every target.

  .venv/bin/python -m benchmarks.goodput --policies fcfs,edf --model-path tiny --units 40 --rates 2
  .venv/bin/python -m benchmarks.goodput --policies fcfs,edf,tempo,slos --stock --trace azure-conv \\
      --mix tempo --slo-scale auto --rates 0.8,1.6 --units 120 --out results/goodput-smollm2
  .venv/bin/python -m benchmarks.goodput --url router=http://127.0.0.1:40000 --capacity
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks._server import install_signal_handlers, resolve_model, stop_all
from benchmarks.cli import doc_parser
from benchmarks.goodput.calibrate import calibrate
from benchmarks.goodput.capacity import search_capacity
from benchmarks.goodput.harness import (
    STOCK,
    Target,
    add_drain_args,
    header_run,
    load_options,
    run_group,
    run_once,
    uniform_length_control,
)
from benchmarks.goodput.loadgen import LengthControl, PromptFor
from benchmarks.goodput.mixes import MIXES, Calibration, Scale
from benchmarks.goodput.records import PlannedRequest
from benchmarks.goodput.report import describe, markdown_table, plot, write_results
from benchmarks.goodput.scoring import check_consistency
from benchmarks.goodput.workload import WorkloadSpec, plan
from benchmarks.workloads.text import PromptText
from benchmarks.workloads.traces import TRACES


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser("python -m benchmarks.goodput", __doc__)
    t = p.add_argument_group("targets")
    t.add_argument("--policies", default="fcfs,edf", help="our server, one run per --slo-policy (default fcfs,edf)")
    t.add_argument("--stock", action="store_true", help="also run stock `python -m sglang.launch_server` (first)")
    t.add_argument("--url", action="append", default=[], metavar="LABEL=URL", help="a server already running")
    t.add_argument("--model-path", default="default", help="default (SmolLM2), tiny, or an HF folder")
    t.add_argument("--max-running-requests", type=int, default=8)
    t.add_argument("--server-arg", action="append", default=[], help="extra server flag (repeatable, use =)")
    w = p.add_argument_group("workload")
    w.add_argument("--trace", default="azure-conv", choices=sorted(TRACES))
    w.add_argument("--data-dir", help="traces folder (default $SGLANG_SLO_DATA or ../shared/data)")
    w.add_argument("--start", type=float, default=0.0, help="trace window start, s")
    w.add_argument("--window", type=float, help="trace window length, s (default: to the end)")
    w.add_argument("--units", type=int, default=60, help="arrivals (lone requests or programs) per run")
    w.add_argument("--arrivals", choices=("trace", "poisson"), default="trace")
    w.add_argument("--rates", default="", help="comma-separated units/s (default: the trace's own timing)")
    w.add_argument("--length-scale", type=float, default=0.1, help="trace lengths times this (CPU engines)")
    w.add_argument("--max-prompt", type=int, default=512)
    w.add_argument("--max-output", type=int, default=64)
    w.add_argument("--mix", default="tempo", choices=sorted(MIXES))
    w.add_argument("--slo-scale", default="auto", help="'auto' (calibrate), or a number times the calibration")
    w.add_argument("--no-calibration", action="store_true", help="with a number: scale the GPU targets only")
    w.add_argument("--calibration-from", type=Path, help="reuse the calibration of an earlier results.json (same SLOs)")
    w.add_argument("--seed", type=int, default=0)
    r = p.add_argument_group("run")
    r.add_argument(
        "--length-control",
        choices=("auto", *(c.value for c in LengthControl)),
        default="auto",
        help="how the true output length is enforced, the same for every target (auto: hint when all "
        "targets are sglang-slo, else client)",
    )
    r.add_argument("--client-max-tokens", type=int, default=1024, help="the max_new_tokens a client sends")
    r.add_argument("--duration", type=float, help="send nothing later than this many s into a run")
    r.add_argument("--drain-timeout", type=float, default=120.0, help="s after the last arrival before cutting")
    add_drain_args(r)
    r.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="targets served side by side, each getting the same arrivals at the same time (default 1; "
        "only where the host keeps every emulated card's pace: runs with late steps are marked INVALID)",
    )
    r.add_argument("--capacity", action="store_true", help="binary-search the highest rate at --target attainment")
    r.add_argument("--target", type=float, default=0.9, help="attainment for --capacity (default 0.9)")
    r.add_argument("--capacity-probes", type=int, default=5)
    r.add_argument("--bin-s", type=float, help="time bin of the over-time plot (default: about 30 per run)")
    r.add_argument("--out", type=Path, default=Path("results/goodput"))
    r.add_argument("--no-plots", action="store_true")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    args.rate_list = [float(x) for x in args.rates.split(",") if x.strip()] or [None]
    args.policy_list = [x.strip() for x in args.policies.split(",") if x.strip()]
    for item in args.url:
        if "=" not in item:
            p.error(f"--url takes LABEL=URL, got {item!r}")
    return args


def _groups(targets: list[Target], size: int) -> list[list[Target]]:
    """Targets run side by side, `size` at a time (each its own server on this machine)."""
    size = max(1, size)
    return [targets[i : i + size] for i in range(0, len(targets), size)]


def targets_of(args: argparse.Namespace) -> list[Target]:
    out = [Target(STOCK, None, args)] if args.stock else []
    out += [Target(name, None, args) for name in args.policy_list]
    out += [Target(label, url.rstrip("/"), args) for label, url in (u.split("=", 1) for u in args.url)]
    if not out:
        raise SystemExit("nothing to run: give --policies, --stock or --url")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    spec = WorkloadSpec.from_flags(args, args.seed, data_dir=args.data_dir, start_s=args.start, window_s=args.window)
    text = PromptText(resolve_model(args.model_path))

    def prompt_for(p: PlannedRequest, rng: random.Random) -> list[int]:
        return text.build(p.req, rng, block_tokens=spec.block_tokens)

    runs: list[dict[str, Any]] = []
    capacities: dict[str, Any] = {}
    calibration: Calibration | None = None
    scale: Scale | None = None
    header = {"workload": asdict(spec), "args": {k: str(v) for k, v in vars(args).items()}}
    targets = targets_of(args)
    args.control = uniform_length_control(args.length_control, targets)
    print(f"length control: {args.control.value}", flush=True)
    try:
        for group in _groups(targets, args.parallel):
            with contextlib.ExitStack() as stack:
                for target in group:
                    print(f"== {target.label}", flush=True)
                    stack.enter_context(target)
                if scale is None:
                    first = group[0]
                    if args.calibration_from is not None:
                        calibration = earlier_calibration(args.calibration_from)
                    elif not args.no_calibration:
                        calibration = calibrate(first.url, prompt_for, load_options(args, first.ours))
                        print(f"   calibrated on {first.label}: {calibration}", flush=True)
                    scale = Scale.from_option(args.slo_scale, calibration)
                    header["calibration"] = None if calibration is None else asdict(calibration)
                if args.capacity:
                    for target in group:
                        capacities[target.label] = capacity_of(target, spec, scale, prompt_for, args, runs)
                    continue
                for rate in args.rate_list:
                    planned = plan(spec, rate, scale)
                    done = run_group(group, planned, prompt_for, args, rate)  # the same arrivals at once
                    for run in done:
                        runs.append(run)
                        print(describe(run), flush=True)
                    write_results(args.out, [header_run(r, header) for r in runs])
    finally:
        stop_all()
    baseline = runs[0]["label"] if runs else None
    path = write_results(args.out, [header_run(r, header) for r in runs], baseline_label=baseline)
    table = markdown_table(runs, baseline_label=baseline)
    if capacities:
        table += "\n" + capacity_table(capacities, args.target)
        (args.out / "results.md").write_text(table + "\n")
    print("\n" + table)
    if not args.no_plots:
        for png in plot(args.out, runs):
            print(f"plot: {png}")
    print(f"results: {path}")
    bad = [r for r in runs if r["metrics"].lost or check_consistency(r["metrics"])]
    return 1 if bad else 0


def earlier_calibration(path: Path) -> Calibration:
    """The calibration stored in an earlier run's results.json, so a repeat gets the same SLOs."""
    runs = json.loads(path.read_text()).get("runs") or []
    stored = next((r["config"].get("calibration") for r in runs if r.get("config", {}).get("calibration")), None)
    if stored is None:
        raise SystemExit(f"{path}: no calibration stored (was it run with --no-calibration?)")
    return Calibration(**stored)


def capacity_of(
    target: Target,
    spec: WorkloadSpec,
    scale: Scale,
    prompt_for: PromptFor,
    args: argparse.Namespace,
    runs: list[dict[str, Any]],
) -> dict[str, Any]:
    def attainment_at(rate: float) -> float:
        runs.append(run_once(target, plan(spec, rate, scale), prompt_for, args, rate))
        print(describe(runs[-1]), flush=True)
        return runs[-1]["metrics"].attainment or 0.0

    start = args.rate_list[0] or 1.0
    found = search_capacity(attainment_at, start, target=args.target, max_probes=args.capacity_probes)
    print(f"   capacity of {target.label}: {found.capacity_rate} units/s at >= {args.target:.0%}", flush=True)
    return {"capacity_rate": found.capacity_rate, "probes": found.probes}


def capacity_table(capacities: dict[str, Any], target: float) -> str:
    lines = [
        f"| target | capacity (units/s at >= {target:.0%} attained) | probes (rate: attainment) |",
        "|---|---|---|",
    ]
    for label, c in capacities.items():
        probes = ", ".join(f"{r:g}: {a:.0%}" for r, a in c["probes"])
        lines.append(f"| {label} | {c['capacity_rate'] if c['capacity_rate'] is not None else '-'} | {probes} |")
    return "\n".join(lines)
