"""The scale run: hundreds of simulated instances behind one router at thousands of requests/s.

GoodServe (§4.3) simulates 8 to 512 instances at 1k to 10k requests/s to show its router keeps
up (5 ms per decision at 512 instances and 10k RPS). This runs that load through the simulator
with the real routing policy and engine policies, and reports what it cost here: wall time,
peak memory, events, the routing decision latency measured inside the run (views, PD partner,
choose, as the dispatcher times them) and what the requests got. Requests are scored as they
end (no token times kept), so memory stays flat in the run's length.

  python -m benchmarks.experiments.scale --pool h100:512 --rate 10000 --duration 60 --routing goodserve
"""

from __future__ import annotations

import json
import resource
import sys
import time
from dataclasses import asdict

from benchmarks.cli import doc_parser
from benchmarks.goodput.workload import WorkloadSpec, plan
from benchmarks.simulator.cluster import ClusterConfig
from benchmarks.simulator.pool import PoolSpec
from benchmarks.simulator.runner import Run, simulate, slo_scale
from benchmarks.simulator.worker import EngineOptions


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux


def main(argv: list[str] | None = None) -> int:
    p = doc_parser("python -m benchmarks.experiments.scale", __doc__)
    p.add_argument("--pool", default="h100:512")
    p.add_argument("--rate", type=float, default=10_000.0, help="requests/s")
    p.add_argument("--duration", type=float, default=60.0, help="simulated seconds of arrivals")
    p.add_argument("--routing", default="goodserve")
    p.add_argument("--policy", default="fcfs", help="engine policy")
    p.add_argument("--trace", default="azure-conv")
    p.add_argument("--mix", default="tempo")
    p.add_argument("--slo-relative-to", help="rescale the mix's targets to this card (goodserve's: a100)")
    p.add_argument("--max-output", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the summary here too")
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    spec = WorkloadSpec(
        trace=args.trace,
        units=int(args.rate * args.duration),
        arrivals="poisson",
        max_prompt=8192,
        max_output=args.max_output,
        mix=args.mix,
        seed=args.seed,
        cycle=True,
    )
    scale = slo_scale(1.0, args.slo_relative_to)
    planned = plan(spec, args.rate, scale)
    plan_s = time.perf_counter() - t0
    rss_planned = peak_rss_gb()
    config = ClusterConfig(
        pool=PoolSpec.parse(args.pool),
        engine=EngineOptions(policy=args.policy),
        routing=args.routing,
        seed=args.seed,
        stream_scores=True,
    )
    body, result = simulate(Run(args.routing, spec, args.rate, scale, config), planned)
    m = body["metrics"]
    out = {
        "pool": args.pool,
        "instances": config.pool.size,
        "rate_rps": args.rate,
        "simulated_arrivals_s": args.duration,
        "requests": len(planned),
        "routing": args.routing,
        "engine_policy": args.policy,
        "workload": asdict(spec),
        "plan_wall_s": round(plan_s, 1),
        "sim_wall_s": round(result.wall_s, 1),
        "total_wall_s": round(time.perf_counter() - t0, 1),
        "simulated_end_s": round(result.end_s, 1),
        "events": result.events,
        "engine_steps": sum(w["steps"] for w in result.workers.values()),
        "peak_rss_gb": round(peak_rss_gb(), 2),
        "rss_after_planning_gb": round(rss_planned, 2),
        "decision_us": {k: None if v is None else round(v, 1) for k, v in result.decision_us().items()},
        "router": result.counters,
        "attainment": round(m.attainment, 4),
        "goodput_rps": round(m.goodput_rps or 0.0, 1),
        "ttft_ms": m.ttft_ms,
        "tpot_ms": m.tpot_ms,
        "finished": m.finished,
        "cut": m.cut,
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
