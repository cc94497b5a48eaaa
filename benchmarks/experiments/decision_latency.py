"""Decision latency of every registered policy: SLO policies per engine step, routing policies
per request.

Engine side: seeded synthetic EngineViews with a realistic mix of SLO classes (interactive and
tight latency, deadline, compound, best effort) at 100, 1 000 and 10 000 queued requests; each
SLO policy's plan() is timed (median ms), then the SLOs-Serve DP alone with 10 new + 200 running
requests, and the slos policy's whole plan() on the same load.
Targets: tempo and gmax < 2 ms at 1 000 and < 20 ms at 10 000 queued; the DP < 5 ms.

Router side: each routing policy's choose() at 8, 64 and 512 workers (mean µs). Workers get
random EMAs, tiers and loads; requests mix SLO classes and share prompt prefixes, so the prefix
tables and tier bookkeeping are exercised. SLOs-Serve's admission is the real one (the core's DP
per asked replica, which dominates its cost) over `RUNNING_PER_WORKER` synthetic in-flight
requests per worker, built through the registry as the router builds it. Then one GoodServe
migration check over 4 running requests per worker. A decision should stay far below a request's
own latency budget (GoodServe reports 5 ms at 512 instances).

Plan path (plan_path_latency.py): what the SGLang adapter does per scheduling pass with 256
running requests, on the usual mix at 1 000 and 10 000 waiting and on five adversarial states;
p50, p99 and max per pass (goals: p99 <= 1 ms at 1 000 waiting, <= 5 ms at 10 000, max <= 2 x
p99), with `--repeats N` the median of N interleaved runs.

Policies come from the registries, so ones added later are measured too. Not a test (timings
depend on the machine). Run from the repository root: `python benchmarks/experiments/decision_latency.py
[--json] [--part engine|plan-path|router] [--passes N] [--repeats N] [--policies ...]`; the repo root is put on
sys.path by this script.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.experiments.dp_work_rate import dp_units_per_ms  # noqa: E402
from benchmarks.experiments.plan_path_latency import bench_plan_path, plan_path_states, print_plan_path  # noqa: E402
from benchmarks.experiments.plan_path_states import (  # noqa: E402
    ENGINE_NOW,
    RUNNING,
    make_view,
)
from router.policies import ROUTING_POLICIES, RoutingContext, RoutingPolicy  # noqa: E402
from router.routing_views import RouteRequest, RunningView, WorkerView  # noqa: E402
from scheduler.core.perf_model import default_model  # noqa: E402
from scheduler.core.policies import POLICIES, PolicyContext  # noqa: E402
from scheduler.core.slo import SloClass, SloSpec  # noqa: E402
from scheduler.core.slos_serve.dp import DpItem, TierBudget  # noqa: E402
from scheduler.core.slos_serve.soft_admission import admit  # noqa: E402

# -- engine side: SLO policies ---------------------------------------------------------------

QUEUED = (100, 1_000, 10_000)
TARGETS_MS = {"tempo": {1_000: 2.0, 10_000: 20.0}, "gmax": {1_000: 2.0, 10_000: 20.0}}
DP_TARGET_MS = 5.0


def median_ms(
    fn: Callable[[], object], repeats: int, between: Callable[[], object] | None = None, warm: int = 1
) -> float:
    """Median ms of `fn` after `warm` untimed calls (a server's passes run warm: its first pass
    builds every row, 20x a later one); `between` runs untimed before each call."""
    for _ in range(warm):
        if between is not None:
            between()
        fn()  # warm caches and lazy state
    samples = []
    for _ in range(repeats):
        if between is not None:
            between()
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(samples)


def bench_policies(queued: Sequence[int] = QUEUED, running: int = 64) -> dict[str, dict[int, float | str]]:
    """Median ms per plan() of every registered SLO policy, with its default parameters."""
    views = {n: make_view(n, running, seed=n) for n in queued}
    out: dict[str, dict[int, float | str]] = {}
    for name in POLICIES:
        policy = POLICIES.make(name, {}, PolicyContext())
        row: dict[int, float | str] = {}
        for n in queued:
            repeats = max(3, 20_000 // (n + 200))
            try:
                row[n] = median_ms(lambda p=policy, v=views[n]: p.plan(v), repeats)
            except Exception as exc:  # report, keep measuring the others
                row[n] = f"error: {type(exc).__name__}: {exc}"
        out[name] = row
    return out


def bench_dp(new: int = 10, running: int = 200, seed: int = 7, repeats: int = 50) -> dict[str, float]:
    """The SLOs-Serve DP alone (10 new, 200 running decoders in 3 TPOT tiers), and the slos
    policy's whole plan() on the same load."""
    rng = random.Random(seed)
    tiers = [0.025, 0.05, 0.1]
    base = (60, 80, 40, 20)
    items = [
        DpItem(
            f"n{i}",
            ENGINE_NOW + rng.uniform(0.2, 2.0),
            rng.randrange(100, 3000),
            rng.randrange(200, 4000),
            rng.randrange(-1, 3),
        )
        for i in range(new)
    ]
    perf = default_model()

    def run() -> None:
        admit(items, TierBudget(perf, tiers, 400_000, 8192), base, ENGINE_NOW, 600_000, 512)

    view = make_view(new, running, seed)
    policy = POLICIES.make("slos", {}, PolicyContext())
    return {
        "dp_10_new_200_running_ms": median_ms(run, repeats),
        "slos_plan_10_new_200_running_ms": median_ms(lambda: policy.plan(view), repeats),
    }


