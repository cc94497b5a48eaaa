"""Mean decision time of every routing policy at 8, 64 and 512 workers.

Not a test (timings depend on the machine): run `python -m router.policies.bench_decision` to
check that a decision stays far below a request's own latency budget (GoodServe reports 5 ms at
512 instances). Workers get random EMAs, tiers and loads; requests mix SLO classes and share
prompt prefixes, so the prefix tables and tier bookkeeping are exercised. SLOs-Serve's admission
is the real one (the core's DP per asked replica, which dominates its cost) over
`RUNNING_PER_WORKER` synthetic in-flight requests per worker.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import replace

from router.policies import ROUTING_POLICIES, RoutingPolicy, make_routing_policy
from router.policies.slos_admission import ReplicaAdmission
from router.views import RouteRequest, RunningView, WorkerView
from scheduler.core.slo import SloClass, SloSpec

SIZES = (8, 64, 512)
MAX_CALLS = 2000
MAX_SECONDS = 0.25  # per policy and size
TIERS_MS = (25.0, 50.0, 100.0)
NOW = 1.0  # router clock of every decision; requests arrive right then
RUNNING_PER_WORKER = 16  # in flight per worker, the replica state SLOs-Serve's admission reads


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


def make_requests(n: int, rng: random.Random) -> list[RouteRequest]:
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
                arrival_s=NOW,
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
            req = replace(rng.choice(requests), arrival_s=NOW - rng.uniform(0.0, 2.0))
            started = rng.random() < 2 / 3
            first = req.arrival_s + rng.uniform(0.0, NOW - req.arrival_s) if started else None
            running.setdefault(w.worker_id, []).append(
                RunningView(req, w.worker_id, generated=rng.randint(1, 100) if started else 0, first_token_s=first)
            )
    return running


def build(name: str, running: dict[str, list[RunningView]]) -> RoutingPolicy:
    if name == "slos":
        admit = ReplicaAdmission(lambda wid: running.get(wid, []), clock=lambda: NOW)
        return make_routing_policy(name, admit=admit)
    if name == "polyserve":
        return make_routing_policy(name, tiers_ms=TIERS_MS)
    return make_routing_policy(name)


def mean_us(step: Callable[[int], object]) -> float:
    calls = 0
    start = time.perf_counter()
    while calls < MAX_CALLS and time.perf_counter() - start < MAX_SECONDS:
        step(calls)
        calls += 1
    return (time.perf_counter() - start) / calls * 1e6


def time_choose(policy: RoutingPolicy, requests: list[RouteRequest], workers: list[WorkerView]) -> float:
    return mean_us(lambda i: policy.choose(requests[i], workers, NOW))


def time_migrations(requests: list[RouteRequest], workers: list[WorkerView], rng: random.Random) -> float:
    """One GoodServe risk check (tau=1) over 4 running requests per worker."""
    policy = make_routing_policy("goodserve", tau=1)
    running = [
        RunningView(requests[i % len(requests)], workers[i % len(workers)].worker_id, generated=rng.randint(0, 500))
        for i in range(4 * len(workers))
    ]
    return mean_us(lambda i: policy.migrations(running, workers, NOW))


def main() -> None:
    rng = random.Random(0)
    requests = make_requests(MAX_CALLS, rng)
    rows: dict[str, list[float]] = {}
    for n in SIZES:
        workers = make_workers(n, rng)
        running = make_running(requests, workers, random.Random(n))  # own stream: the others see the same inputs
        for name in ROUTING_POLICIES:
            rows.setdefault(name, []).append(time_choose(build(name, running), requests, workers))
        rows.setdefault("goodserve.migrations (4 running/worker)", []).append(time_migrations(requests, workers, rng))
    width = max(len(k) for k in rows)
    print(f"{'policy':<{width}}  " + "  ".join(f"{n:>9} w" for n in SIZES) + "   (mean µs per call)")
    for name, values in rows.items():
        print(f"{name:<{width}}  " + "  ".join(f"{v:>11.1f}" for v in values))


if __name__ == "__main__":
    main()
