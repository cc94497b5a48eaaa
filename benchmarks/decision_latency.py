"""Per-step decision latency of every registered SLO policy, and of the SLOs-Serve DP.

Builds seeded synthetic EngineViews with a realistic mix of SLO classes (interactive and
tight latency, deadline, compound, best effort) at 100, 1 000 and 10 000 queued requests and
times each policy's plan(); then times the DP alone with 10 new + 200 running requests.
Policies are taken from the POLICIES registry, so ones added later are measured too.

Run from the repository root: `python benchmarks/decision_latency.py [--json]`; the repo root
is put on sys.path by this script, so no PYTHONPATH is needed.
Targets: tempo and gmax < 2 ms at 1 000 and < 20 ms at 10 000 queued; the DP < 5 ms.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.core.perf_model import default_model  # noqa: E402
from scheduler.core.policies import POLICIES  # noqa: E402
from scheduler.core.slo import SloClass, SloSpec  # noqa: E402
from scheduler.core.slos_serve.dp import DpItem, TierBudget, admit  # noqa: E402
from scheduler.core.types import EngineView, RequestView  # noqa: E402

NOW = 1000.0
SIZES = (100, 1_000, 10_000)
TARGETS_MS = {"tempo": {1_000: 2.0, 10_000: 20.0}, "gmax": {1_000: 2.0, 10_000: 20.0}}
DP_TARGET_MS = 5.0

# (weight in the mix, SloSpec factory): shares loosely follow a chat-heavy production mix.
CLASSES = (
    (0.35, lambda rng, i: SloSpec(ttft_ms=500, tpot_ms=50, slo_class=SloClass.LATENCY)),
    (0.15, lambda rng, i: SloSpec(ttft_ms=200, tpot_ms=25, slo_class=SloClass.LATENCY)),
    (0.20, lambda rng, i: SloSpec(deadline_ms=rng.choice([10e3, 30e3, 60e3]), slo_class=SloClass.DEADLINE)),
    (
        0.10,
        lambda rng, i: SloSpec(
            deadline_ms=30e3, slo_class=SloClass.COMPOUND, program_id=f"p{i % 97}", stage=rng.randrange(4)
        ),
    ),
    (0.20, lambda rng, i: SloSpec()),
)


def make_request(rng: random.Random, i: int, running: bool) -> RequestView:
    factory = rng.choices([f for _, f in CLASSES], weights=[w for w, _ in CLASSES])[0]
    slo = factory(rng, i)
    arrival = NOW - rng.uniform(0.0, 3.0)
    prompt = int(min(16_000, rng.lognormvariate(6.2, 1.0)))
    generated = rng.randrange(1, 300) if running else 0
    program_arrival = arrival - rng.uniform(0, 5) if slo.slo_class is SloClass.COMPOUND else None
    return RequestView(
        rid=f"{'r' if running else 'w'}{i}",
        slo=slo,
        arrival=arrival,
        prompt_len=prompt,
        generated=generated,
        max_new_tokens=rng.choice([256, 512, 1024, 2048]),
        predicted_output_len=rng.lognormvariate(5.0, 0.8) if rng.random() < 0.7 else None,
        first_token_time=arrival + 0.2 if running else None,
        prefix_cached=rng.choice([0, 0, 0, prompt // 2]),
        program_arrival=program_arrival,
        attained_service=rng.uniform(0, 2000) if slo.slo_class is SloClass.COMPOUND else 0.0,
    )


def make_view(queued: int, running: int, seed: int = 0) -> EngineView:
    rng = random.Random(seed)
    return EngineView(
        now=NOW,
        waiting=[make_request(rng, i, False) for i in range(queued)],
        running=[make_request(rng, i, True) for i in range(running)],
        max_running_requests=256,
        chunk_size=8192,
        free_kv_tokens=600_000,
        total_kv_tokens=1_000_000,
        step=10,
    )


def time_ms(fn, repeats: int) -> float:
    fn()  # warm caches and lazy state once
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(samples)


def bench_policies(running: int = 64) -> dict[str, dict[int, float | str]]:
    views = {n: make_view(n, running, seed=n) for n in SIZES}
    out: dict[str, dict[int, float | str]] = {}
    for name, factory in POLICIES.items():
        row: dict[int, float | str] = {}
        try:
            policy = factory()
        except TypeError as exc:  # a policy that cannot be built without arguments
            out[name] = {n: f"skipped: {exc}" for n in SIZES}
            continue
        for n in SIZES:
            repeats = max(3, 20_000 // (n + 200))
            try:
                row[n] = time_ms(lambda p=policy, v=views[n]: p.plan(v), repeats)
            except Exception as exc:  # report, keep measuring the others
                row[n] = f"error: {type(exc).__name__}: {exc}"
        out[name] = row
    return out


def bench_dp(new: int = 10, running: int = 200, seed: int = 7) -> dict[str, float]:
    """The SLOs-Serve DP alone (10 new, 200 running decoders in 3 TPOT tiers), and the slos
    policy's whole plan() on the same load."""
    rng = random.Random(seed)
    tiers = [0.025, 0.05, 0.1]
    base = (60, 80, 40, 20)
    items = [
        DpItem(
            f"n{i}",
            NOW + rng.uniform(0.2, 2.0),
            rng.randrange(100, 3000),
            rng.randrange(200, 4000),
            rng.randrange(-1, 3),
        )
        for i in range(new)
    ]
    perf = default_model()

    def run() -> None:
        admit(items, TierBudget(perf, tiers, 400_000, 8192), base, NOW, 600_000, 512)

    view = make_view(new, running, seed)
    policy = POLICIES["slos"]() if "slos" in POLICIES else None
    result = {"dp_10_new_200_running_ms": time_ms(run, 50)}
    if policy is not None:
        result["slos_plan_10_new_200_running_ms"] = time_ms(lambda: policy.plan(view), 50)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    policies = bench_policies()
    dp = bench_dp()
    if args.json:
        print(json.dumps({"queued": list(SIZES), "policies_ms": policies, "dp_ms": dp}, indent=2))
        return
    print(f"{'policy':<10}" + "".join(f"{n:>12,}" for n in SIZES) + "   (median ms per plan(), 64 running)")
    for name, row in policies.items():
        cells = []
        for n in SIZES:
            v = row[n]
            flag = ""
            if isinstance(v, float) and n in TARGETS_MS.get(name, {}):
                flag = " ok" if v < TARGETS_MS[name][n] else " !!"
            cells.append(f"{v:>9.3f}{flag:<3}" if isinstance(v, float) else f"{str(v)[:11]:>12}")
        print(f"{name:<10}" + "".join(cells))
    for key, v in dp.items():
        flag = (" ok" if v < DP_TARGET_MS else " !!") if key.startswith("dp_") else ""
        print(f"{key:<34}{v:>9.3f}{flag}")


if __name__ == "__main__":
    main()
