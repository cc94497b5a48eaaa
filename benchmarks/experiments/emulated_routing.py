"""Every routing policy side by side on one emulated heterogeneous pool.

One pool of emulated workers (default H100 + A100 + A40 + A40, Llama-3-8B profiles, every forward
pass K = --slowdown times slower so four workers keep pace on a small CPU) is started once. For
every run the router alone is restarted with the run's policy on the same worker port, and the
workers' prefix caches are flushed, so each policy starts from the same state. Every policy gets
the same planned workload (trace slice, seed, prompts, SLOs) per mix:

- goodserve: GoodServe's setup (§5), E2E deadline = U(1, 3) x the request's solo latency on a
  mid-tier GPU (the paper measures it on an A800; we take our A100 profile);
- polyserve: PolyServe's TTFT choices and TPOT tiers (the polyserve router gets the tiers).

SLOs are the mixes' H100 + Llama-3-8B targets (what the h100 profile emulates) times
--slo-scale (default K). True lengths travel in the hidden hint, which the
router passes through and shortens on resumes. Per mix, results.json/results.md and plots go to
--out/<mix>; --out/results.md has every table, with goodserve's goodput over the best other
policy's (GoodServe reports +27 % over the second-best router). Exit status 1 if a request was
lost (or a run's numbers are inconsistent).

  PYTHONPATH=launch:. .venv/bin/python -m benchmarks.experiments.emulated_routing          # ~25 min
  PYTHONPATH=launch:. .venv/bin/python -m benchmarks.experiments.emulated_routing --quick \\
      --policies round_robin,goodserve
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import requests

from benchmarks._server import prepare_live_cluster, resolve_model
from benchmarks.cli import doc_parser, policy_overrides
from benchmarks.goodput.emulation_validity import emulation_counters, invalid_note, late_cell, pacing_delta, verdict
from benchmarks.goodput.harness import (
    Target,
    add_drain_args,
    header_run,
    load_options,
    run_once,
    uniform_length_control,
)
from benchmarks.goodput.loadgen import LoadGenerator, PromptFor
from benchmarks.goodput.mixes import MIXES, POLYSERVE_TPOT_TIERS, Calibration, Scale, profile_zero_load
from benchmarks.goodput.records import PlannedRequest
from benchmarks.goodput.report import describe, markdown_table, plot, read_results, write_results
from benchmarks.goodput.scoring import RunMetrics, check_consistency, score
from benchmarks.goodput.workload import WorkloadSpec, plan
from benchmarks.workloads.text import PromptText
from benchmarks.workloads.traces import TRACES
from launch_cluster import Cluster, RouterSpec, WorkerSpec
from launch_cluster_spec import parse_cluster
from router.policies import ROUTING_POLICIES

OURS = "goodserve"  # the policy whose lead the paper reports (+27 % goodput over the second best)
GOODSERVE_BASE_GPU = "a100"  # GoodServe §5: deadlines scale a solo run on a mid-tier GPU (A800)
POLYSERVE_RELEASE_S = 10.0  # PolyServePolicy's release_after_s default, in the card's own time
FLUSH_TIMEOUT_S = 60.0  # a worker flushes its cache only when idle: wait that long for it
# Full-run and --quick defaults for the options left unset (sized for a 2-core host at K = 8).
FULL = {"units": 80, "rates": "3", "max_output": 128, "drain_timeout": 120.0, "warmup": 8}
QUICK = {"units": 12, "rates": "3", "max_output": 32, "drain_timeout": 60.0, "warmup": 4}


# --------------------------------------------------------------------------------------------
# Options


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser("python -m benchmarks.experiments.emulated_routing", __doc__)
    pool = p.add_argument_group("pool")
    pool.add_argument("--pool", default="h100,a100,a40,a40", help="emulated cards, one worker each")
    pool.add_argument("--slowdown", type=float, default=8.0, help="--emulate-slowdown K of every worker")
    pool.add_argument("--slo-policy", default="edf", help="every worker's --slo-policy")
    pool.add_argument("--max-running-requests", type=int, default=32, help="every worker's batch cap")
    pool.add_argument("--worker-arg", action="append", default=[], help="extra worker flag (repeatable, use =)")
    pool.add_argument("--router-arg", action="append", default=[], help="extra router flag (repeatable, use =)")
    pool.add_argument("--policies", default="all", help="routing policies, comma-separated (default: all)")
    pool.add_argument(
        "--policy-param",
        action="append",
        default=[],
        metavar="POLICY:KEY=JSON",
        help="a --routing-policy-param for one policy (repeatable), e.g. goodserve:tau=20",
    )
    w = p.add_argument_group("workload")
    w.add_argument("--mixes", default="goodserve,polyserve", help="SLO mixes, one table each")
    w.add_argument("--trace", default="azure-conv", choices=sorted(TRACES))
    w.add_argument("--data-dir", help="traces folder (default $SGLANG_SLO_DATA or ../shared/data)")
    w.add_argument(
        "--units", type=int, help=f"arrival units per run (default {FULL['units']}, --quick {QUICK['units']})"
    )
    w.add_argument("--rates", help=f"units/s in wall time, comma-separated (default {FULL['rates']})")
    w.add_argument("--length-scale", type=float, default=0.5, help="trace lengths times this")
    w.add_argument("--max-prompt", type=int, default=1024)
    w.add_argument("--max-output", type=int, help=f"(default {FULL['max_output']}, --quick {QUICK['max_output']})")
    w.add_argument("--slo-scale", type=float, help="the mixes' H100 targets times this (default: --slowdown)")
    w.add_argument("--seed", type=int, default=0)
    r = p.add_argument_group("run")
    r.add_argument("--length-control", choices=("hint", "client"), default="hint", help="how true lengths end")
    r.add_argument("--client-max-tokens", type=int, help="max_new_tokens clients send (default: --max-output)")
    r.add_argument("--drain-timeout", type=float, help="s after the last arrival before cutting (default 120)")
    add_drain_args(r)
    r.add_argument("--warmup", type=int, help="requests sent through the router before the first run (default 8)")
    r.add_argument("--quick", action="store_true", help="a smoke run: few, short requests")
    r.add_argument("--out", type=Path, default=Path("results/routing"))
    r.add_argument("--no-plots", action="store_true")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument(
        "--rescore",
        action="store_true",
        help="start nothing: re-score the runs already in --out (per offered window) and rewrite the tables",
    )
    args = p.parse_args(argv)
    try:
        resolve_options(args)
    except ValueError as e:
        p.error(str(e))
    return args


def resolve_options(args: argparse.Namespace) -> None:
    """Fill unset options (full or --quick defaults) and split and check the lists."""
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.policy_list = list(ROUTING_POLICIES) if args.policies == "all" else _csv(args.policies)
    args.mix_list = _csv(args.mixes)
    args.pool_list = _csv(args.pool)
    args.rate_list = [float(x) for x in _csv(args.rates)]
    unknown = [x for x in args.policy_list if x not in ROUTING_POLICIES]
    if unknown:
        raise ValueError(f"unknown routing policy {unknown[0]!r}; known: {', '.join(ROUTING_POLICIES)}")
    if bad := [x for x in args.mix_list if x not in MIXES]:
        raise ValueError(f"unknown SLO mix {bad[0]!r}; known: {', '.join(MIXES)}")
    if not (args.policy_list and args.mix_list and args.pool_list and args.rate_list):
        raise ValueError("--policies, --mixes, --pool and --rates need at least one entry each")
    if args.slowdown < 1:
        raise ValueError("--slowdown must be >= 1")
    args.slo_scale = args.slo_scale or args.slowdown
    args.client_max_tokens = args.client_max_tokens or args.max_output
    args.overrides = policy_overrides(args.policy_param, ROUTING_POLICIES)
    args.workers = worker_specs(args)  # an unknown card fails here, before anything starts
    # What harness.run_once reads besides the above.
    args.control = uniform_length_control(args.length_control, [])
    args.duration, args.bin_s = None, None


# --------------------------------------------------------------------------------------------
# Pool and router


def mix_scale(mix: str, number: float) -> Scale:
    """The mix's SLOs on this pool: the goodserve mix's deadlines are relative to a solo run on the
    mid-tier card, as in the paper; the other mixes keep their H100 targets. Both times K."""
    if mix == "goodserve":
        return Scale(number, Calibration(**asdict(profile_zero_load(GOODSERVE_BASE_GPU))))
    return Scale.from_option(number)


def policy_params(policy: str, scale: Scale, overrides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Router parameters of one policy. PolyServe gets the mix's TPOT tiers, scaled and rounded
    like the requests' TPOTs (0.1 ms), so each request bins into its own tier; its scale-down
    timer is stretched by the same factor, as everything in the card's time is."""
    params: dict[str, Any] = {}
    if policy == "polyserve":
        params["tiers_ms"] = [round(t * scale.tpot_factor, 1) for t, _ in POLYSERVE_TPOT_TIERS]
        params["release_after_s"] = POLYSERVE_RELEASE_S * scale.tpot_factor
    return {**params, **overrides.get(policy, {})}


