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
import asyncio
import contextlib
import json
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import requests

from benchmarks._server import BenchServer, install_signal_handlers, resolve_model, stop_all
from benchmarks.goodput.calibrate import calibrate
from benchmarks.goodput.capacity import search_capacity
from benchmarks.goodput.emulation_validity import MAX_LATE_SHARE, emulation_counters, pacing_delta, verdict
from benchmarks.goodput.loadgen import LengthControl, LoadGenerator, LoadOptions, PromptFor
from benchmarks.goodput.metrics import check_consistency, score, timeline
from benchmarks.goodput.mixes import MIXES, Calibration, Scale
from benchmarks.goodput.records import PlannedRequest, RequestRecord
from benchmarks.goodput.report import markdown_table, plot, write_results
from benchmarks.goodput.workload import WorkloadSpec, plan
from benchmarks.workloads.text import PromptText
from benchmarks.workloads.traces import TRACES

STOCK = "stock"


class Target:
    """One server under test: started here (a policy, or stock SGLang) or reached at a URL."""

    def __init__(self, label: str, url: str | None, args: argparse.Namespace) -> None:
        self.label, self.args = label, args
        self.url = url
        self.server: BenchServer | None = None

    @property
    def ours(self) -> bool:
        """Does it speak sglang-slo (SLO field, hidden length hint, /slo/status)?"""
        if self.label == STOCK:
            return False
        try:
            return requests.get(self.url + "/slo/status", timeout=5).status_code == 200
        except requests.RequestException:
            return False

    def __enter__(self) -> Target:
        if self.url is None:
            stock = self.label == STOCK
            flags = ["--max-running-requests", str(self.args.max_running_requests)]
            if not stock:
                flags += ["--slo-policy", self.label]
            flags += self.args.server_arg
            self.server = BenchServer(self.args.model_path, flags, stock=stock, name=self.label).start()
            self.url = self.server.url
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.stop()
            self.server, self.url = None, None


def uniform_length_control(choice: str, targets: list[Target]) -> LengthControl:
    """One mechanism for every target of a run, so none is favoured. `auto`: the hidden hint
    when every target is sglang-slo, client stops otherwise (stock SGLang cannot read the hint).
    Measured on SmolLM2 under overload, the two differ by about 10 % in throughput."""
    if choice != "auto":
        return LengthControl(choice)
    speaks = all(t.label != STOCK and (t.url is None or t.ours) for t in targets)
    return LengthControl.HINT if speaks else LengthControl.CLIENT


