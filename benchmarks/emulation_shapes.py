"""Whether an emulated GPU keeps its pace at every batch shape the benchmarks use.

One emulated worker per (card, batching, chunk): `--emulate-gpu G --emulate-slowdown K`, `fcfs`,
`--chunked-prefill-size C`, with `--enable-mixed-chunk` for mixed batches. On each worker, one
load per running count R: R decoding clients (prompts of a shared, cached context plus a few
tokens of their own, outputs long enough to outlast the load) keep R requests running with
realistic KV contexts, and a prefill stream sends prompts of C tokens with a one-token
output, so steps carry a C-token chunk next to R decodes (mixed) or alone (separate), for
`--duration` s or until the cell has `--min-steps` steps (at most 4x longer). Every
request's true length travels through the hidden hint. The worker's own late-step counters
(/slo/status -> engine.emulation) are read before and after each load; a cell reports the
share of its steps that ran late and their mean overrun, in ms and as a share of the step, and
the share of time the card sat idle between back-to-back steps waiting for the host.

A cell passes at late share <= 1 % and mean overrun <= 5 % of the step.

  PYTHONPATH=launch:. .venv/bin/python -m benchmarks.emulation_shapes --gpus h100 --duration 20 --min-steps 0  # quick
  PYTHONPATH=launch:. .venv/bin/python -m benchmarks.emulation_shapes --json shapes.json  # ~40 min
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import requests

from benchmarks._server import BenchServer, live_run
from benchmarks.goodput.emulation_validity import pacing_delta
from wire import ORACLE_HINT_PARAM

TINY_VOCAB = 512  # token ids must exist in the tiny model
MAX_PROMPT = 8192 - 64  # the emulated context is 8192; leave room for the output
DECODE_OWN_TOKENS = 16  # after the shared context, so each decoding request is its own
LATE_SHARE_TARGET, OVERRUN_TARGET = 0.01, 0.05


@dataclass(frozen=True)
class Cell:
    gpu: str
    batching: str  # mixed | separate
    chunk: int
    running: int


def _tokens(n: int, rng: random.Random) -> list[int]:
    return [rng.randrange(3, TINY_VOCAB) for _ in range(n)]


def _body(input_ids: list[int], output: int) -> dict[str, Any]:
    return {
        "input_ids": input_ids,
        "sampling_params": {
            "max_new_tokens": output,
            "temperature": 0,
            "custom_params": {ORACLE_HINT_PARAM: output},
        },
    }


async def _post(session: aiohttp.ClientSession, url: str, payload: dict) -> None:
    async with session.post(url + "/generate", json=payload) as resp:
        if resp.status != 200:
            raise RuntimeError(f"request refused: HTTP {resp.status} {(await resp.text())[:200]}")
        await resp.read()


async def shape_load(
    url: str, cell: Cell, context: list[int], duration: float, decode_output: int, seed: int, min_steps: int = 0
) -> dict[str, Any]:
    """R decoding clients and one prefill stream for `duration` s, longer (up to 4x) until the
    worker ran `min_steps` steps, then everything in flight is aborted (the decodes outlast the
    load on purpose). Returns the prefills completed and the running counts the worker reported
    each second, so a cell shows it reached its R."""
    rng = random.Random(seed)
    running, chunk = cell.running, cell.chunk
    prefills = 0
    seen: list[int] = []
    connector = aiohttp.TCPConnector(limit=running + 8)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), connector=connector) as session:

        async def decoder() -> None:
            while True:
                await _post(session, url, _body(context + _tokens(DECODE_OWN_TOKENS, rng), decode_output))

        async def prefill_stream() -> None:
            nonlocal prefills
            while True:
                await _post(session, url, _body(_tokens(min(chunk, MAX_PROMPT), rng), 1))
                prefills += 1

        async def watch() -> None:
            """Ends the load: after `duration` once the worker ran `min_steps` steps (or at 4x)."""
            started, first_steps = time.perf_counter(), None
            while True:
                await asyncio.sleep(1.0)
                async with session.get(url + "/slo/status") as resp:
                    engine = (await resp.json())["engine"]
                seen.append(int(engine["running"]))
                steps = int((engine.get("emulation") or {}).get("steps", 0))
                first_steps = steps if first_steps is None else first_steps
                elapsed = time.perf_counter() - started
                if elapsed >= 4 * duration or (elapsed >= duration and steps - first_steps >= min_steps):
                    return

        tasks = [asyncio.ensure_future(prefill_stream()), asyncio.ensure_future(watch())]
        tasks += [asyncio.ensure_future(decoder()) for _ in range(running)]
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()
    seen.sort()
    median = seen[len(seen) // 2] if seen else 0
    return {"prefills": prefills, "running_median": median, "running_max": max(seen, default=0)}


def drain(url: str, timeout: float = 120.0) -> None:
    """Abort whatever is still queued or running and wait until the engine is empty."""
    requests.post(url + "/abort_request", json={"abort_all": True}, timeout=10)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        engine = requests.get(url + "/slo/status", timeout=10).json()["engine"]
        if engine["running"] == 0 and engine["waiting"] == 0:
            return
        time.sleep(0.5)
    raise TimeoutError("the worker did not drain after abort_all")


def shared_context(url: str, tokens: int, seed: int) -> list[int]:
    """The decoding requests' common context, prefilled once so the radix cache holds it: each
    decode then attends to a long context without the load paying its prefill R times."""
    context = _tokens(tokens, random.Random(seed + 1))
    requests.post(url + "/generate", json=_body(context, 1), timeout=600).raise_for_status()
    return context


def emulation_counters(url: str) -> dict[str, Any]:
    return requests.get(url + "/slo/status", timeout=10).json()["engine"]["emulation"]


def cell_result(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The cell's steps between two status reads, and whether they kept the card's pace."""
    row = pacing_delta(before, after)
    assert row is not None
    row["on_time"] = row["late_share"] <= LATE_SHARE_TARGET and row["mean_overrun_share"] <= OVERRUN_TARGET
    return row