def router_spec(policy: str, scale: Scale, args: argparse.Namespace) -> RouterSpec:
    return RouterSpec(policy=policy, params=policy_params(policy, scale, args.overrides), args=list(args.router_arg))


def worker_specs(args: argparse.Namespace) -> list[WorkerSpec]:
    """One emulated worker per --pool entry, named as launch_cluster names them (h100-0, ...)."""
    common = ["--emulate-slowdown", f"{args.slowdown:g}", "--slo-policy", args.slo_policy]
    common += ["--max-running-requests", str(args.max_running_requests), *args.worker_arg]
    return parse_cluster({"args": common, "workers": [{"gpu": gpu} for gpu in args.pool_list]})


def flush_caches(cluster: Cluster) -> list[str]:
    """Empty every worker's prefix cache (each run replays the same prompts); returns failures."""
    failed = []
    for spec, server in zip(cluster.specs, cluster.servers, strict=True):
        try:
            resp = requests.post(
                server.url + "/flush_cache", params={"timeout": FLUSH_TIMEOUT_S}, timeout=FLUSH_TIMEOUT_S + 10
            )
            if resp.status_code != 200:
                failed.append(f"{spec.name}: HTTP {resp.status_code} {resp.text.strip()[:120]}")
        except requests.RequestException as e:
            failed.append(f"{spec.name}: {e}")
    return failed


