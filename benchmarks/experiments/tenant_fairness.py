"""Fair shares between API keys: two tenants flood one engine at once, with and without the blend.

Tenant A sends `--ratio` times tenant B's arrival rate (A at 4x B by default), both with equal
shares, over the same mix of SLOs; together they overload the card. Each tenant's requests are
the goodput benchmark's planned workload (its own seed), tagged with the tenant as the HTTP
edge tags a keyed request (custom_params slo_tenant/slo_share), and run through the simulator
(`scheduler.core.sim`), which runs the server's policy objects on the one plan path, the fair
share blend included (scheduler/core/fairness.py). Per tenant it reports the share of served
requests and tokens (prompt + output of finished requests) and its SLO attainment, for each
blend weight f (0: the policy's order alone, the behaviour before tenancy).

With equal shares and B asking for a fifth of the load, max-min fairness serves B as if it were
alone (its demand is below its share) and gives A the rest; without the blend both are served
in proportion to what they send, so A's flood sets B's attainment.

  .venv/bin/python -m benchmarks.experiments.tenant_fairness --gpu h100 --mix tempo --rate 30 --seeds 0,1,2
  .venv/bin/python -m benchmarks.experiments.tenant_fairness --policies edf,gmax --fairness 0,0.5,1 --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.goodput.records import PlannedRequest, RequestRecord
from benchmarks.goodput.scoring import score
from benchmarks.goodput.workload import WorkloadSpec
from benchmarks.simulator.card import Card
from benchmarks.simulator.client import planned_workload, sim_requests, to_record
from scheduler.core.analyzer.spec import DEFAULT_LENGTH_PREDICTOR, live_length_bounds
from scheduler.core.plan_path import settings_for
from scheduler.core.policies import make_policy
from scheduler.core.sim import EngineConfig, SimRequest, Simulator

TENANTS = ("A", "B")


@dataclass(frozen=True)
class Flood:
    """Two tenants' planned requests, each tagged with its tenant."""

    planned: list[PlannedRequest]
    tenant_of: dict[str, str]  # rid -> tenant


def _tagged(planned: Sequence[PlannedRequest], tenant: str) -> list[PlannedRequest]:
    """A tenant's requests with rids and program ids of its own (both tenants' plans number
    them alike), as two keys' traffic would be: the edge namespaces program ids per key."""

    def rid(r: str) -> str:
        return f"{tenant}.{r}"

    out = []
    for p in planned:
        r = p.req
        req = dataclasses.replace(
            r,
            rid=rid(r.rid),
            parents=tuple(rid(x) for x in r.parents),
            program_id=None if r.program_id is None else rid(r.program_id),
        )
        slo = dict(p.slo)
        if slo.get("program_id") is not None:
            slo["program_id"] = rid(str(slo["program_id"]))
        out.append(dataclasses.replace(p, req=req, slo=slo))
    return out


def flood(card: Card, args: argparse.Namespace, seed: int) -> Flood:
    """A at `ratio`/(1+ratio) of `rate`, B at the rest, over the same window."""
    rate_b = args.rate / (1.0 + args.ratio)
    units_b = max(1, round(args.units / (1.0 + args.ratio)))
    planned: list[PlannedRequest] = []
    tenant_of: dict[str, str] = {}
    for tenant, rate, units, offset in (
        ("A", args.rate - rate_b, args.units - units_b, 0),
        ("B", rate_b, units_b, 7919),
    ):
        spec = WorkloadSpec(
            trace=args.trace,
            units=units,
            mix=args.mix,
            seed=seed + offset,
            max_prompt=args.max_prompt,
            max_output=args.max_output,
            arrivals="poisson",
        )
        for p in _tagged(planned_workload(spec, rate, card), tenant):
            planned.append(p)
            tenant_of[p.req.rid] = tenant
    return Flood(planned, tenant_of)


def _sim_requests(f: Flood) -> list[SimRequest]:
    """The load generator's requests, each tagged with its tenant as the HTTP edge tags it."""
    return [dataclasses.replace(r, tenant=f.tenant_of[r.rid], share=1.0) for r in sim_requests(f.planned)]


def run(f: Flood, policy: str, fairness: float, card: Card, max_running: int) -> list[RequestRecord]:
    """One policy and blend weight over both tenants' requests on one card."""
    engine_policy = make_policy(policy, card.plan_with)
    settings = dataclasses.replace(settings_for(engine_policy), tenant_fairness=fairness)
    sim = Simulator(
        engine_policy,
        card.pace,
        EngineConfig(max_running_requests=max_running, chunk_size=8192, total_kv_tokens=card.kv_tokens, overlap=True),
        settings=settings,
        plan_perf=card.plan_with,
        lengths=live_length_bounds(DEFAULT_LENGTH_PREDICTOR),
    )
    result = sim.run(_sim_requests(f))
    starts = {rid: rec.req.arrival for rid, rec in result.records.items()}
    program_starts: dict[str, float] = {}
    for p in f.planned:
        pid = p.req.program_id
        if pid is not None and p.req.rid in starts:
            program_starts[pid] = min(program_starts.get(pid, starts[p.req.rid]), starts[p.req.rid])
    return [to_record(p, result.records.get(p.req.rid), program_starts) for p in f.planned]


