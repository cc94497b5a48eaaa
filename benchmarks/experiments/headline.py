"""The five papers' headline experiments in the cluster simulator, at their own scale and setup as
far as our profiles and traces allow, several seeds each; one row per claim: the paper's figure,
ours, the ratio, and what differs.

Every experiment runs the very policy objects the server runs (engines on the one plan path,
routers on the live router's views) over the live benchmarks' workloads and SLO mixes, scored by
the live benchmarks' metrics. Setups (each paper's evaluation section):

- tempo: one A100 (Llama-3.1-8B -> our a100 profile), Tempo's 3:1:1 mix (latency TTFT 2 s /
  TBT 100 ms, deadline 20 s, compound 20 s x stages) on Azure conversation lengths (their chatbot
  mix of Alpaca/LMSys is not here), Poisson load sweep; vLLM-FCFS, Sarathi, Autellix (LAS),
  SJF, EDF, Tempo and Tempo with the true lengths.
- jitserve: one A100, JITServe's 1:1:1 mix, Azure conversation arrivals rescaled (their
  Microsoft trace); vLLM, Sarathi, Autellix, SJF (in place of LTR), GMAX and its oracle.
- slos-serve: one A100 (OPT-7B -> Llama-3-8B), capacity at 90 % attainment (bisection) for
  ChatBot (loose SLOs, Azure conversation), Coder (5x TTFT, 50 ms TPOT, bursty Azure code
  arrivals) and Mixed (tight/loose pairs); vLLM, Sarathi, SLOs-Serve, SLOs-Serve with
  speculation (prefill in verify batches as the paper does, alpha 0.7, draft 5 % of a decode);
  ChatBot also on 4 replicas behind its sequential router (round-robin first pick, as in §6.2).
- polyserve: 20 H100s (the paper's H200 is not profiled), PolyServe's TTFT choices and TPOT tiers
  on Azure conversation lengths (the "splitwise" trace of its Table 1), Poisson load from 50 to
  115 % of the PD-optimal rate (SLOs-Serve App. A sizing of the mix); co-located and PD pools
  (split from the same sizing); PolyServe routing on engines with the SLO levers against random
  and least-request routing on stock chunked engines.
- goodserve: one H100, one A100 and two A40s (the paper's H800/A800/A40/V100; no V100 profile),
  E2E deadlines U(1, 3) x the solo latency on the A100 (its A800 rule) times an SLO scale, on
  Mooncake conversation arrivals, lengths and prefix blocks (their agent benchmarks are not
  here); every router on stock engines.

  python -m benchmarks.experiments.headline --seeds 0,1,2 --out results/headline
  python -m benchmarks.experiments.headline --only tempo --quick
  python -m benchmarks.experiments.headline --only polyserve --tier-scale 0.457 --factors 0.5,0.7,0.85,0.9,0.95,1.0,1.15
  python -m benchmarks.experiments.headline --only slos-serve --slos-replicas 4 --slos-systems vllm,sarathi,slos

One module per paper (headline_tempo, headline_jitserve, headline_slos_serve, headline_polyserve,
headline_goodserve) over the shared grid (headline_grid) and rows (headline_report).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.cli import doc_parser
from benchmarks.experiments.headline_goodserve import goodserve
from benchmarks.experiments.headline_grid import Grid
from benchmarks.experiments.headline_jitserve import jitserve
from benchmarks.experiments.headline_polyserve import polyserve
from benchmarks.experiments.headline_report import Experiment, Row, table
from benchmarks.experiments.headline_slos_serve import SLOS_SYSTEM_LABELS, slos_serve
from benchmarks.experiments.headline_tempo import tempo

EXPERIMENTS: dict[str, Callable[..., Experiment]] = {
    "tempo": tempo,
    "jitserve": jitserve,
    "slos-serve": slos_serve,
    "polyserve": polyserve,
    "goodserve": goodserve,
}


def main(argv: list[str] | None = None) -> int:
    p = doc_parser("python -m benchmarks.experiments.headline", __doc__)
    p.add_argument("--only", default=",".join(EXPERIMENTS), help="comma list of experiments")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--quick", action="store_true", help="small runs (a smoke test, not the numbers)")
    p.add_argument("--scale-json", action="append", default=[], type=Path, help="scale-run summaries to include")
    p.add_argument(
        "--tier-scale",
        type=float,
        default=1.0,
        help="polyserve: TPOT tiers (requests' targets and router's tiers) x this; 1 = the paper's",
    )
    p.add_argument(
        "--factors",
        default="",
        help="polyserve: comma list of loads x the PD-optimal rate (default 0.5,0.7,0.85,1.0,1.15; quick 0.6,0.9,1.1)",
    )
    p.add_argument(
        "--slos-replicas",
        type=int,
        default=1,
        help="slos-serve: A100s per system (>1: baselines round-robin, SLOs-Serve its router; capacity per GPU)",
    )
    p.add_argument(
        "--slos-systems",
        default="",
        help="slos-serve: comma list of its systems to run (vllm, sarathi, slos, slos+spec; default all; "
        "vllm, sarathi and slos are needed for the ratios)",
    )
    p.add_argument("--out", type=Path, default=Path("results/headline"))
    args = p.parse_args(argv)
    if args.slos_replicas < 1:
        p.error(f"--slos-replicas must be >= 1, got {args.slos_replicas}")
    slos_systems_only = [x.strip() for x in args.slos_systems.split(",") if x.strip()]
    if slos_systems_only and not {"vllm", "sarathi", "slos"} <= set(slos_systems_only) <= set(SLOS_SYSTEM_LABELS):
        p.error(f"--slos-systems must list vllm, sarathi and slos (and may add slos+spec), got {args.slos_systems!r}")
    if not args.tier_scale > 0:
        p.error(f"--tier-scale must be > 0, got {args.tier_scale}")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    extra: dict[str, dict[str, Any]] = {
        "goodserve": {"scale_json": args.scale_json},
        "slos-serve": {"replicas": args.slos_replicas, "systems_only": slos_systems_only},
        "polyserve": {
            "tier_scale": args.tier_scale,
            "factors": [float(f) for f in args.factors.split(",") if f.strip()],
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    grid = Grid(lambda line: print(line, flush=True))
    rows: list[Row] = []
    for name in [n.strip() for n in args.only.split(",") if n.strip()]:
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        before = set(grid.results)
        exp = EXPERIMENTS[name](grid, seeds, args.quick, **extra.get(name, {}))
        exp.wall_s = time.perf_counter() - t0
        rows += exp.rows
        body = {
            "rows": [asdict(r) for r in exp.rows],
            "details": exp.details,
            "seeds": seeds,
            "wall_s": exp.wall_s,
            "runs": {"|".join(map(str, k)): v for k, v in grid.results.items() if k not in before},
        }
        (args.out / f"{name}.json").write_text(json.dumps(body, indent=1, default=str) + "\n")
        print(table(exp.rows) + f"\n({exp.wall_s:.0f} s)\n", flush=True)
    (args.out / "headline.md").write_text(table(rows) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