def emulation_snapshot(cluster: Cluster) -> dict[str, dict[str, Any] | None]:
    """Each worker's pacing counters (cumulative since it started) from its /slo/status."""
    pairs = zip(cluster.specs, cluster.servers, strict=True)
    return {spec.name: emulation_counters(server.url) for spec, server in pairs}


def router_counters(status: dict[str, Any] | None) -> dict[str, Any]:
    """The dispatcher's counters in the router's /slo/status, at its top level or one level down."""
    if not isinstance(status, dict):
        return {}
    if "decision_ns" in status:
        return status
    return next((v for v in status.values() if isinstance(v, dict) and "decision_ns" in v), {})


# --------------------------------------------------------------------------------------------
# Summary


def _metrics(run: dict[str, Any]) -> dict[str, Any]:
    m = run.get("metrics") or {}
    return m.to_dict() if isinstance(m, RunMetrics) else m


@dataclass(frozen=True)
class Lead:
    """One policy's goodput against the best of the others at the same rate."""

    policy: str
    goodput_rps: float | None
    best_other: str | None
    best_other_rps: float | None

    @property
    def ratio(self) -> float | None:
        if self.goodput_rps is None or not self.best_other_rps:
            return None
        return self.goodput_rps / self.best_other_rps

    def line(self) -> str:
        if self.ratio is None:
            return f"{self.policy}: no ratio (goodput {self.goodput_rps}, best other {self.best_other_rps})"
        return (
            f"{self.policy} goodput {self.goodput_rps:.3f} req/s vs best other {self.best_other} "
            f"{self.best_other_rps:.3f}: x{self.ratio:.2f} ({self.ratio - 1:+.0%}; GoodServe reports +27 %)"
        )


def lead(runs: list[dict[str, Any]], policy: str, rate: float | None) -> Lead | None:
    """`policy`'s goodput over the best other policy's at `rate`; None when it did not run there."""
    at_rate = {r["label"]: _metrics(r).get("goodput_rps") for r in runs if r.get("rate") == rate}
    if policy not in at_rate:
        return None
    others = {k: v for k, v in at_rate.items() if k != policy and v is not None}
    best = max(others, key=lambda k: others[k], default=None)
    return Lead(policy, at_rate[policy], best, others.get(best) if best else None)


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _p90(m: dict[str, Any], key: str) -> float | None:
    return (m.get(key) or {}).get("p90")


