"""Capacity with and without speculation in the cluster simulator (issue #48): capacity at 90 %
attainment by the headline's bisection, on the headline's SLOs-Serve scenarios plus tight-TPOT
chat tiers (ChatBot's TTFT with a 20 or 10 ms H100 TPOT, scaled to the card like every mix),
where drafting is meant to pay. Two families of systems:

- SLOs-Serve's (one A100): Sarathi, SLOs-Serve, and SLOs-Serve with the SLO-adaptive length
  and prefill in verify batches (the paper's design; alpha 0.7, draft 5 % of a decode);
- SGLang's EAGLE as the live benchmark runs it (one H100, EDF): no speculation, fixed lengths
  1-4 and `--slo-speculation`, mixed batches whose steps with prefill decode without drafts,
  alpha 0.8 and a draft pass at 0.1 of a decode (benchmarks.experiments.emulated_speculation).

One JSON record per (scenario, seed, system), merged into --out.

  python -m benchmarks.experiments.spec_capacity --scenarios chatbot,mixed --seeds 0,1,2 --out spec.json
  python -m benchmarks.experiments.spec_capacity --systems edf,edf+fixed3,edf+slo --scenarios chat-tight10
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from benchmarks.cli import doc_parser
from benchmarks.experiments.headline_grid import TARGET, Config, Grid
from benchmarks.experiments.headline_slos_serve import SLOS_SCENARIOS, Scenario
from benchmarks.goodput.capacity import search_capacity
from benchmarks.goodput.workload import SEED_SPAN_S
from benchmarks.simulator.runner import slo_scale
from benchmarks.simulator.speculative_decoding import DECODE_ONLY, IN_VERIFY

TIGHT_CHAT = ("chat-tight", "chat-tight10")  # mixes slos-chat-tight(10): 20 and 10 ms H100 TPOTs
EAGLE_ALPHA = 0.8  # the live EAGLE run's stated acceptance
EAGLE_DRAFT_RATIO = 0.1  # and its draft pass's cost / a target decode pass's
SYSTEMS = {
    "sarathi": Config("sarathi", "a100:1", policy="sarathi"),
    "slos": Config("slos", "a100:1", policy="slos"),
    "slos+spec": Config("slos+spec", "a100:1", policy="slos", speculation="slo", spec_layout=IN_VERIFY),
    "edf": Config("edf", "h100:1", policy="edf"),
    **{
        f"edf+{name}": Config(
            f"edf+{name}",
            "h100:1",
            policy="edf",
            speculation=mode,
            spec_layout=DECODE_ONLY,
            spec_alpha=EAGLE_ALPHA,
            draft_ratio=EAGLE_DRAFT_RATIO,
        )
        for name, mode in (*((f"fixed{s}", f"fixed:{s}") for s in (1, 2, 3, 4)), ("slo", "slo"))
    },
}


def scenarios() -> dict[str, Scenario]:
    """The headline's scenarios and the tight-TPOT chat tiers."""
    return {**SLOS_SCENARIOS, **{name: Scenario("azure-conv", f"slos-{name}") for name in TIGHT_CHAT}}


def main(argv: list[str] | None = None) -> int:
    p = doc_parser("python -m benchmarks.experiments.spec_capacity", __doc__)
    p.add_argument("--scenarios", default="chatbot,coder,mixed,chat-tight")
    p.add_argument("--systems", default="slos,slos+spec,sarathi")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--units", type=int, default=800)
    p.add_argument("--probes", type=int, default=7)
    p.add_argument("--start", type=float, default=4.0, help="the bisection's first rate (units/s)")
    p.add_argument("--rel-tol", type=float, default=0.05, help="the bisection stops within this share of the rate")
    p.add_argument(
        "--seed-windows",
        action="store_true",
        help="seed k takes the trace window starting k x 600 s, as the live benchmark does "
        "(else trace-arrival scenarios are the same run on every seed)",
    )
    p.add_argument("--out", type=Path, default=Path("results/spec_capacity.json"))
    args = p.parse_args(argv)
    table = scenarios()
    grid = Grid(lambda line: print(line, flush=True))
    res = json.loads(args.out.read_text()) if args.out.exists() else {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for scenario in args.scenarios.split(","):
        for seed in [int(s) for s in args.seeds.split(",")]:
            start = seed * SEED_SPAN_S if args.seed_windows else 0.0
            spec = table[scenario].spec(args.units, seed, start_s=start)
            for label in args.systems.split(","):
                cfg, t0 = SYSTEMS[label], time.perf_counter()
                scale = slo_scale(1.0, cfg.pool.split(":")[0])  # the mix's targets on this card
                r = search_capacity(
                    lambda x, cfg=cfg, spec=spec, scenario=scenario, scale=scale: grid.run(
                        cfg, spec, x, scale, scenario
                    )["attainment"],
                    start_rate=args.start,
                    target=TARGET,
                    max_probes=args.probes,
                    rel_tol=args.rel_tol,
                )
                res[f"{scenario}|{seed}|{label}"] = {
                    "capacity": r.capacity_rate or 0.0,
                    "probes": r.probes,
                    "wall_s": time.perf_counter() - t0,
                }
                print(f"== {scenario} seed {seed} {label}: capacity {r.capacity_rate}", flush=True)
                args.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
