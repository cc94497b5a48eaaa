"""Overload and soak: does every request get an answer, and do the admitted ones keep their SLOs?

An emulated H100 (Llama-3-8B profile, every forward pass K = --slowdown times slower) behind the
router, both with bounded queues, gets open-loop Poisson load from 0.5x to 5x its nominal
capacity (the profile's throughput for the request shape, in wall time). Requests are 70 %
latency-class (TTFT and TPOT targets, `on_infeasible: reject`, `max_queue_ms`) and 30 % with no
SLO. A client that is shed (429/503 with Retry-After) waits the Retry-After once and retries.
Per load it prints:

- goodput (requests meeting their SLO per second of offered window) and admitted attainment;
- shed share (first attempts answered 429/503) and p99 time to a rejection;
- Retry-After accuracy: the share of retries, sent after waiting Retry-After, that were admitted;
- lost (no answer, or an error that is not a shed): must be 0;
- RSS of the router and the worker (its scheduler and detokenizer included), and each worker's
  late-step share (a run above 2 % is marked invalid: the host did not keep the card's pace).

`--soak` runs the router and two workers at --soak-load for --soak-minutes (default 30), sampling
RSS and goodput every --soak-sample-s; it reports RSS growth after the first sample (goal < 5 %).

  PYTHONPATH=launch:. .venv/bin/python -m benchmarks.experiments.overload                  # ~12 min
  PYTHONPATH=launch:. .venv/bin/python -m benchmarks.experiments.overload --quick          # ~5 min
  PYTHONPATH=launch:. .venv/bin/python -m benchmarks.experiments.overload --soak           # 30 min + start-up
Writes --out/overload.json and --out/overload.md (the table). Exit status 1 if a request was lost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from benchmarks._server import prepare_live_cluster
from benchmarks.cli import doc_parser
from benchmarks.experiments.emulated_routing import emulation_snapshot
from benchmarks.goodput.emulation_validity import pacing_delta, verdict
from launch_cluster import Cluster, RouterSpec
from launch_cluster_spec import parse_cluster
from scheduler.core.pacing import SlowedPerfModel
from scheduler.core.perf_model import load_perf_model, profile_path
from wire import ORACLE_HINT_PARAM, RETRY_AFTER_HEADER, SHED_REASONS

VOCAB = (10, 500)  # token ids the tiny model (what emulated workers run) takes
LATENCY_SHARE = 0.7
FULL = {"loads": "0.5,1,2,3,5", "duration": 60.0, "soak_minutes": 30.0}
QUICK = {"loads": "0.5,2,5", "duration": 30.0, "soak_minutes": 3.0}


# --------------------------------------------------------------------------------------------
# Options and the pool


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser("python -m benchmarks.experiments.overload", __doc__)
    p.add_argument("--loads", help=f"offered load, multiples of capacity (default {FULL['loads']})")
    p.add_argument("--duration", type=float, help="seconds of arrivals per load (default 60, --quick 30)")
    p.add_argument("--gpu", default="h100", help="emulated card")
    p.add_argument("--slowdown", type=float, default=8.0, help="--emulate-slowdown K (SLOs scale by K too)")
    p.add_argument("--slo-policy", default="edf")
    p.add_argument("--max-running", type=int, default=32, help="the worker's batch cap")
    p.add_argument("--worker-queue", type=int, default=64, help="the worker's --max-queued-requests")
    p.add_argument("--router-queue", type=int, default=128, help="the router's --max-queued-requests (per worker)")
    p.add_argument("--prompt", type=int, default=256, help="prompt tokens")
    p.add_argument("--output", type=int, default=64, help="true output tokens (the hidden hint)")
    p.add_argument("--ttft-ms", type=float, default=1000.0, help="TTFT target on the card (x K on the wire)")
    p.add_argument("--tpot-ms", type=float, default=50.0, help="TPOT target on the card (x K on the wire)")
    p.add_argument("--drain-timeout", type=float, default=180.0, help="s after the last arrival before cutting")
    p.add_argument("--soak", action="store_true", help="the soak run instead of the load sweep")
    p.add_argument("--soak-load", type=float, default=1.5, help="soak load, multiple of the pool's capacity")
    p.add_argument("--soak-minutes", type=float, help="(default 30, --quick 3)")
    p.add_argument("--soak-sample-s", type=float, default=60.0, help="soak sampling interval")
    p.add_argument("--quick", action="store_true", help="~5 minutes: three loads, 30 s each (a 3-minute soak)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("results/overload"))
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.load_list = [float(x) for x in args.loads.split(",") if x.strip()]
    if not args.load_list or min(args.load_list) <= 0 or args.slowdown < 1:
        p.error("--loads must be positive and --slowdown >= 1")
    return args


def capacity_rps(args: argparse.Namespace) -> float:
    """Requests per wall second one card serves at saturation, from its profile: a full batch's
    prompts prefilled, then its outputs decoded together, every step K times slower."""
    perf = SlowedPerfModel(load_perf_model(profile_path(args.gpu), kind="table"), args.slowdown)
    batch, prompt, output = args.max_running, args.prompt, args.output
    prefill_s = perf.step_time(batch * prompt, 0, 0)
    decode_s = output * perf.step_time(0, batch, batch * (prompt + output // 2))
    return batch / (prefill_s + decode_s)


def cluster_of(args: argparse.Namespace, workers: int) -> Cluster:
    """The router and `workers` emulated cards (started by `with`)."""
    common = ["--emulate-slowdown", f"{args.slowdown:g}", "--slo-policy", args.slo_policy]
    common += ["--max-running-requests", str(args.max_running), "--max-queued-requests", str(args.worker_queue)]
    specs = parse_cluster({"args": common, "workers": [{"gpu": args.gpu, "count": workers}]})
    router = RouterSpec(policy="least_request", args=["--max-queued-requests", str(args.router_queue * workers)])
    return Cluster(specs, router=router)


def rss_mb(pid: int | None) -> float | None:
    """Resident memory of a process and its descendants."""
    if pid is None:
        return None
    try:
        proc = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20
    except psutil.NoSuchProcess:
        return None


def memory(cluster: Cluster) -> dict[str, float | None]:
    out = {"router": rss_mb(cluster.router.proc.pid if cluster.router and cluster.router.proc else None)}
    for spec, server in zip(cluster.specs, cluster.servers, strict=True):
        out[spec.name] = rss_mb(server.proc.pid if server.proc else None)
    return out


# --------------------------------------------------------------------------------------------
# The client


@dataclass
class Attempt:
    status: int | None  # None: no answer (lost)
    seconds: float
    shed_reason: str | None = None
    retry_after_s: float | None = None
    attained: bool | None = None


@dataclass
class Outcome:
    rid: str
    has_slo: bool
    sent_s: float
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def admitted(self) -> bool:
        return any(a.status == 200 for a in self.attempts)

    @property
    def attained(self) -> bool:
        return any(a.attained for a in self.attempts)

    @property
    def lost(self) -> bool:
        """No answer, or an error that names no shed reason: the client was left without one."""
        return any(a.status is None or (a.status != 200 and a.shed_reason is None) for a in self.attempts)


def request_body(args: argparse.Namespace, rng: random.Random, has_slo: bool) -> dict[str, Any]:
    params = {"max_new_tokens": 2 * args.output, "custom_params": {ORACLE_HINT_PARAM: args.output}}
    body: dict[str, Any] = {"input_ids": [rng.randrange(*VOCAB) for _ in range(args.prompt)], "sampling_params": params}
    if has_slo:
        ttft = args.ttft_ms * args.slowdown
        body["slo"] = {
            "ttft_ms": ttft,
            "tpot_ms": args.tpot_ms * args.slowdown,
            "on_infeasible": "reject",
            "max_queue_ms": ttft,
        }
    return body


async def attempt(session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout_s: float) -> Attempt:
    started = time.monotonic()
    try:
        async with session.post(url + "/generate", json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            data = await resp.json(content_type=None)
            elapsed = time.monotonic() - started
            if resp.status == 200:
                report = (data.get("meta_info") or {}).get("slo") or {}
                return Attempt(200, elapsed, attained=bool((report.get("attained") or {}).get("overall")))
            error = data.get("error") if isinstance(data, dict) else None
            reason = error.get("reason") if isinstance(error, dict) else None
            retry = resp.headers.get(RETRY_AFTER_HEADER)
            return Attempt(
                resp.status,
                elapsed,
                shed_reason=reason if reason in SHED_REASONS else None,
                retry_after_s=float(retry) if retry is not None else None,
            )
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return Attempt(None, time.monotonic() - started)


async def one_request(
    session: aiohttp.ClientSession, url: str, out: Outcome, body: dict[str, Any], retry_until: float, timeout_s: float
) -> None:
    first = await attempt(session, url, body, timeout_s)
    out.attempts.append(first)
    if first.shed_reason is not None and first.retry_after_s is not None:
        if time.monotonic() + first.retry_after_s < retry_until:
            await asyncio.sleep(first.retry_after_s)
            out.attempts.append(await attempt(session, url, body, timeout_s))


async def offer(url: str, rate: float, duration_s: float, args: argparse.Namespace, seed: int) -> list[Outcome]:
    """Poisson arrivals at `rate` for `duration_s`; every request awaited (bounded by the drain)."""
    rng = random.Random(seed)
    outcomes: list[Outcome] = []
    tasks: list[asyncio.Task[None]] = []
    start = time.monotonic()
    end = start + duration_s
    timeout_s = duration_s + args.drain_timeout
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        t = start
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                break
            await asyncio.sleep(max(0.0, t - time.monotonic()))
            has_slo = rng.random() < LATENCY_SHARE
            out = Outcome(f"o{seed}-{len(outcomes)}", has_slo, time.monotonic() - start)
            outcomes.append(out)
            body = request_body(args, rng, has_slo)
            tasks.append(asyncio.create_task(one_request(session, url, out, body, end, timeout_s)))
        await asyncio.gather(*tasks)
    return outcomes


# --------------------------------------------------------------------------------------------
# Scoring


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def score(outcomes: list[Outcome], window_s: float) -> dict[str, Any]:
    firsts = [o.attempts[0] for o in outcomes if o.attempts]
    shed_first = [a for a in firsts if a.shed_reason is not None]
    retries = [o.attempts[1] for o in outcomes if len(o.attempts) > 1]
    admitted = [o for o in outcomes if o.admitted]
    with_slo = [o for o in admitted if o.has_slo]
    reasons: dict[str, int] = {}
    for a in shed_first:
        reasons[a.shed_reason or "?"] = reasons.get(a.shed_reason or "?", 0) + 1
    return {
        "sent": len(outcomes),
        "admitted": len(admitted),
        "goodput_rps": sum(o.attained for o in outcomes) / window_s if window_s > 0 else None,
        "admitted_attainment": sum(o.attained for o in with_slo) / len(with_slo) if with_slo else None,
        "shed_share": len(shed_first) / len(firsts) if firsts else None,
        "shed_reasons": reasons,
        "retries": len(retries),
        "retry_after_accuracy": sum(a.status == 200 for a in retries) / len(retries) if retries else None,
        "lost": sum(o.lost for o in outcomes),
        "p99_rejection_s": p99([a.seconds for a in shed_first]),
    }


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[dict[str, Any]]) -> str:
    head = [
        "load", "offered req/s", "goodput req/s", "admitted attainment", "shed share", "Retry-After accuracy",
        "lost", "p99 to rejection s", "RSS router MB", "RSS workers MB", "late steps (worst)", "valid",
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        m, workers = r["metrics"], [v for k, v in r["rss_mb"].items() if k != "router" and v is not None]
        cells = [
            f"{r['load']:g}x",
            _fmt(r["rate"]),
            _fmt(m["goodput_rps"]),
            _fmt(m["admitted_attainment"], ".3f"),
            _fmt(m["shed_share"], ".1%"),
            _fmt(m["retry_after_accuracy"], ".1%"),
            str(m["lost"]),
            _fmt(m["p99_rejection_s"], ".3f"),
            _fmt(r["rss_mb"].get("router"), ".0f"),
            _fmt(max(workers) if workers else None, ".0f"),
            _fmt(r["late_share"], ".1%"),
            "yes" if r["valid"] else "NO",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pacing_verdict(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The run's emulation verdict (benchmarks/goodput/emulation_validity.py): the worst worker's late
    share and whether every worker kept its card's pace."""
    return verdict({name: pacing_delta(before.get(name), after.get(name)) for name in after})


