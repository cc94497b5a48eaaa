"""Live runs: a server under test (started here, or reached at a URL), the planned workload sent
to it by the load generator, and the run dict it leaves (label, rate, config, metrics, timeline,
records: what report.py writes). Shared by the goodput comparison and the live experiments."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import requests

from benchmarks._server import BenchServer
from benchmarks.goodput.emulation_validity import emulation_counters, pacing_delta
from benchmarks.goodput.loadgen import LengthControl, LoadGenerator, LoadOptions, PromptFor
from benchmarks.goodput.records import PlannedRequest, RequestRecord
from benchmarks.goodput.scoring import auto_bin_s, offered_window, score, timeline

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
    The two mechanisms do not cost the same throughput, so mixing them would bias a comparison."""
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


def header_run(run: dict[str, Any], header: dict[str, Any]) -> dict[str, Any]:
    return {**run, "config": {**header, **run["config"]}}
