"""Validation of the cluster simulator against the emulated server: the same workload on 1 and on
2-4 emulated workers behind the router, and in the simulator; one comparison table per pool.

For each pool the live side is benchmarks/experiments/emulated_routing.py's machinery: emulated workers
(`--emulate-slowdown K`, every forward pass K times the card's time, real SGLang scheduler and
our adapter) behind a fresh router with the routing policy, prompts built from the trace, true
lengths through the hidden hint, SLOs the mix's H100 targets times K. The simulated side runs
the same planned requests on the same cards slowed by K, the same engine policy, batch cap,
chunk and client cap, and the same routing policy. Both are scored by the same metrics over the
offered window. The simulator is given the host's own latency (HTTP, router, tokenizer, ZMQ,
streaming back: real time, not slowed by K), measured before the workload by idle probes: a
16-token prompt with one output token, its TTFT less K times the step for it of the card the
router placed it on (median of 7). The
table gives goodput, attainment overall and per class, TTFT and TPOT p50/p90, live vs simulated
and their relative difference; a row is within tolerance at 10 %
(5 points for attainments). A live run whose workers paced more than 2 % of their steps late is
marked invalid: then the host, not the simulator, is off.

Needs the machine to itself (every emulated worker paces on a CPU core):

  PYTHONPATH=launch:. .venv/bin/python -m benchmarks.experiments.simulator_validation                  # ~30 min
  PYTHONPATH=launch:. .venv/bin/python -m benchmarks.experiments.simulator_validation --pools h100 --units 40
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.cli import doc_parser
from benchmarks.goodput.scoring import RunMetrics
from benchmarks.goodput.workload import plan
from benchmarks.simulator.cluster import ClusterConfig
from benchmarks.simulator.pool import PoolSpec, card
from benchmarks.simulator.runner import Run, simulate
from benchmarks.simulator.worker import EngineOptions

TOLERANCE = 0.10
ATTAINMENT_POINTS = 0.05
MAX_LATE_SHARE = 0.02
PROBES = 7  # idle single-token requests that measure the host's own latency
PROBE_PROMPT = 16
PROBE_GAP_S = 0.5  # longer than a slowed step: each probe finds the engine idle


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser("python -m benchmarks.experiments.simulator_validation", __doc__)
    p.add_argument("--pools", default="h100;h100,h100;h100,a100,a40", help="';'-separated pools of cards")
    p.add_argument("--routing", default="least_request")
    p.add_argument("--slo-policy", default="edf", help="every engine's policy")
    p.add_argument("--slowdown", type=float, default=8.0)
    p.add_argument("--mix", default="tempo")
    p.add_argument("--trace", default="azure-conv")
    p.add_argument("--units", type=int, default=80)
    p.add_argument("--rate", type=float, default=1.5, help="units/s in wall time (per worker it is divided)")
    p.add_argument("--per-worker", action="store_true", help="multiply --rate by the pool's size")
    p.add_argument("--max-running-requests", type=int, default=32)
    p.add_argument("--chunk", type=int, default=2048, help="every worker's --chunked-prefill-size")
    p.add_argument("--length-scale", type=float, default=0.5)
    p.add_argument("--max-prompt", type=int, default=1024)
    p.add_argument("--max-output", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--host-latency-ms", type=float, help="give the simulator this host latency, not the probes'")
    p.add_argument("--out", type=Path, default=Path("results/validate"))
    return p.parse_args(argv)


def routing_args(args: argparse.Namespace, pool: list[str], rate: float, out: Path) -> argparse.Namespace:
    """benchmarks.experiments.emulated_routing's options for this pool (its launcher, workload and measurement)."""
    from benchmarks.experiments import emulated_routing as routing  # needs launch/ on the path: only the live side does

    return routing.parse_args(
        [
            "--pool", ",".join(pool),
            "--slowdown", f"{args.slowdown:g}",
            "--slo-policy", args.slo_policy,
            "--max-running-requests", str(args.max_running_requests),
            f"--worker-arg=--chunked-prefill-size={args.chunk}",
            "--policies", args.routing,
            "--mixes", args.mix,
            "--trace", args.trace,
            "--units", str(args.units),
            "--rates", f"{rate:g}",
            "--length-scale", f"{args.length_scale:g}",
            "--max-prompt", str(args.max_prompt),
            "--max-output", str(args.max_output),
            "--seed", str(args.seed),
            "--out", str(out),
            "--no-plots",
            "--quiet",
        ]
    )  # fmt: skip