def _tokens_by(r: RequestRecord, end_s: float) -> int:
    """Tokens served to `r` by `end_s`: its prompt once its first token is out, and its outputs."""
    out = sum(1 for t in r.token_s if t <= end_s)
    return out + (r.prompt_tokens if out else 0)


def per_tenant(records: Sequence[RequestRecord], tenant_of: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """Each tenant's share of served requests and tokens, over the run and over the flood (until
    the last arrival, while both tenants keep sending), and its attainment."""
    served = {t: [r for r in records if tenant_of[r.key] == t and r.finished] for t in TENANTS}
    n_all = sum(len(v) for v in served.values()) or 1
    tokens = {t: sum(r.prompt_tokens + len(r.token_s) for r in v) for t, v in served.items()}
    tok_all = sum(tokens.values()) or 1
    end = max(r.scheduled_s for r in records)
    in_flood = {t: sum(_tokens_by(r, end) for r in records if tenant_of[r.key] == t) for t in TENANTS}
    flood_all = sum(in_flood.values()) or 1
    out = {}
    for t in TENANTS:
        mine = [r for r in records if tenant_of[r.key] == t]
        m = score(mine)
        out[t] = {
            "requests": len(mine),
            "served_share": len(served[t]) / n_all,
            "token_share": tokens[t] / tok_all,
            "flood_token_share": in_flood[t] / flood_all,
            "attainment": m.attainment,
            "attained": m.attained,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--mix", default="tempo")
    ap.add_argument("--trace", default="azure-conv")
    ap.add_argument("--rate", type=float, default=30.0, help="both tenants together, arrival units per second")
    ap.add_argument("--ratio", type=float, default=4.0, help="A's rate over B's")
    ap.add_argument("--units", type=int, default=1500, help="both tenants together")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--policies", default="edf")
    ap.add_argument("--fairness", default="0,0.5,1", help="blend weights f to compare (0: no blend)")
    ap.add_argument("--max-running", type=int, default=256)
    ap.add_argument("--max-prompt", type=int, default=4096)
    ap.add_argument("--max-output", type=int, default=1024)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    card = Card.load(args.gpu)
    weights = [float(x) for x in args.fairness.split(",")]
    rows: dict[tuple[str, float], list[dict[str, dict[str, float]]]] = {}
    for seed in [int(s) for s in args.seeds.split(",")]:
        f = flood(card, args, seed)
        for policy in [p for p in args.policies.split(",") if p]:
            for w in weights:
                rows.setdefault((policy, w), []).append(
                    per_tenant(run(f, policy, w, card, args.max_running), f.tenant_of)
                )
    summary: list[dict[str, Any]] = []
    for (policy, w), runs in rows.items():
        row: dict[str, Any] = {"policy": policy, "fairness": w}
        for t in TENANTS:
            for key in ("served_share", "token_share", "flood_token_share", "attainment"):
                values = [r[t][key] for r in runs]
                row[f"{t}_{key}"] = statistics.mean(values)
                row[f"{t}_{key}_range"] = (min(values), max(values))
        row["attained"] = statistics.mean(sum(r[t]["attained"] for t in TENANTS) for r in runs)
        summary.append(row)
    if args.json:
        json.dump(summary, sys.stdout, indent=1)
        return 0
    print(
        f"{card.name} mix={args.mix} rate={args.rate}/s A:B={args.ratio:g}:1 equal shares "
        f"units={args.units} seeds={args.seeds} (means; min-max over seeds)"
    )
    print("served/tokens: shares over the whole run; flood: share of tokens served until the last arrival")
    print(
        f"{'policy':<8} {'f':>4}  {'A served':>8} {'tokens':>6} {'flood':>5} {'A attain':>15}  "
        f"{'B served':>8} {'tokens':>6} {'flood':>5} {'B attain':>15}  {'attained':>8}"
    )
    for row in summary:
        cells = []
        for t in TENANTS:
            lo, hi = row[f"{t}_attainment_range"]
            shares = f"{row[f'{t}_served_share']:>8.3f} {row[f'{t}_token_share']:>6.3f}"
            cells.append(
                f"{shares} {row[f'{t}_flood_token_share']:>5.3f} {row[f'{t}_attainment']:>5.3f} ({lo:.2f}-{hi:.2f})"
            )
        print(f"{row['policy']:<8} {row['fairness']:>4.2f}  {cells[0]}  {cells[1]}  {row['attained']:>8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