def row_cells(run: dict[str, Any], runs: list[dict[str, Any]]) -> list[str]:
    """One table row: client-side metrics, router counters, pacing, lead over the best other."""
    m = _metrics(run)
    config = run.get("config") or {}
    router = router_counters(config.get("slo_status"))
    decisions = router.get("decision_ns") or {}
    mine = lead(runs, run["label"], run.get("rate"))
    ratio = mine.ratio if mine else None

    def us(key: str) -> str:
        return _num(None if decisions.get(key) is None else decisions[key] / 1000.0, 1)

    return [
        str(run["label"]),
        _num(run.get("rate"), 2),
        _num(m.get("attainment"), 3),
        str(m.get("attained", "-")),
        _num(m.get("goodput_rps"), 3),
        _num(m.get("dslo_tok_s"), 1),
        _num(_p90(m, "ttft_ms"), 0),
        _num(_p90(m, "tpot_ms"), 1),
        _num(_p90(m, "e2e_ms"), 0),
        str(router.get("migrated", "-")),
        str(router.get("resubmitted", "-")),
        str(m.get("lost", "-")),
        late_cell(config.get("pacing")),
        f"{us('p50')} / {us('p99')}",
        _num(ratio, 2),
    ]


HEAD = [
    "policy", "rate", "attainment", "attained", "goodput req/s", "DSLO tok/s", "TTFT p90 ms", "TPOT p90 ms",
    "E2E p90 ms", "migrated", "resubmitted", "lost", "late steps (worst worker)", "decision p50 / p99 µs",
    "goodput × best other",
]  # fmt: skip


def routing_table(runs: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(row_cells(r, runs)) + " |" for r in runs]
    return "\n".join(lines)


def mix_report(mix: str, runs: list[dict[str, Any]]) -> str:
    """The mix's section: the side-by-side table, then goodserve's lead at every rate."""
    rates = list(dict.fromkeys(r.get("rate") for r in runs))
    lines = [f"## {mix}", "", routing_table(runs), ""]
    if note := invalid_note(runs):
        lines += [note, ""]
    for rate in rates:
        if (found := lead(runs, OURS, rate)) is not None:
            lines.append(f"- @ {rate:g} units/s: {found.line()}")
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------------------------
# Running


def workload(args: argparse.Namespace, mix: str, units: int | None = None, seed: int | None = None) -> WorkloadSpec:
    return WorkloadSpec(
        trace=args.trace,
        data_dir=args.data_dir,
        units=units or args.units,
        length_scale=args.length_scale,
        max_prompt=args.max_prompt,
        max_output=args.max_output,
        mix=mix,
        seed=args.seed if seed is None else seed,
    )


def warm_up(url: str, args: argparse.Namespace, scale: Scale, text: PromptText) -> None:
    """A few requests through the pool before the first measured run, so no policy pays for the
    workers' first forward passes."""
    if args.warmup <= 0:
        return
    spec = workload(args, args.mix_list[0], units=args.warmup, seed=args.seed + 1)
    planned = plan(spec, args.rate_list[0], scale)
    gen = LoadGenerator(url, prompt_builder(text, spec), load_options(args, ours=True))
    records = asyncio.run(gen.run(planned))
    print(f"   warm-up: {sum(r.finished for r in records)}/{len(records)} finished", flush=True)


def ready_router(url: str) -> None:
    """One throwaway request, so a fresh router has loaded its tokenizer (seconds) before the
    measured requests arrive; otherwise the first policy-decided requests wait for it."""
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}}
    requests.post(url + "/generate", json=body, timeout=300).raise_for_status()


def prompt_builder(text: PromptText, spec: WorkloadSpec) -> PromptFor:
    def prompt_for(p: PlannedRequest, rng: random.Random) -> list[int]:
        return text.build(p.req, rng, block_tokens=spec.block_tokens)

    return prompt_for


def measure(
    cluster: Cluster,
    policy: str,
    planned: list[PlannedRequest],
    prompt_for: PromptFor,
    args: argparse.Namespace,
    rate: float,
) -> dict[str, Any]:
    """One run on the current router: flush caches, load, then record pacing and router state."""
    ready_router(cluster.url)
    flush_failed = flush_caches(cluster)
    if flush_failed:
        print(f"   WARNING cache flush failed: {flush_failed}", flush=True)
    before = emulation_snapshot(cluster)
    run = run_once(Target(policy, cluster.url, args), planned, prompt_for, args, rate)  # scored per offered window
    after = emulation_snapshot(cluster)
    run["config"]["pacing"] = {name: pacing_delta(before[name], after.get(name)) for name in before}
    run["config"]["cache_flush_failed"] = flush_failed
    return run


