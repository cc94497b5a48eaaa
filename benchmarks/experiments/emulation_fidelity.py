"""How faithfully the emulated GPUs keep GPU time, and whether emulated cards rank as profiled.

Three measurements, each on real servers (`python -m launch_server --emulate-gpu G`, tiny model
on CPU, every forward pass paced to the profile) fed real Azure LLM 2023 conversation lengths:

1. accuracy per profile: a closed loop of `--clients` streams for `--duration` s on one worker;
   the scheduler compares every step's observed time with the profile's prediction for that
   exact batch and reports median and p95 |error| and the share of late steps (the CPU alone
   overran the target) in /slo/status; a row whose late share exceeds 2 % is marked invalid.
2. workers per machine: 1..`--max-workers` H100 workers at once, each under the same closed
   loop; the largest count whose every worker stays within median 5 % / p95 15 % is what this
   machine can pace.
3. throughput ratio: the same batch of `--batch` requests (all sent at once, true lengths
   through the hidden hint, at most M running) on an emulated H100 and an emulated A40; the
   measured makespan ratio is compared with the ratio the simulator predicts from the two
   profiles for the same batch (scheduler.core.sim, fcfs, same M and chunk size).

`--slowdown K` runs every worker in dilated time (`--emulate-slowdown K`): steps last K
times the card's; throughputs and makespans are reported in the card's own time (×K, ÷K).

True output lengths go to the server only through the hidden hint (custom_params
`slo_oracle_output_len`), which ends the request there and which no policy can read.

  .venv/bin/python benchmarks/experiments/emulation_fidelity.py --duration 20 --max-workers 2       # quick
  .venv/bin/python benchmarks/experiments/emulation_fidelity.py --json emulation.json                # full
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks._server import BenchServer, live_run  # noqa: E402
from benchmarks.goodput.emulation_validity import MAX_LATE_SHARE  # noqa: E402
from benchmarks.workloads.traces import load  # noqa: E402
from scheduler.core.perf_model import load_perf_model, profile_path  # noqa: E402
from scheduler.core.policies import make_policy  # noqa: E402
from scheduler.core.sim import EngineConfig, SimRequest, Simulator  # noqa: E402
from scheduler.core.slo import SloSpec  # noqa: E402
from wire import ORACLE_HINT_PARAM  # noqa: E402

MAX_CONTEXT = 8192
TINY_VOCAB = 512  # token ids must exist in the tiny model
TARGET_MEDIAN, TARGET_P95 = 0.05, 0.15


def trace_requests(n: int, seed: int, max_output: int) -> list[tuple[int, int]]:
    """(prompt tokens, true output tokens) from the Azure conversation trace, fitting 8k."""
    trace = [(r.prompt_tokens, r.output_tokens) for r in load("azure-conv").requests]
    rows = [r for r in trace if r[0] + min(r[1], max_output) <= MAX_CONTEXT and r[1] > 0]
    rng = random.Random(seed)
    return [(p, min(o, max_output)) for p, o in (rng.choice(rows) for _ in range(n))]


def body(prompt: int, output: int, rng: random.Random) -> dict[str, Any]:
    return {
        "input_ids": [rng.randrange(3, TINY_VOCAB) for _ in range(prompt)],
        "sampling_params": {
            "max_new_tokens": MAX_CONTEXT - prompt,  # the client's cap; the true length travels hidden
            "temperature": 0,
            "custom_params": {ORACLE_HINT_PARAM: output},
        },
    }


async def _post(session: aiohttp.ClientSession, url: str, payload: dict) -> int:
    async with session.post(url + "/generate", json=payload) as resp:
        data = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"request refused: HTTP {resp.status} {str(data)[:200]}")
        return data["meta_info"]["completion_tokens"]


async def closed_loop(url: str, reqs: list[tuple[int, int]], clients: int, duration: float, seed: int) -> dict:
    rng = random.Random(seed)
    nxt = tokens = done = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        end = time.perf_counter() + duration

        async def client() -> None:
            nonlocal nxt, tokens, done
            while time.perf_counter() < end:
                p, o = reqs[nxt % len(reqs)]
                nxt += 1
                n = await _post(session, url, body(p, o, rng))
                if time.perf_counter() <= end:
                    tokens, done = tokens + n, done + 1

        await asyncio.gather(*(client() for _ in range(clients)))
    return {"output_tok_s": tokens / duration, "requests": done}


async def batch_makespan(url: str, reqs: list[tuple[int, int]], seed: int) -> float:
    rng = random.Random(seed)
    payloads = [body(p, o, rng) for p, o in reqs]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(_post(session, url, b) for b in payloads))
        makespan = time.perf_counter() - t0
    if outs != [o for _, o in reqs]:
        raise RuntimeError("an emulated request did not end at its hidden true length")
    return makespan


def emulation_status(server: BenchServer) -> dict:
    return requests.get(server.url + "/slo/status", timeout=5).json()["engine"]["emulation"]


def start(gpu: str, args: argparse.Namespace, name: str) -> BenchServer:
    flags = ["--emulate-gpu", gpu, "--emulate-slowdown", str(args.slowdown), "--slo-policy", "fcfs"]
    flags += ["--max-running-requests", str(args.max_running)]
    flags += ["--chunked-prefill-size", str(args.chunk)]
    return BenchServer("tiny", flags, name=name).start()


def within_target(e: dict) -> bool:
    return (e["median_abs_error"] or 0) <= TARGET_MEDIAN and (e["p95_abs_error"] or 0) <= TARGET_P95


def accuracy(args: argparse.Namespace, reqs: list[tuple[int, int]]) -> list[dict]:
    rows = []
    for gpu in args.gpus:
        server = start(gpu, args, f"emu-{gpu}")
        try:
            load = asyncio.run(closed_loop(server.url, reqs, args.clients, args.duration, args.seed))
            emu = emulation_status(server)
        finally:
            server.stop()
        load["gpu_time_output_tok_s"] = load["output_tok_s"] * args.slowdown  # in the card's own time
        rows.append({"gpu": gpu, **load, **emu, "valid": emu["late_share"] <= MAX_LATE_SHARE})
        print(f"   {gpu}: {json.dumps(rows[-1])}", flush=True)
    return rows


async def parallel_loops(urls: list[str], reqs: list[tuple[int, int]], args: argparse.Namespace) -> list[dict]:
    loops = (closed_loop(url, reqs, args.clients, args.duration, args.seed + i) for i, url in enumerate(urls))
    return list(await asyncio.gather(*loops))


def workers_per_machine(args: argparse.Namespace, reqs: list[tuple[int, int]]) -> list[dict]:
    rows = []
    for k in range(1, args.max_workers + 1):
        servers: list[BenchServer] = []
        try:
            for i in range(k):
                servers.append(start("h100", args, f"emu-h100-{k}-{i}"))

            loads = asyncio.run(parallel_loops([s.url for s in servers], reqs, args))
            emus = [emulation_status(s) for s in servers]
        finally:
            for s in servers:
                s.stop()
        row = {
            "workers": k,
            "worst_median_abs_error": max(e["median_abs_error"] or 0 for e in emus),
            "worst_p95_abs_error": max(e["p95_abs_error"] or 0 for e in emus),
            "worst_late_share": max(e["late_share"] for e in emus),
            "output_tok_s_each": [round(x["output_tok_s"], 1) for x in loads],
            "within_target": all(within_target(e) for e in emus),
            "valid": all(e["late_share"] <= MAX_LATE_SHARE for e in emus),
        }
        rows.append(row)
        print(f"   {k} worker(s): {json.dumps(row)}", flush=True)
    return rows


def predicted_makespan(gpu: str, reqs: list[tuple[int, int]], args: argparse.Namespace) -> float:
    perf = load_perf_model(profile_path(gpu), kind="table")
    sim_reqs = [SimRequest(f"r{i}", SloSpec(), 0.0, p, o, max_new_tokens=4096) for i, (p, o) in enumerate(reqs)]
    config = EngineConfig(max_running_requests=args.max_running, chunk_size=args.chunk)
    result = Simulator(make_policy("fcfs"), perf, config).run(sim_reqs)
    return max(r.finish_time for r in result.records.values())


def throughput_ratio(args: argparse.Namespace, reqs: list[tuple[int, int]]) -> dict:
    measured, late = {}, {}
    for gpu in ("h100", "a40"):
        server = start(gpu, args, f"emu-batch-{gpu}")
        try:
            asyncio.run(batch_makespan(server.url, reqs[:4], args.seed))  # warm-up
            measured[gpu] = asyncio.run(batch_makespan(server.url, reqs, args.seed)) / args.slowdown
            emu = emulation_status(server)
        finally:
            server.stop()
        late[gpu] = emu["late_share"]  # cumulative: the warm-up batch included
        print(f"   {gpu}: makespan {measured[gpu]:.2f} s, late share {emu['late_share']}", flush=True)
    predicted = {gpu: predicted_makespan(gpu, reqs, args) for gpu in measured}
    row = {
        "measured_makespan_s": measured,
        "predicted_makespan_s": predicted,
        "measured_a40_over_h100": measured["a40"] / measured["h100"],
        "predicted_a40_over_h100": predicted["a40"] / predicted["h100"],
    }
    row["ratio_error"] = row["measured_a40_over_h100"] / row["predicted_a40_over_h100"] - 1
    row["late_share"] = late
    row["valid"] = all(x <= MAX_LATE_SHARE for x in late.values())
    print(f"   {json.dumps(row)}", flush=True)
    return row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--gpus", default="h100,a100,a40", type=lambda s: s.split(","))
    p.add_argument("--duration", type=float, default=45.0, help="closed-loop seconds per measurement")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--slowdown", type=float, default=1.0, help="--emulate-slowdown of every worker (dilated time)")
    p.add_argument("--max-running", type=int, default=32)
    p.add_argument("--chunk", type=int, default=2048, help="--chunked-prefill-size of every worker")
    p.add_argument("--max-output", type=int, default=512, help="cap on the trace's output lengths")
    p.add_argument("--max-workers", type=int, default=3)
    p.add_argument("--batch", type=int, default=64, help="requests in the throughput-ratio batch")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: accuracy,workers,ratio")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    reqs = trace_requests(2000, args.seed, args.max_output)
    with live_run(args) as out:
        if "accuracy" not in skip:
            print("== 1. pacing accuracy per profile", flush=True)
            out["accuracy"] = accuracy(args, reqs)
        if "workers" not in skip:
            print("== 2. H100 workers one machine can pace", flush=True)
            out["workers"] = workers_per_machine(args, reqs)
        if "ratio" not in skip:
            print(f"== 3. A40 / H100 makespan of one {args.batch}-request batch", flush=True)
            out["ratio"] = throughput_ratio(args, reqs[: args.batch])


if __name__ == "__main__":
    main()