def live_run(rargs: argparse.Namespace, planned: list[Any], scale: Any, spec: Any, rate: float) -> dict[str, Any]:
    from benchmarks._server import prepare_live_cluster, resolve_model
    from benchmarks.experiments import emulated_routing as routing
    from benchmarks.workloads.text import PromptText
    from launch_cluster import Cluster

    prepare_live_cluster()
    text = PromptText(resolve_model("tiny"))  # what emulated workers run
    with Cluster(rargs.workers, router=routing.router_spec(rargs.policy_list[0], scale, rargs)) as cluster:
        routing.warm_up(cluster.url, rargs, scale, text)
        probes = probe_ttfts(cluster.url, {w.name: w.gpu for w in rargs.workers if w.gpu})
        run = routing.measure(cluster, rargs.policy_list[0], planned, routing.prompt_builder(text, spec), rargs, rate)
        run["probe_ttft_s"] = probes
        return run


def probe_ttfts(url: str, gpus: dict[str, str]) -> list[tuple[float, str]]:
    """(TTFT, card that served it) of idle one-token requests with fresh prompts (no cache
    hit), one at a time; the card from the router's per-worker placement counts."""
    import requests

    from benchmarks.experiments.emulated_routing import router_counters

    def routed() -> dict[str, int]:
        return dict(router_counters(requests.get(url + "/slo/status", timeout=10).json()).get("routed") or {})

    out = []
    for i in range(PROBES):
        time.sleep(PROBE_GAP_S)
        before = routed()
        body = {
            "input_ids": [1 + (31 * i + 7 * j) % 500 for j in range(PROBE_PROMPT)],
            "sampling_params": {"max_new_tokens": 1, "ignore_eos": True},
            "stream": True,
        }
        start = time.perf_counter()
        with requests.post(url + "/generate", json=body, stream=True, timeout=60) as r:
            r.raise_for_status()
            ttft = None
            for line in r.iter_lines():
                if ttft is None and line.startswith(b"data:"):
                    ttft = time.perf_counter() - start
        after = routed()
        served = [w for w in after if after[w] > before.get(w, 0)]
        if ttft is not None and len(served) == 1 and served[0] in gpus:
            out.append((ttft, gpus[served[0]]))
    return out


def host_latency_s(probes: list[tuple[float, str]], slowdown: float) -> float:
    """Median over the probes of TTFT less the serving card's slowed step for the probe prompt."""
    if not probes:
        raise RuntimeError("no probe could be attributed to a worker")
    return max(
        0.0,
        statistics.median(
            ttft - slowdown * card(gpu).pace.step_time(PROBE_PROMPT, 0, PROBE_PROMPT) for ttft, gpu in probes
        ),
    )


def sim_run(
    args: argparse.Namespace,
    pool: list[str],
    spec: Any,
    rate: float,
    scale: Any,
    planned: list[Any],
    host_latency: float,
) -> dict[str, Any]:
    config = ClusterConfig(
        pool=PoolSpec.parse(",".join(f"{gpu}:1" for gpu in pool)),
        engine=EngineOptions(policy=args.slo_policy, max_running=args.max_running_requests, chunk=args.chunk),
        routing=args.routing,
        client_max_tokens=args.max_output,
        time_scale=args.slowdown,
        host_latency_s=host_latency,
        seed=args.seed,
    )
    body, _ = simulate(Run(args.routing, spec, rate, scale, config), planned)
    return body