# -- router side: routing policies -----------------------------------------------------------

WORKERS = (8, 64, 512)
MAX_CALLS = 2000
MAX_SECONDS = 0.25  # per policy and size
TIERS_MS = (25.0, 50.0, 100.0)
ROUTER_NOW = 1.0  # router clock of every decision; requests arrive right then
RUNNING_PER_WORKER = 16  # in flight per worker, the replica state SLOs-Serve's admission reads
MIGRATION_ROW = "goodserve.migrations (4 running/worker)"


def make_workers(n: int, rng: random.Random) -> list[WorkerView]:
    out = []
    for i in range(n):
        fast = rng.random() < 0.5
        running = rng.randint(0, 40)
        out.append(
            WorkerView(
                worker_id=f"w{i}",
                gpu="h100" if fast else "a40",
                kv_capacity_tokens=200_000,
                max_running=64,
                queue_len=rng.randint(0, 8),
                running=running,
                kv_used_tokens=rng.randint(0, 150_000),
                queue_delay_s=rng.uniform(0.0, 0.5),
                prefill_s_per_token=rng.uniform(1e-5, 1e-4) * (1 if fast else 3),
                decode_s_per_token=rng.uniform(0.01, 0.03) * (1 if fast else 3),
                iteration_s=rng.uniform(0.01, 0.04),
                tokens_per_minute=rng.uniform(0, 1e6),
                inflight=running,
                tpot_tier_ms=rng.choice((*TIERS_MS, None)),
                healthy=rng.random() > 0.02 or i == 0,
            )
        )
    return out


def route_requests(n: int, rng: random.Random) -> list[RouteRequest]:
    slos = [
        SloSpec(),
        SloSpec(deadline_ms=20_000, slo_class=SloClass.DEADLINE),
        SloSpec(ttft_ms=1000, tpot_ms=50, slo_class=SloClass.LATENCY),
        SloSpec(ttft_ms=500, tpot_ms=30, slo_class=SloClass.LATENCY),
    ]
    prefixes = [tuple(rng.getrandbits(48) for _ in range(16)) for _ in range(50)]
    out = []
    for i in range(n):
        shared = rng.choice(prefixes)[: rng.randint(1, 16)]
        own = tuple(rng.getrandbits(48) for _ in range(rng.randint(0, 8)))
        out.append(
            RouteRequest(
                rid=f"r{i}",
                prompt_tokens=64 * (len(shared) + len(own)) + rng.randint(0, 63),
                slo=rng.choice(slos),
                arrival_s=ROUTER_NOW,
                prefix_hashes=shared + own,
                predicted_output_tokens=rng.randint(16, 1024),
            )
        )
    return out


def make_running(
    requests: list[RouteRequest], workers: list[WorkerView], rng: random.Random
) -> dict[str, list[RunningView]]:
    """In-flight requests per worker: arrived up to 2 s ago, about two thirds already decoding."""
    running: dict[str, list[RunningView]] = {}
    for w in workers:
        for _ in range(RUNNING_PER_WORKER):
            req = replace(rng.choice(requests), arrival_s=ROUTER_NOW - rng.uniform(0.0, 2.0))
            started = rng.random() < 2 / 3
            first = req.arrival_s + rng.uniform(0.0, ROUTER_NOW - req.arrival_s) if started else None
            running.setdefault(w.worker_id, []).append(
                RunningView(req, w.worker_id, generated=rng.randint(1, 100) if started else 0, first_token_s=first)
            )
    return running


def build_routing(name: str, running: dict[str, list[RunningView]]) -> RoutingPolicy:
    context = RoutingContext(running_on=lambda wid: running.get(wid, []), clock=lambda: ROUTER_NOW)
    params: dict[str, Any] = {"tiers_ms": TIERS_MS} if name == "polyserve" else {}
    return ROUTING_POLICIES.make(name, params, context)


def mean_us(step: Callable[[int], object], max_calls: int, max_seconds: float) -> float:
    calls = 0
    start = time.perf_counter()
    while calls < max_calls and time.perf_counter() - start < max_seconds:
        step(calls)
        calls += 1
    return (time.perf_counter() - start) / calls * 1e6


def time_choose(
    policy: RoutingPolicy, requests: list[RouteRequest], pool: list[WorkerView], max_calls: int, max_seconds: float
) -> float:
    return mean_us(lambda i: policy.choose(requests[i], pool, ROUTER_NOW), max_calls, max_seconds)