def add_drain_args(group: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """How long a run waits past its drain timeout (`LoadOptions.drain_until_due`)."""
    group.add_argument(
        "--drain-until-due",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="past the drain timeout, wait on for requests whose SLO can still be met (default: on)",
    )
    group.add_argument("--max-drain", type=float, default=1800.0, help="s after the last arrival: the latest cut")


def load_options(args: argparse.Namespace, ours: bool) -> LoadOptions:
    return LoadOptions(
        length_control=args.control,
        send_slo=ours,
        client_max_tokens=args.client_max_tokens,
        duration_s=args.duration,
        drain_timeout_s=args.drain_timeout,
        drain_until_due=args.drain_until_due,
        max_drain_s=args.max_drain,
        seed=args.seed,
    )


class Progress:
    """A tqdm bar over finished requests (stderr), silent when --quiet."""

    def __init__(self, total: int, desc: str, quiet: bool) -> None:
        self.bar = None
        if not quiet:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="req", leave=False, file=sys.stderr)

    def tick(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def offered_window(planned: list[PlannedRequest]) -> float | None:
    """Seconds from the first to the last planned arrival: goodput is per offered second, the
    same divisor for every target, so a policy is not charged for a longer drain (None when the
    whole workload arrives at once: then the makespan divides)."""
    arrivals = [p.req.arrival_s for p in planned]
    span = max(arrivals) - min(arrivals) if arrivals else 0.0
    return span if span > 0 else None


def run_once(
    target: Target, planned: list[PlannedRequest], prompt_for: PromptFor, args: argparse.Namespace, rate: float | None
) -> dict[str, Any]:
    return run_group([target], planned, prompt_for, args, rate)[0]


def run_group(
    targets: list[Target],
    planned: list[PlannedRequest],
    prompt_for: PromptFor,
    args: argparse.Namespace,
    rate: float | None,
) -> list[dict[str, Any]]:
    """The same arrivals to every target at once, from one event loop in the calling thread, so
    Ctrl-C or SIGTERM interrupts the load at once (a load in a worker thread kept the harness,
    and its servers, alive until the drain ended)."""
    opts = [load_options(args, t.ours) for t in targets]
    before = [emulation_counters(t.url) if t.ours else None for t in targets]  # an emulated worker's counters
    bars = [Progress(len(planned), f"{t.label} @ {rate}/s", args.quiet) for t in targets]
    started = time.monotonic()

    async def load() -> list[list[RequestRecord]]:
        return list(
            await asyncio.gather(
                *(
                    LoadGenerator(t.url, prompt_for, o, on_done=bar.tick).run(planned)
                    for t, o, bar in zip(targets, opts, bars, strict=True)
                )
            )
        )

    try:
        all_records = asyncio.run(load())
    finally:
        for bar in bars:
            bar.close()
    wall_s = round(time.monotonic() - started, 2)
    return [
        _finish_run(t, o, b, records, planned, args, rate, wall_s)
        for t, o, b, records in zip(targets, opts, before, all_records, strict=True)
    ]


def _finish_run(
    target: Target,
    opts: LoadOptions,
    pacing_before: dict[str, Any] | None,
    records: list[RequestRecord],
    planned: list[PlannedRequest],
    args: argparse.Namespace,
    rate: float | None,
    wall_s: float,
) -> dict[str, Any]:
    window = offered_window(planned)
    metrics = score(records, duration_s=window)
    status = None
    if target.ours:
        try:
            status = requests.get(target.url + "/slo/status", timeout=5).json()
        except requests.RequestException as e:
            status = {"error": str(e)}
    config = {
        "length_control": opts.length_control.value,
        "send_slo": opts.send_slo,
        "wall_s": wall_s,
        "slo_status": status,
        "offered_window_s": window,  # rescoring saved records divides by the same window
    }
    if pacing_before is not None:  # did the emulated card keep its pace in this run?
        config["pacing"] = {target.label: pacing_delta(pacing_before, emulation_counters(target.url))}
    return {
        "label": target.label,
        "rate": rate,
        "config": config,
        "metrics": metrics,
        "timeline": timeline(records, args.bin_s or auto_bin_s(metrics.duration_s)),
        "records": records,
    }


def auto_bin_s(duration_s: float | None) -> float:
    """About 30 bins per run, at least a quarter second."""
    return max(0.25, round((duration_s or 0.0) / 30.0, 2))


def describe(run: dict[str, Any]) -> str:
    m = run["metrics"]
    bad = check_consistency(m)
    line = (
        f"   {run['label']} @ {run['rate']}/s: {m.requests} requests, attained {m.attainment:.0%}, "
        f"goodput {m.goodput_rps or 0:.2f} req/s, {m.throughput_tok_s or 0:.1f} tok/s, "
        f"lost {m.lost}, cut {m.cut}, never sent {m.never_sent}"
    )
    pacing = verdict(run["config"].get("pacing"))
    if pacing["valid"] is False:
        line += f"\n   INVALID: emulated steps late on {', '.join(pacing['late_workers'])} (> {MAX_LATE_SHARE:.0%})"
    return line + (f"\n   INCONSISTENT: {bad}" if bad else "")


def doc_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """A benchmark's parser whose --help is its module docstring: the first paragraph as the
    description, the rest (how to run it, what it writes) as the epilog."""
    description, epilog = doc.split("\n\n", 1)
    return argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=epilog
    )


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
    spec = WorkloadSpec(
        trace=args.trace,
        data_dir=args.data_dir,
        start_s=args.start,
        window_s=args.window,
        units=args.units,
        arrivals=args.arrivals,
        length_scale=args.length_scale,
        max_prompt=args.max_prompt,
        max_output=args.max_output,
        mix=args.mix,
        seed=args.seed,
    )
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


def header_run(run: dict[str, Any], header: dict[str, Any]) -> dict[str, Any]:
    return {**run, "config": {**header, **run["config"]}}


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