def rescore(run: dict[str, Any]) -> None:
    """Rates per second of the offered window (first to last planned arrival), not of the run's
    makespan: every policy serves the same arrivals, and one that meets an SLO on a slow card
    late in the drain must not lose goodput for the longer drain (goodput then orders policies
    exactly as attained requests do). A compound stage's planned arrival, not its send time
    (after its parents), bounds the window, as in the simulator; runs saved before the window
    was recorded fall back to the records' first and last scheduled arrival."""
    window = run["config"].get("offered_window_s")
    if window is None:
        sent = [r.scheduled_s for r in run["records"]]
        span = max(sent, default=0.0) - min(sent, default=0.0)
        window = span if span > 0 else None
    run["metrics"] = score(run["records"], duration_s=window)


def rescore_saved(args: argparse.Namespace) -> int:
    """--rescore: the tables again from the records of an earlier run (nothing is started)."""
    runs = {mix: read_results(args.out / mix / "results.json") for mix in args.mix_list}
    for mine in runs.values():
        for run in mine:
            rescore(run)
    return finish(args, runs)


def router_line(run: dict[str, Any]) -> str:
    """What the router and the pacers saw in one run, for the console."""
    router = router_counters(run["config"].get("slo_status"))
    decisions = router.get("decision_ns") or {}
    late = {name: f"{p['late_share']:.1%}" for name, p in (run["config"].get("pacing") or {}).items() if p}
    invalid = verdict(run["config"].get("pacing"))["valid"] is False
    return (
        f"   router: migrated {router.get('migrated', '-')}, resubmitted {router.get('resubmitted', '-')}, "
        f"decision p50 {decisions.get('p50', '-')} ns; late steps {late}" + (" INVALID" if invalid else "")
    )


def header(args: argparse.Namespace, scale: Scale, spec: WorkloadSpec, policy: str) -> dict[str, Any]:
    return {
        "workload": asdict(spec),
        "pool": args.pool_list,
        "slowdown": args.slowdown,
        "slo_scale": scale.number,
        "calibration": None if scale.calibration is None else asdict(scale.calibration),
        "router": asdict(router_spec(policy, scale, args)),
        "args": {k: str(v) for k, v in vars(args).items()},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rescore:
        return rescore_saved(args)
    prepare_live_cluster()
    scales = {mix: mix_scale(mix, args.slo_scale) for mix in args.mix_list}
    text = PromptText(resolve_model("tiny"))  # what emulated workers run
    runs: dict[str, list[dict[str, Any]]] = {mix: [] for mix in args.mix_list}
    jobs = [(mix, policy, rate) for mix in args.mix_list for policy in args.policy_list for rate in args.rate_list]
    print(f"pool {args.pool_list} at x{args.slowdown:g}, SLOs x{args.slo_scale:g}; {len(jobs)} runs", flush=True)
    first = scales[jobs[0][0]]
    with Cluster(args.workers, router=router_spec(jobs[0][1], first, args)) as cluster:
        warm_up(cluster.url, args, first, text)
        for k, (mix, policy, rate) in enumerate(jobs):
            print(f"== {mix} / {policy} @ {rate:g} units/s ({k + 1}/{len(jobs)})", flush=True)
            scale = scales[mix]
            if k:
                cluster.restart_router(router_spec(policy, scale, args))  # fresh routing state every run
            spec = workload(args, mix)
            run = measure(cluster, policy, plan(spec, rate, scale), prompt_builder(text, spec), args, rate)
            runs[mix].append(header_run(run, header(args, scale, spec, policy)))
            print(describe(run) + "\n" + router_line(run), flush=True)
            write_results(args.out / mix, runs[mix])
    return finish(args, runs)


def finish(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> int:
    """Write every mix's files and the combined report; 1 if a request was lost."""
    sections = []
    for mix, mine in runs.items():
        out = args.out / mix
        path = write_results(out, mine, baseline_label=mine[0]["label"] if mine else None)
        section = mix_report(mix, mine)
        (out / "results.md").write_text(section + "\n" + markdown_table(mine) + "\n")
        if not args.no_plots and mine:
            plot(out, mine)
        sections.append(section)
        print("\n" + section + f"results: {path}", flush=True)
    (args.out / "results.md").write_text("\n".join(sections))
    bad = [r for mine in runs.values() for r in mine if r["metrics"].lost or check_consistency(r["metrics"])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
