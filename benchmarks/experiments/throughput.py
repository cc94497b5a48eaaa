"""Throughput with no SLO pressure: stock SGLang vs our server with fcfs and with SLO policies.

Answers two questions from the engine-integration issue on the same workload in the same run:
does `--slo-policy fcfs` stay within noise of stock SGLang, and does an SLO policy keep at
least 95 % of fcfs throughput when no SLO is under pressure?

Closed loop: `--concurrency` clients (default = the batch cap M, so the engine stays full)
each send the next request of one seeded sequence as soon as their previous one returns,
until `--requests` have been sent; throughput is their output tokens over the makespan (no
request is cut at a window edge, so every mode serves exactly the same requests).
Prompt/output lengths come from the Azure LLM 2023 conversation trace (times
--length-scale, clamped to [16, --max-prompt] and [4, --max-output]), prompts are windows of
real text (benchmarks/workloads/text.py) sent as input_ids, outputs use ignore_eos. Our
servers get SLOs of Tempo's 3:1:1 mix that are
100-1000x looser than anything this engine needs (TTFT 10 min, TPOT 1 min, deadline 1 h), so
every policy's code runs every step but nothing is urgent; stock SGLang gets no SLO field.

Modes run round-robin (`--rounds`), each in a fresh server, so slow drifts of a noisy host
hit every mode alike; ratios are taken against fcfs of the same round.

  .venv/bin/python benchmarks/experiments/throughput.py --model-path tiny --requests 40 --rounds 1   # smoke
  .venv/bin/python benchmarks/experiments/throughput.py --requests 80 --rounds 2 --json out.json     # SmolLM2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks._server import BenchServer, install_signal_handlers, resolve_model, stop_all  # noqa: E402
from benchmarks.cli import run_header  # noqa: E402
from benchmarks.goodput.emulation_validity import emulation_counters, late_cell, verdict  # noqa: E402
from benchmarks.workloads.text import PromptText  # noqa: E402
from benchmarks.workloads.traces import load  # noqa: E402

MODES = "stock,fcfs,edf,slos,tempo"
LOOSE_SLOS = (
    {"ttft_ms": 600_000, "tpot_ms": 60_000},
    {"ttft_ms": 600_000, "tpot_ms": 60_000},
    {"ttft_ms": 600_000, "tpot_ms": 60_000},
    {"deadline_ms": 3_600_000},
    {"deadline_ms": 3_600_000},
)


def scaled_lengths(row: tuple[int, int], args: argparse.Namespace) -> tuple[int, int]:
    ctx, gen = row
    prompt = int(min(args.max_prompt, max(16, round(ctx * args.length_scale))))
    out = int(min(args.max_output, max(4, round(gen * args.length_scale))))
    return prompt, out


def request_sequence(args: argparse.Namespace, prompts: PromptText, n: int = 5000) -> list[tuple[list[int], int]]:
    """The same seeded (prompt ids, output length) sequence for every mode."""
    rng = random.Random(args.seed)
    trace = [(r.prompt_tokens, r.output_tokens) for r in load(args.trace).requests]
    out = []
    for _ in range(n):
        prompt_len, output_len = scaled_lengths(rng.choice(trace), args)
        out.append((prompts.ids(prompt_len, rng), output_len))
    return out


def start_server(mode: str, args: argparse.Namespace) -> BenchServer:
    """A fresh server for one mode, warmed up with two requests; start-up is retried because the
    CPU KV-cache sizing can fail while the previous server still releases its memory."""
    stock = mode == "stock"
    flags = ["--max-running-requests", str(args.max_running_requests), *args.server_arg]
    if not stock:
        flags += ["--slo-policy", mode]
    for attempt in range(args.start_attempts):
        try:
            server = BenchServer(args.model_path, flags, stock=stock, name=mode).start()
            break
        except RuntimeError as e:
            if attempt + 1 == args.start_attempts:
                raise
            print(f"   {mode}: server failed to start ({str(e).splitlines()[0]}); retrying", flush=True)
            time.sleep(5)
    warm = [(list(range(10, 74)), 8)] * 2
    asyncio.run(closed_loop(server.url, warm, 1, 2, False))
    return server


async def closed_loop(
    url: str, sequence: list[tuple[list[int], int]], concurrency: int, n_requests: int, send_slo: bool
) -> dict[str, Any]:
    """The first n_requests of the sequence through `concurrency` clients; throughput is their
    output tokens over the makespan, so no request is cut at a window edge."""
    next_index = 0
    done_tokens = done_requests = errors = 0
    latencies: list[float] = []
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        t0 = time.perf_counter()

        async def client() -> None:
            nonlocal next_index, done_tokens, done_requests, errors
            while next_index < n_requests:
                i, next_index = next_index, next_index + 1
                ids, max_new = sequence[i % len(sequence)]
                body: dict[str, Any] = {
                    "input_ids": ids,
                    "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True},
                }
                if send_slo:
                    body["slo"] = LOOSE_SLOS[i % len(LOOSE_SLOS)]
                sent = time.perf_counter()
                try:
                    async with session.post(url + "/generate", json=body) as resp:
                        payload = await resp.json() if resp.status == 200 else None
                except aiohttp.ClientError:
                    payload = None
                if payload is None:
                    errors += 1
                else:
                    done_tokens += payload["meta_info"]["completion_tokens"]
                    done_requests += 1
                    latencies.append(time.perf_counter() - sent)

        await asyncio.gather(*(client() for _ in range(concurrency)))
        makespan = time.perf_counter() - t0
    return {
        "output_tok_s": done_tokens / makespan,
        "req_s": done_requests / makespan,
        "makespan_s": makespan,
        "requests": done_requests,
        "errors": errors,
        "latency_p50_s": statistics.median(latencies) if latencies else None,
    }


def run_mode(mode: str, args: argparse.Namespace, sequence: list) -> dict[str, Any]:
    server = start_server(mode, args)
    try:
        row = asyncio.run(closed_loop(server.url, sequence, args.concurrency, args.requests, mode != "stock"))
        row["startup_s"] = server.startup_s
        # an emulated worker (--server-arg=--emulate-gpu=...): its pace over the whole run (a fresh server)
        row["pacing"] = {mode: emulation_counters(server.url)} if mode != "stock" else None
    finally:
        server.stop()
    return row


def summarize(rows: list[dict[str, Any]], modes: list[str]) -> str:
    """Per round, each mode's tok/s over fcfs of that round; then the median over rounds."""
    lines = [f"{'mode':8} {'round':>5} {'reqs':>5} {'tok/s':>7} {'req/s':>6} {'p50 s':>6} {'x fcfs':>7}", "-" * 50]
    base = {r["round"]: r["output_tok_s"] for r in rows if r["mode"] == "fcfs"}
    for r in rows:
        x = r["output_tok_s"] / base[r["round"]] if base.get(r["round"]) else None
        r["x_fcfs"] = x
        p50 = "-" if r["latency_p50_s"] is None else f"{r['latency_p50_s']:.2f}"
        flag = f" late steps {late_cell(r['pacing'])}" if verdict(r.get("pacing"))["valid"] is False else ""
        lines.append(
            f"{r['mode']:8} {r['round']:>5} {r['requests']:>5} {r['output_tok_s']:>7.1f} {r['req_s']:>6.2f} "
            f"{p50:>6} {'-' if x is None else f'{x:.3f}':>7}{flag}"
        )
    lines += ["", "median over rounds (tok/s ratio to fcfs of the same round):"]
    for mode in modes:
        ratios = [r["x_fcfs"] for r in rows if r["mode"] == mode and r["x_fcfs"] is not None]
        if ratios:
            spread = f"  (rounds: {', '.join(f'{x:.3f}' for x in ratios)})" if len(ratios) > 1 else ""
            lines.append(f"  {mode:8} {statistics.median(ratios):.3f}{spread}")
    table = "\n".join(lines)
    print(table, flush=True)
    return table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-path", default="default", help="default (SmolLM2), tiny, or an HF folder")
    p.add_argument("--max-running-requests", type=int, default=8, help="server batch cap M (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", default="azure-conv", help="a trace name of benchmarks/workloads/traces.py")
    p.add_argument("--length-scale", type=float, default=0.1, help="trace lengths times this (default 0.1)")
    p.add_argument("--max-prompt", type=int, default=256)
    p.add_argument("--max-output", type=int, default=64)
    p.add_argument("--start-attempts", type=int, default=3, help="tries per server start-up")
    p.add_argument("--server-arg", action="append", default=[], help="extra server flag (repeatable, use =)")
    p.add_argument("--json", type=Path, help="write every row and the set-up here")
    p.add_argument("--modes", default=MODES, help=f"comma-separated; 'stock' = stock SGLang (default {MODES})")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--requests", type=int, default=100, help="requests per mode (the same ones for every mode)")
    p.add_argument("--concurrency", type=int, help="closed-loop clients (default: M)")
    args = p.parse_args(argv)
    args.concurrency = args.concurrency or args.max_running_requests
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    install_signal_handlers()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if "fcfs" not in modes:
        raise SystemExit("--modes must include fcfs (the baseline of every ratio)")
    sequence = request_sequence(args, PromptText(resolve_model(args.model_path)))
    rows: list[dict[str, Any]] = []
    try:
        for rnd in range(1, args.rounds + 1):
            for mode in modes:
                print(f"== round {rnd}: {mode}", flush=True)
                row = {"mode": mode, "round": rnd, **run_mode(mode, args, sequence)}
                print(f"   {row['output_tok_s']:.1f} tok/s, {row['requests']} requests, {row['errors']} errors")
                rows.append(row)
    finally:
        stop_all()
    table = summarize(rows, modes)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    **run_header(args),
                    "rows": rows,
                    "table": table,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