# --------------------------------------------------------------------------------------------
# The two runs


def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    capacity = capacity_rps(args)
    print(f"nominal capacity of one emulated {args.gpu} at x{args.slowdown:g}: {capacity:.2f} req/s", flush=True)
    rows = []
    with cluster_of(args, workers=1) as cluster:
        for k, load in enumerate(args.load_list):
            rate = load * capacity
            print(f"== {load:g}x capacity: {rate:.2f} req/s for {args.duration:g} s", flush=True)
            before = emulation_snapshot(cluster)
            outcomes = asyncio.run(offer(cluster.url, rate, args.duration, args, seed=args.seed + k))
            pacing = pacing_verdict(before, emulation_snapshot(cluster))
            row = {
                "load": load,
                "rate": rate,
                "metrics": score(outcomes, args.duration),
                "rss_mb": memory(cluster),
                "late_share": pacing["worst_late_share"],
                "valid": pacing["valid"] is not False,
            }
            rows.append(row)
            print(table([row]).splitlines()[-1], flush=True)
    return rows


def soak(args: argparse.Namespace) -> dict[str, Any]:
    workers = 2
    rate = args.soak_load * workers * capacity_rps(args)
    minutes = args.soak_minutes
    print(f"soak: router + {workers} workers at {rate:.2f} req/s for {minutes:g} min", flush=True)
    samples = []
    with cluster_of(args, workers=workers) as cluster:
        before = emulation_snapshot(cluster)
        started = time.monotonic()
        k = 0
        while time.monotonic() - started < minutes * 60:
            window = min(args.soak_sample_s, minutes * 60 - (time.monotonic() - started))
            outcomes = asyncio.run(offer(cluster.url, rate, window, args, seed=args.seed + 1000 + k))
            sample = {"minute": round((time.monotonic() - started) / 60, 2), **score(outcomes, window)}
            sample["rss_mb"] = memory(cluster)
            samples.append(sample)
            print(json.dumps({key: sample[key] for key in ("minute", "goodput_rps", "lost", "rss_mb")}), flush=True)
            k += 1
        late = pacing_verdict(before, emulation_snapshot(cluster))["worst_late_share"]
    first, last = samples[0]["rss_mb"], samples[-1]["rss_mb"]
    growth = {
        name: (last[name] - first[name]) / first[name] if first.get(name) and last.get(name) else None for name in first
    }
    return {"rate": rate, "samples": samples, "rss_growth": growth, "late_share": late}