def time_migrations(
    requests: list[RouteRequest], pool: list[WorkerView], rng: random.Random, max_calls: int, max_seconds: float
) -> float:
    """One GoodServe risk check (tau=1) over 4 running requests per worker."""
    policy = ROUTING_POLICIES.make("goodserve", {"tau": 1}, RoutingContext())
    running = [
        RunningView(requests[i % len(requests)], pool[i % len(pool)].worker_id, generated=rng.randint(0, 500))
        for i in range(4 * len(pool))
    ]
    return mean_us(lambda i: policy.migrations(running, pool, ROUTER_NOW), max_calls, max_seconds)


def bench_routing(
    workers: Sequence[int] = WORKERS, max_calls: int = MAX_CALLS, max_seconds: float = MAX_SECONDS
) -> dict[str, list[float]]:
    """Mean µs per choose() of every routing policy at each pool size, and per migration check."""
    rng = random.Random(0)
    requests = route_requests(max_calls, rng)
    rows: dict[str, list[float]] = {}
    for n in workers:
        pool = make_workers(n, rng)
        running = make_running(requests, pool, random.Random(n))  # own stream: the others see the same inputs
        for name in ROUTING_POLICIES:
            policy = build_routing(name, running)
            rows.setdefault(name, []).append(time_choose(policy, requests, pool, max_calls, max_seconds))
        rows.setdefault(MIGRATION_ROW, []).append(time_migrations(requests, pool, rng, max_calls, max_seconds))
    return rows


# -- report ----------------------------------------------------------------------------------


def print_engine(policies: dict[str, dict[int, float | str]], dp: dict[str, float]) -> None:
    print(f"{'policy':<12}" + "".join(f"{n:>12,}" for n in QUEUED) + "   (median ms per plan(), 64 running)")
    for name, row in policies.items():
        cells = []
        for n in QUEUED:
            v = row[n]
            flag = ""
            if isinstance(v, float) and n in TARGETS_MS.get(name, {}):
                flag = " ok" if v < TARGETS_MS[name][n] else " !!"
            cells.append(f"{v:>9.3f}{flag:<3}" if isinstance(v, float) else f"{str(v)[:11]:>12}")
        print(f"{name:<12}" + "".join(cells))
    for key, v in dp.items():
        flag = (" ok" if v < DP_TARGET_MS else " !!") if key.startswith("dp_") else ""
        print(f"{key:<34}{v:>9.3f}{flag}")


def print_router(rows: dict[str, list[float]]) -> None:
    width = max(len(k) for k in rows)
    print(f"{'policy':<{width}}  " + "  ".join(f"{n:>9} w" for n in WORKERS) + "   (mean µs per call)")
    for name, values in rows.items():
        print(f"{name:<{width}}  " + "  ".join(f"{v:>11.1f}" for v in values))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--part", choices=("all", "engine", "plan-path", "router"), default="all", help="what to time")
    parser.add_argument("--passes", type=int, default=0, help="plan path: timed passes per state (0: 200, 60 at 10k)")
    parser.add_argument(
        "--policies", nargs="*", default=[], help="plan path: only these policies (NAME or NAME:KEY=JSON,...)"
    )
    parser.add_argument("--usual-only", action="store_true", help="plan path: no adversarial states")
    parser.add_argument(
        "--repeats", type=int, default=1, help="plan path: runs per cell, interleaved; each statistic their median"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    report: dict[str, Any] = {}
    if args.part in ("all", "engine"):
        report["engine"] = {"queued": list(QUEUED), "policies_ms": bench_policies(), "dp_ms": bench_dp()}
    if args.part in ("all", "plan-path"):
        states = plan_path_states(adversarial=not args.usual_only)
        if args.passes:
            states = [(s, args.passes) for s, _ in states]
        report["plan_path"] = {
            "running": RUNNING,
            "states_ms": bench_plan_path(states, args.policies or None, args.repeats),
            "repeats": args.repeats,
            "dp_units_per_ms": dp_units_per_ms(),
        }
    if args.part in ("all", "router"):
        report["router"] = {"workers": list(WORKERS), "policies_us": bench_routing()}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    if "engine" in report:
        print_engine(report["engine"]["policies_ms"], report["engine"]["dp_ms"])
    if "plan_path" in report:
        if "engine" in report:
            print()
        print_plan_path(report["plan_path"]["states_ms"])
        print_plan_path(report["plan_path"]["states_ms"], cpu=True)
        rate = report["plan_path"]["dp_units_per_ms"]
        print("DP work units per ms on this host: " + ", ".join(f"{k} {v:,.0f}" for k, v in rate.items()))
    if "router" in report:
        if "engine" in report or "plan_path" in report:
            print()
        print_router(report["router"]["policies_us"])


if __name__ == "__main__":
    main()
