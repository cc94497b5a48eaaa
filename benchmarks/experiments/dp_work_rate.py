"""The SLOs-Serve DP's work units per millisecond on this host: what
scheduler/core/work_budget.UNITS_PER_MS assumes when a policy states its search budget in ms.
Random admissions of 8-48 items in 1-10 TPOT tiers, some forced, each solved unbounded with a
meter; the rate is units over the best of three times. Run by the decision-latency benchmark
(`--part plan-path`)."""

from __future__ import annotations

import math
import random
import time

import numpy as np

from benchmarks.experiments.plan_path_states import ENGINE_NOW
from scheduler.core.perf_model import default_model
from scheduler.core.slos_serve.dp import DpItem, TierBudget
from scheduler.core.slos_serve.soft_admission import admit
from scheduler.core.work_budget import UNITS_PER_MS, WorkBudget


def dp_units_per_ms(cases: int = 40, seed: int = 11) -> dict[str, float]:
    """The SLOs-Serve DP's work units (scheduler/core/work_budget.py) per ms of this host, over
    random admissions of 8-48 items in 1-10 tiers, some forced: the rate UNITS_PER_MS assumes.
    `low` is the slowest case's (a budget in ms holds on this host if UNITS_PER_MS <= it)."""
    perf = default_model()
    rates, units, ms = [], 0, 0.0
    for k in range(cases):
        rng = random.Random(seed + k)
        n, tiers_n = rng.choice([8, 16, 24, 32, 48]), rng.choice([1, 3, 6, 10])
        tiers = sorted(rng.uniform(0.06, 0.3) for _ in range(tiers_n))
        forced = rng.choice([0.0, 0.3, 0.8])
        items = [
            DpItem(
                f"n{i}",
                ENGINE_NOW + rng.uniform(0.05, 5.0),
                rng.randrange(50, 2000),
                rng.randrange(200, 3000),
                rng.randrange(-1, tiers_n),
                1.0,
                rng.random() < forced,
            )
            for i in range(n)
        ]
        base = tuple([rng.randrange(0, 30) for _ in range(tiers_n)] + [10])
        best = math.inf
        for _ in range(3):
            meter = WorkBudget(None)
            t0 = time.perf_counter()
            admit(items, TierBudget(perf, tiers, 400_000, 8192), base, ENGINE_NOW, 600_000, 512, 24, meter)
            best = min(best, (time.perf_counter() - t0) * 1000.0)
        if best > 0.05:  # below that the timer, not the DP, is measured
            rates.append(meter.spent / best)
            units, ms = units + meter.spent, ms + best
    return {"mean": units / ms, "low": min(rates), "p10": float(np.percentile(rates, 10)), "assumed": UNITS_PER_MS}
