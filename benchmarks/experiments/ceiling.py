"""How many of a workload's requests a card could finish at all: a packing estimate.

A goodput ratio against fcfs has a ceiling the policy cannot lift: at fcfs attainment a, "2x fcfs"
asks for 2a, and an overloaded card cannot serve every request however it orders them. This
estimate says where that ceiling sits, so a ratio below a paper's claim can be put on the
policy or on the setup (#18).

Each request costs what it would at the card's best batching: its prompt at the cheapest
per-token prefill the profile offers (alone or riding with a full decode batch) and each output
token at its share of a full batch's decode step (`max_running` requests of the same context).
The requests are then packed cheapest first into the card time from the first to the last
arrival, plus `tail_s` of drain. The count that fits is an optimistic estimate, not a proof:
it ignores arrival order, deadlines and the per-token pace of latency SLOs (each only lowers
it), and it credits every step with a full batch, which a card meeting TTFTs rarely has. A
policy near it has little left to win; a target above it is out of reach on that workload.

  PYTHONPATH=launch:. .venv/bin/python -m benchmarks.experiments.ceiling --gpu h100 --mix jitserve \\
      --units 2400 --rates 30,45 --seeds 0,1,2 --max-output 512
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from benchmarks.simulator.card import Card
from benchmarks.simulator.client import planned_workload, sim_requests
from benchmarks.simulator.engine import add_workload_args, workload_spec
from scheduler.core.perf_model import PerfModel
from scheduler.core.sim import SimRequest

PREFILL_CHUNKS = (512, 1024, 2048, 4096, 8192)
DRAIN_TAILS_S = (0.0, 20.0)  # the arrival window alone, and with the Tempo mix's 20 s deadline after it


@dataclass(frozen=True)
class Ceiling:
    rate: float
    seed: int
    work_per_window: float  # card seconds of work at best batching per second of arrivals (>1: overloaded even then)
    prefill_share: float  # of that work: prompts, which batching cannot compress
    fits: dict[str, float]  # "tail seconds" -> share of requests that fit, cheapest first


def prefill_cost_per_token(perf: PerfModel, max_running: int) -> float:
    """The cheapest per-token prefill on the card: a chunk alone, or its marginal cost next to a
    full decode batch."""
    full = perf.step_time(0, max_running, max_running)
    return min(
        min(perf.step_time(c, 0, 0), perf.step_time(c, max_running, max_running) - full) / c for c in PREFILL_CHUNKS
    )


def request_cost(req: SimRequest, perf: PerfModel, prefill_per_token: float, max_running: int) -> float:
    """Card seconds `req` takes at the best batching: its prompt, and its share of full-batch
    decode steps at its mean context."""
    context = req.prompt_len + req.output_len // 2
    decode = perf.step_time(0, max_running, max_running * context) / max_running
    return req.prompt_len * prefill_per_token + req.output_len * decode


def share_fitting(costs: Sequence[float], budget_s: float) -> float:
    """The share of requests whose cheapest-first running total stays within `budget_s`."""
    used, n = 0.0, 0
    for cost in sorted(costs):
        if used + cost > budget_s:
            break
        used, n = used + cost, n + 1
    return n / len(costs) if costs else 1.0


def ceiling(reqs: Sequence[SimRequest], perf: PerfModel, rate: float, seed: int, max_running: int = 256) -> Ceiling:
    per_token = prefill_cost_per_token(perf, max_running)
    costs = [request_cost(r, perf, per_token, max_running) for r in reqs]
    prefill = sum(r.prompt_len * per_token for r in reqs)
    arrivals = [r.arrival for r in reqs]
    window = max(arrivals) - min(arrivals) if reqs else 0.0
    total = sum(costs)
    return Ceiling(
        rate=rate,
        seed=seed,
        work_per_window=total / window if window > 0 else float("inf"),
        prefill_share=prefill / total if total > 0 else 0.0,
        fits={f"{tail:g}": share_fitting(costs, window + tail) for tail in DRAIN_TAILS_S},
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_args(ap, units=2400, rates="10,20,30,45")
    args = ap.parse_args(argv)
    card = Card.load(args.gpu)
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        spec = workload_spec(args, seed)
        for rate in [float(r) for r in args.rates.split(",")]:
            reqs = sim_requests(planned_workload(spec, rate, card))
            rows.append(ceiling(reqs, card.pace, rate, seed, args.max_running))
    if args.json:
        json.dump([asdict(r) for r in rows], sys.stdout, indent=1)
        return 0
    print(f"{card.name} mix={args.mix} units={args.units}: share of requests that fit, cheapest first")
    print(
        f"{'rate':>6} {'seed':>4} {'work/window':>11} {'prefill':>7}  " + "  ".join(f"+{t:g} s" for t in DRAIN_TAILS_S)
    )
    for r in rows:
        cells = "  ".join(f"{v:>5.3f}" for v in r.fits.values())
        print(f"{r.rate:>6.1f} {r.seed:>4} {r.work_per_window:>11.2f} {r.prefill_share:>7.2f}  {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