def rows(live: RunMetrics, sim: RunMetrics) -> list[tuple[str, float | None, float | None, bool | None]]:
    """(metric, live, simulated, within tolerance)."""
    out: list[tuple[str, float | None, float | None, bool | None]] = []

    def add(name: str, a: float | None, b: float | None, points: bool = False) -> None:
        if a is None or b is None:
            out.append((name, a, b, None))
        elif points:
            out.append((name, a, b, abs(b - a) <= ATTAINMENT_POINTS))
        else:
            out.append((name, a, b, abs(b - a) <= TOLERANCE * max(abs(a), 1e-9)))

    add("goodput req/s", live.goodput_rps, sim.goodput_rps)
    add("attainment", live.attainment, sim.attainment, points=True)
    for cls in sorted(set(live.attainment_by_class) | set(sim.attainment_by_class)):
        add(f"attainment[{cls}]", live.attainment_by_class.get(cls), sim.attainment_by_class.get(cls), points=True)
    for key in ("p50", "p90"):
        add(f"TTFT {key} ms", live.ttft_ms[key], sim.ttft_ms[key])
        add(f"TPOT {key} ms", live.tpot_ms[key], sim.tpot_ms[key])
    return out


def table(title: str, lines: list[tuple[str, float | None, float | None, bool | None]], note: str) -> str:
    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"

    out = [f"### {title}", "", "| metric | emulated | simulated | sim / emulated | within |", "|---|---|---|---|---|"]
    for name, a, b, ok in lines:
        ratio = "-" if a in (None, 0) or b is None else f"{b / a:.2f}"  # type: ignore[operator]
        out.append(f"| {name} | {num(a)} | {num(b)} | {ratio} | {'-' if ok is None else 'yes' if ok else 'NO'} |")
    return "\n".join(out + ["", note, ""])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report, failures = [], 0
    for pool_text in [p for p in args.pools.split(";") if p.strip()]:
        pool = [g.strip() for g in pool_text.split(",") if g.strip()]
        rate = args.rate * (len(pool) if args.per_worker else 1)
        name = "+".join(pool)
        rargs = routing_args(args, pool, rate, args.out / name)
        from benchmarks.experiments import emulated_routing as routing

        scale = routing.mix_scale(args.mix, rargs.slo_scale)
        spec = routing.workload(rargs, args.mix)
        planned = plan(spec, rate, scale)
        print(f"== {name}: {len(planned)} requests at {rate:g}/s, x{args.slowdown:g}", flush=True)
        live = live_run(rargs, planned, scale, spec, rate)
        host = host_latency_s(live["probe_ttft_s"], args.slowdown)
        if args.host_latency_ms is not None:
            host = args.host_latency_ms / 1000
        sim = sim_run(args, pool, spec, rate, scale, planned, host)
        late = {w: p["late_share"] for w, p in (live["config"].get("pacing") or {}).items() if p}
        valid = all(v <= MAX_LATE_SHARE for v in late.values())
        lines = rows(live["metrics"], sim["metrics"])
        failures += sum(ok is False for *_, ok in lines)
        note = f"host latency given to the simulator: {host * 1000:.1f} ms; late-step share per worker: {late}"
        note += "" if valid else " — INVALID live run (host too slow)"
        report.append(table(f"{name}, {args.routing} routing, {args.slo_policy} engines", lines, note))
        print(report[-1], flush=True)
        (args.out / f"{name}.json").write_text(
            json.dumps(
                {
                    "live": live["metrics"].to_dict(),
                    "sim": sim["metrics"].to_dict(),
                    "late": late,
                    "host_latency_s": host,
                    "probe_ttft_s": live["probe_ttft_s"],
                },
                indent=1,
            )
        )
    (args.out / "validation.md").write_text("\n".join(report))
    print(f"{failures} metric(s) outside tolerance; tables in {args.out / 'validation.md'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