def soak_report(result: dict[str, Any]) -> str:
    lines = [
        f"soak at {result['rate']:.2f} req/s; worst late-step share {_fmt(result['late_share'], '.1%')}",
        "",
        "| minute | goodput req/s | shed share | lost | "
        + " | ".join(f"RSS {n} MB" for n in result["rss_growth"])
        + " |",
        "|" + "---|" * (4 + len(result["rss_growth"])),
    ]
    for s in result["samples"]:
        rss = " | ".join(_fmt(s["rss_mb"].get(n), ".0f") for n in result["rss_growth"])
        lines.append(
            f"| {s['minute']:g} | {_fmt(s['goodput_rps'])} | {_fmt(s['shed_share'], '.1%')} | {s['lost']} | {rss} |"
        )
    growth = ", ".join(f"{n} {_fmt(g, '+.1%')}" for n, g in result["rss_growth"].items())
    return "\n".join([*lines, "", f"RSS growth since the first sample: {growth} (goal < 5 %)"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prepare_live_cluster()
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) for k, v in vars(args).items()}
    if args.soak:
        result = soak(args)
        report = soak_report(result)
        lost = sum(s["lost"] for s in result["samples"])
        (args.out / "soak.json").write_text(json.dumps({"args": settings, **result}, indent=2))
        (args.out / "soak.md").write_text(report + "\n")
    else:
        rows = sweep(args)
        report = table(rows)
        lost = sum(r["metrics"]["lost"] for r in rows)
        (args.out / "overload.json").write_text(json.dumps({"args": settings, "rows": rows}, indent=2, default=asdict))
        (args.out / "overload.md").write_text(report + "\n")
    print("\n" + report, flush=True)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
