"""JITServe's distance to its oracle with each length predictor: the headline experiment's JITServe
setup (one simulated A100, the 1:1:1 mix on Azure conversation arrivals, GMAX maximising token
goodput), GMAX bounded by each `--predictors` spec against GMAX shown the true lengths.

The gap at a load is 1 - GMAX's token goodput / its oracle's (the headline's row), so it isolates
what the length bound costs. Every predictor is fresh per run, as on a freshly started server.

  python -m benchmarks.predictor.oracle_gap --seeds 0,1,2 --json /tmp/oracle_gap.json
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.cli import doc_parser
from benchmarks.experiments.headline_grid import Config, Grid, workload_spec
from benchmarks.simulator.cluster import ClusterConfig
from benchmarks.simulator.runner import slo_scale

RATES = (4.0, 5.0, 6.5, 8.0, 10.0)  # the headline's JITServe loads (units/s)
TOKENS = (("objective", "tokens"),)  # the paper's headline metric, as the headline runs GMAX


@dataclasses.dataclass(frozen=True)
class PredictedConfig(Config):
    """A headline config whose engines bound lengths with `length_predictor`."""

    length_predictor: str | None = None

    def cluster(self, seed: int) -> ClusterConfig:
        base = super().cluster(seed)
        return dataclasses.replace(
            base, engine=dataclasses.replace(base.engine, length_predictor=self.length_predictor)
        )


def main(argv: Sequence[str] | None = None) -> int:
    ap = doc_parser("python -m benchmarks.predictor.oracle_gap", __doc__ or "")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES))
    ap.add_argument("--units", type=int, default=2000, help="arrival units per run (the headline's)")
    ap.add_argument("--predictors", default="history:0.9,trained:0.9", help="GMAX's length predictors to compare")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    rates = [float(r) for r in args.rates.split(",")]
    specs = args.predictors.split(",")
    grid = Grid(lambda line: print(line, file=sys.stderr, flush=True))
    scale = slo_scale()
    configs = [
        PredictedConfig(f"gmax@{s}", "a100:1", policy="gmax", policy_params=TOKENS, length_predictor=s) for s in specs
    ]
    configs.append(PredictedConfig("gmax_oracle", "a100:1", policy="gmax_oracle", policy_params=TOKENS))
    for seed in seeds:
        spec = workload_spec("azure-conv", "jitserve", args.units, seed, arrivals="trace")
        for rate in rates:
            for cfg in configs:
                grid.run(cfg, spec, rate, scale)
    out: dict[str, dict[str, object]] = {}
    for s in specs:
        per_rate = {}
        for rate in rates:
            gaps = [
                1
                - grid.results[(f"gmax@{s}", "jitserve", round(rate, 6), seed)]["jitserve_tok_s"]
                / max(grid.results[("gmax_oracle", "jitserve", round(rate, 6), seed)]["jitserve_tok_s"], 1e-9)
                for seed in seeds
            ]
            per_rate[f"{rate:g}"] = {"mean": statistics.mean(gaps), "per_seed": gaps}
        out[s] = per_rate
        print(
            f"{s}: gap to the oracle (token goodput) per load: "
            + ", ".join(f"{r}/s {100 * v['mean']:.1f} %" for r, v in per_rate.items())
        )
    if args.json:
        blob = {"args": vars(args), "gap": out, "runs": {"|".join(map(str, k)): v for k, v in grid.results.items()}}
        Path(args.json).write_text(json.dumps(blob, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