def start_worker(gpu: str, batching: str, chunk: int, args: argparse.Namespace) -> BenchServer:
    flags = ["--emulate-gpu", gpu, "--emulate-slowdown", str(args.slowdown), "--slo-policy", "fcfs"]
    flags += ["--chunked-prefill-size", str(chunk), "--max-running-requests", str(max(args.running) + 8)]
    if batching == "mixed":
        flags.append("--enable-mixed-chunk")
    flags += args.server_flag
    return BenchServer("tiny", flags, name=f"shapes-{gpu}-{batching}-{chunk}").start()


def run_grid(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for gpu in args.gpus:
        for batching in args.batching:
            for chunk in args.chunks:
                server = start_worker(gpu, batching, chunk, args)
                try:
                    context = shared_context(server.url, args.decode_context, args.seed)
                    for running in args.running:
                        cell = Cell(gpu, batching, chunk, running)
                        before = emulation_counters(server.url)
                        load0 = os.getloadavg()[0]
                        load = asyncio.run(
                            shape_load(
                                server.url, cell, context, args.duration, args.decode_output, args.seed, args.min_steps
                            )
                        )
                        after = emulation_counters(server.url)
                        drain(server.url)
                        rows.append(
                            {
                                **cell.__dict__,
                                **cell_result(before, after),
                                **load,
                                "loadavg_1m": round(max(load0, os.getloadavg()[0]), 2),
                            }
                        )
                        print(f"   {json.dumps(rows[-1])}", flush=True)
                finally:
                    server.stop()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| card | batching | chunk | running | steps | late share | mean overrun | overrun / step | host gap "
        "| on time |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['gpu']} | {r['batching']} | {r['chunk']} | {r['running']} | {r['steps']} | "
            f"{100 * r['late_share']:.2f} % | {r['mean_overrun_ms']:.1f} ms | "
            f"{100 * r['mean_overrun_share']:.1f} % | {100 * r.get('host_gap_share', 0.0):.1f} % | "
            f"{'yes' if r['on_time'] else 'NO'} |"
        )
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--gpus", default="h100,a100", type=lambda s: s.split(","))
    p.add_argument("--batching", default="mixed,separate", type=lambda s: s.split(","))
    p.add_argument("--chunks", default="512,2048,8192", type=_ints, help="--chunked-prefill-size per worker")
    p.add_argument("--running", default="16,64,256", type=_ints, help="decoding requests kept running")
    p.add_argument("--slowdown", type=float, default=10.0, help="--emulate-slowdown of every worker")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load per cell (at least)")
    p.add_argument("--min-steps", type=int, default=100, help="load a cell until this many steps (up to 4x duration)")
    p.add_argument("--decode-context", type=int, default=1024, help="shared context tokens of every decoding request")
    p.add_argument("--decode-output", type=int, default=2048, help="output tokens of each decoding request")
    p.add_argument("--server-flag", action="append", default=[], help="extra flag for every worker (repeat)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with live_run(args, cores=True) as out:
        out["cells"] = run_grid(args)
    print(table(out["cells"]))


if __name__ == "__main__":
    main()
