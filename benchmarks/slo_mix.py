"""End-to-end comparison of SLO policies on the real server, one seeded workload, one run.

For each policy in --policies a real `python -m launch_server --slo-policy P` is started on
127.0.0.1, warmed up, fed the same open-loop workload, and stopped before the next one
(`--stock` adds a stock `python -m sglang.launch_server` row with the same CPU flags).

Calibration: an fcfs server first serves a few sequential requests alone (median-length
prompt, 32 output tokens); the median zero-load TTFT (ttft0) and per-token time (tpot0) set
the SLOs, each `--slo-scale` (default 4) times its zero-load value:
  latency   ttft = s*ttft0, tpot = s*tpot0 (deadline-based TPOT: token i due at ttft + i*tpot)
  deadline  deadline = s*(ttft0 + max_output*tpot0): any single request meets it at zero load
  compound  deadline = stages * the deadline above, from the program's first call
This mirrors Tempo's mix (TTFT 2 s / TBT 100 ms, deadline 20 s, compound 20 s x stages)
rescaled from a GPU to this engine.

Workload: Poisson arrivals at --rate per second for --duration seconds (at most
--max-requests units), seeded; class latency:deadline:compound = 3:1:1 (--mix). Prompt and
output lengths are sampled from the Azure LLM 2023 conversation trace, times --length-scale,
clamped to [16, --max-prompt] and [4, --max-output]. Prompts are token windows of real text
(this repository's README and policy-core sources, tokenized with the model's tokenizer),
sent as input_ids so their length is exact. A compound program has 2-3 calls with the same
program_id sent one after the other (open loop across programs).

Lengths: this first script sends max_new_tokens = the trace's output length with
ignore_eos, so outputs follow the trace. max_new_tokens is what a real client sets as its
cap and nothing about the length goes into the SLO fields, but policies that read the cap
(sjf, tempo, gmax, slos estimates) see a tight bound here; the full harness will hide the
stop point.

Metrics (client-side token arrival times, scored with scheduler.core.outcome.evaluate and
scheduler.core.goodput / gain): request goodput (attained / total, per second of makespan),
DSLO token goodput, Tempo service gain (exact per token, alpha=1) over its potential,
attainment per class, p50/p99 TTFT, output tokens/s, lost requests (no final chunk: must be 0).

Run from the repository root, e.g.
  .venv/bin/python benchmarks/slo_mix.py --model-path tiny --duration 20 --rate 5 --policies fcfs,edf,tempo
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime as dt
import json
import math
import platform
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _server import ROOT, BenchServer, install_signal_handlers, resolve_model, stop_all  # noqa: E402

from scheduler.core.gain import outcome_gain  # noqa: E402
from scheduler.core.goodput import summarize  # noqa: E402
from scheduler.core.outcome import SloOutcome, evaluate  # noqa: E402
from scheduler.core.slo import SloClass, parse_slo  # noqa: E402

TRACE = Path("/work/shared/data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv")
POLICIES = "fcfs,edf,sjf,las,sarathi,tempo,gmax,slos"
CLASSES = ("latency", "deadline", "compound")
CORPUS_FILES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "scheduler" / "core").glob("*.py"))]


# ----------------------------------------------------------------------------------- workload


@dataclass
class Call:
    key: str  # unique request key, e.g. "u12" or "u7.s1"
    cls: str
    prompt_ids: list[int]
    max_new: int
    slo: dict[str, Any]
    stage: int = 0


@dataclass
class Unit:
    """One arrival: a single request, or a compound program whose calls run one after another."""

    uid: int
    start_s: float  # offset from the run's start
    cls: str
    calls: list[Call]
    deadline_s: float | None = None  # compound: program deadline from its first arrival


@dataclass
class Calibration:
    ttft0_ms: float
    tpot0_ms: float
    prompt_tokens: int
    samples: list[dict[str, float]] = field(default_factory=list)


def load_trace(path: Path) -> list[tuple[int, int]]:
    with open(path, newline="") as f:
        return [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(f)]


def scaled_lengths(row: tuple[int, int], args: argparse.Namespace) -> tuple[int, int]:
    ctx, gen = row
    prompt = int(min(args.max_prompt, max(16, round(ctx * args.length_scale))))
    out = int(min(args.max_output, max(4, round(gen * args.length_scale))))
    return prompt, out


class PromptSource:
    """Deterministic windows of real text, `n` tokens long, from the model's own tokenizer."""

    def __init__(self, model_dir: str) -> None:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        text = "\n\n".join((ROOT / f).read_text(errors="replace") for f in CORPUS_FILES)
        self.ids = tok.encode(text, add_special_tokens=False).ids
        while len(self.ids) < 4096:
            self.ids = self.ids + self.ids

    def window(self, rng: random.Random, n: int) -> list[int]:
        start = rng.randrange(0, len(self.ids) - n)
        return self.ids[start : start + n]


def slo_targets(cal: Calibration, args: argparse.Namespace) -> dict[str, float]:
    s = args.slo_scale
    deadline = s * (cal.ttft0_ms + args.max_output * cal.tpot0_ms)
    return {
        "ttft_ms": round(s * cal.ttft0_ms, 1),
        "tpot_ms": round(s * cal.tpot0_ms, 1),
        "deadline_ms": round(deadline, 1),
    }


def build_workload(
    args: argparse.Namespace, trace: list[tuple[int, int]], prompts: PromptSource, targets: dict[str, float]
) -> list[Unit]:
    rng = random.Random(args.seed)
    mix = [float(x) for x in args.mix.split(":")]
    units: list[Unit] = []
    t = 0.0
    while len(units) < args.max_requests:
        t += rng.expovariate(args.rate)
        if t >= args.duration:
            break
        uid = len(units)
        cls = rng.choices(CLASSES, weights=mix)[0]
        if cls == "compound":
            stages = rng.choice((2, 3))
            deadline_ms = round(stages * targets["deadline_ms"], 1)
            calls = []
            for k in range(stages):
                p, o = scaled_lengths(rng.choice(trace), args)
                slo = {"class": "compound", "deadline_ms": deadline_ms, "program_id": f"prog-{uid}", "stage": k}
                calls.append(Call(f"u{uid}.s{k}", cls, prompts.window(rng, p), o, slo, stage=k))
            units.append(Unit(uid, t, cls, calls, deadline_s=deadline_ms / 1000.0))
        else:
            p, o = scaled_lengths(rng.choice(trace), args)
            if cls == "latency":
                slo = {"class": "latency", "ttft_ms": targets["ttft_ms"], "tpot_ms": targets["tpot_ms"]}
            else:
                slo = {"class": "deadline", "deadline_ms": targets["deadline_ms"]}
            units.append(Unit(uid, t, cls, [Call(f"u{uid}", cls, prompts.window(rng, p), o, slo)]))
    return units


# ------------------------------------------------------------------------------------- client


@dataclass
class Result:
    key: str
    cls: str
    slo: dict[str, Any]
    prompt_tokens: int
    max_new: int
    arrival: float  # perf_counter when the request was sent
    program_start: float | None
    token_times: list[float] = field(default_factory=list)
    finish: float | None = None
    finish_reason: str | None = None
    server_report: dict[str, Any] | None = None
    error: str | None = None

    @property
    def unfinished(self) -> bool:
        return self.finish is None

    @property
    def cut(self) -> bool:
        """Cancelled by the client at --drain-timeout (overload), not lost by the server."""
        return self.unfinished and "cut" in (self.error or "")

    @property
    def lost(self) -> bool:
        """No final chunk for a reason other than the client's drain timeout: must be 0."""
        return self.unfinished and not self.cut


async def stream_call(
    session: aiohttp.ClientSession,
    url: str,
    call: Call,
    send_slo: bool,
    program_start: float | None,
    results: list[Result],
) -> Result:
    body: dict[str, Any] = {
        "input_ids": call.prompt_ids,
        "sampling_params": {"max_new_tokens": call.max_new, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }
    if send_slo:
        body["slo"] = call.slo
    res = Result(call.key, call.cls, call.slo, len(call.prompt_ids), call.max_new, time.perf_counter(), program_start)
    results.append(res)
    seen = 0
    try:
        async with session.post(url + "/generate", json=body) as resp:
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return res
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                now = time.perf_counter()
                chunk = json.loads(line[6:])
                meta = chunk.get("meta_info", {})
                n = meta.get("completion_tokens", seen)
                res.token_times.extend([now] * max(0, n - seen))
                seen = max(seen, n)
                reason = meta.get("finish_reason")
                if reason is not None:
                    res.finish = now
                    res.finish_reason = reason.get("type") if isinstance(reason, dict) else str(reason)
                    res.server_report = meta.get("slo")
    except asyncio.CancelledError:
        res.error = res.error or "cut at the drain timeout"
        raise
    except Exception as e:  # noqa: BLE001 - any transport failure is a lost request
        res.error = f"{type(e).__name__}: {e}"
    if res.finish is None and res.error is None:
        res.error = "stream ended without a final chunk"
    return res


async def run_unit(
    session: aiohttp.ClientSession, url: str, unit: Unit, t0: float, send_slo: bool, results: list[Result]
) -> None:
    await asyncio.sleep(max(0.0, t0 + unit.start_s - time.perf_counter()))
    program_start = time.perf_counter() if unit.cls == "compound" else None
    for call in unit.calls:
        res = await stream_call(session, url, call, send_slo, program_start, results)
        if res.unfinished:
            break  # later stages are never sent: they are counted below


async def run_workload(url: str, units: list[Unit], send_slo: bool, drain_timeout: float) -> tuple[list[Result], float]:
    results: list[Result] = []
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(run_unit(session, url, u, t0, send_slo, results)) for u in units]
        horizon = (units[-1].start_s if units else 0.0) + drain_timeout
        done, pending = await asyncio.wait(tasks, timeout=max(1.0, t0 + horizon - time.perf_counter()))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # a bug in the client, not a lost request
    # Stages never sent because an earlier call was lost are lost too.
    by_key = {r.key: r for r in results}
    for u in units:
        why = "never sent"
        for c in u.calls:
            if c.key in by_key:
                why = "never sent (an earlier stage was " + ("cut" if by_key[c.key].cut else "lost") + ")"
            else:
                results.append(Result(c.key, c.cls, c.slo, len(c.prompt_ids), c.max_new, math.nan, None, error=why))
    return results, t0


async def sequential(url: str, calls: list[Call], send_slo: bool) -> list[Result]:
    results: list[Result] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        for call in calls:
            await stream_call(session, url, call, send_slo, None, results)
    for r in results:
        if r.unfinished:
            raise RuntimeError(f"warm-up/calibration request failed: {r.error}")
    return results


def warmup(server: BenchServer, prompts: PromptSource, send_slo: bool) -> None:
    rng = random.Random(12345)
    calls = [Call(f"warm{i}", "latency", prompts.window(rng, 64), 8, {"ttft_ms": 60_000}) for i in range(2)]
    asyncio.run(sequential(server.url, calls, send_slo))


def calibrate(server: BenchServer, args: argparse.Namespace, prompts: PromptSource, prompt_len: int) -> Calibration:
    """Zero-load TTFT and per-token time on an idle, warmed-up fcfs server."""
    rng = random.Random(args.seed + 1)
    calls = [
        Call(f"cal{i}", "latency", prompts.window(rng, prompt_len), 32, {"ttft_ms": 600_000})
        for i in range(args.calib_requests)
    ]
    results = asyncio.run(sequential(server.url, calls, True))
    samples = [
        {
            "ttft_ms": (r.token_times[0] - r.arrival) * 1000.0,
            "tpot_ms": (r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1) * 1000.0,
        }
        for r in results
    ]
    return Calibration(
        ttft0_ms=statistics.median(s["ttft_ms"] for s in samples),
        tpot0_ms=statistics.median(s["tpot_ms"] for s in samples),
        prompt_tokens=prompt_len,
        samples=samples,
    )


# ------------------------------------------------------------------------------------ scoring


def score(results: list[Result], units: list[Unit], t0: float) -> dict[str, Any]:
    deadline_of = {c.key: (u.deadline_s) for u in units for c in u.calls}
    outcomes: list[SloOutcome] = []
    prompt_tokens: list[int] = []
    gains: list[float] = []
    ttfts: list[float] = []
    per_class: dict[str, list[bool]] = {c: [] for c in CLASSES}
    server_attained = 0
    last_finish = t0
    out_tokens = 0
    for r in results:
        spec = parse_slo(r.slo)
        finished = not r.unfinished and r.finish_reason != "abort"
        arrival = r.arrival if not math.isnan(r.arrival) else t0
        finish = r.finish if r.finish is not None else (r.token_times[-1] if r.token_times else arrival)
        deadline_abs = None
        ttlt = None
        if spec.slo_class is SloClass.COMPOUND and r.program_start is not None:
            deadline_abs = r.program_start + deadline_of[r.key]
            ttlt = finish - r.program_start
        o = evaluate(spec, arrival, r.token_times, finish, finished=finished, deadline_abs=deadline_abs)
        outcomes.append(o)
        prompt_tokens.append(r.prompt_tokens)
        gains.append(outcome_gain(o, r.prompt_tokens, token_times=r.token_times, arrival=arrival, ttlt_s=ttlt))
        per_class[r.cls].append(o.attained)
        if o.ttft_s is not None:
            ttfts.append(o.ttft_s)
        if r.server_report and r.server_report.get("attained", {}).get("overall"):
            server_attained += 1
        if r.finish is not None:
            last_finish = max(last_finish, r.finish)
        out_tokens += len(r.token_times)
    makespan = max(1e-9, last_finish - t0)
    summary = summarize(outcomes, prompt_tokens, duration_s=makespan)
    n = len(outcomes)
    lost = [r for r in results if r.lost]
    return {
        "requests": n,
        "lost": len(lost),
        "lost_errors": sorted({r.error or "" for r in lost})[:5],
        "cut_at_drain_timeout": sum(r.cut for r in results),
        "dropped": sum(1 for r in results if r.finish_reason == "abort"),
        "attained": summary.attained,
        "attainment": summary.attained / n if n else 1.0,
        "goodput_rps": summary.attained / makespan,
        "dslo_tokens": summary.dslo_tokens,
        "dslo_tokens_per_s": summary.dslo_tokens / makespan,
        "jitserve_tokens": summary.jitserve_tokens,
        "service_gain": sum(gains),
        "service_gain_potential": summary.service_gain_potential,
        "gain_ratio": sum(gains) / summary.service_gain_potential if summary.service_gain_potential else 1.0,
        "attainment_by_class": {c: (sum(v) / len(v) if v else None) for c, v in per_class.items()},
        "requests_by_class": {c: len(v) for c, v in per_class.items()},
        "ttft_p50_s": float(np.percentile(ttfts, 50)) if ttfts else None,
        "ttft_p99_s": float(np.percentile(ttfts, 99)) if ttfts else None,
        "output_tokens": out_tokens,
        "throughput_tok_s": out_tokens / makespan,
        "makespan_s": makespan,
        "server_attained": server_attained,
    }


# -------------------------------------------------------------------------------------- runs


def server_args(args: argparse.Namespace, policy: str) -> list[str]:
    return ["--slo-policy", policy, "--max-running-requests", str(args.max_running_requests), *args.server_arg]


def start_server(name: str, args: argparse.Namespace, prompts: PromptSource) -> BenchServer:
    stock = name == "stock"
    sargs = ["--max-running-requests", str(args.max_running_requests)] if stock else server_args(args, name)
    for attempt in range(args.start_attempts):
        try:
            server = BenchServer(args.model_path, sargs, stock=stock, name=name).start()
            break
        except RuntimeError as e:  # e.g. the CPU KV-cache sizing fails while others hold memory
            if attempt + 1 == args.start_attempts:
                raise
            print(f"   {name}: server failed to start ({str(e).splitlines()[0]}); retrying", flush=True)
            time.sleep(5)
    try:
        warmup(server, prompts, not stock)
    except BaseException:
        server.stop()
        raise
    return server


def run_one(name: str, server: BenchServer, args: argparse.Namespace, units: list[Unit]) -> dict[str, Any]:
    stock = server.stock
    try:
        started = time.monotonic()
        results, t0 = asyncio.run(run_workload(server.url, units, not stock, args.drain_timeout))
        wall = time.monotonic() - started
        status = None
        if not stock:
            try:
                status = requests.get(server.url + "/slo/status", timeout=5).json()
            except Exception as e:  # noqa: BLE001 - the status is informative only
                status = {"error": str(e)}
        startup = server.startup_s
    finally:
        server.stop()
    row = score(results, units, t0)
    row.update({"policy": name, "startup_s": startup, "wall_s": wall, "slo_status": status})
    return row


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}"


def print_table(rows: list[dict[str, Any]], base_name: str) -> str:
    base = next((r for r in rows if r["policy"] == base_name), rows[0])
    head = (
        f"{'policy':<8} {'reqs':>4} {'lost':>4} {'cut':>4} {'attain':>6} {'good/s':>6} {'DSLOt/s':>7} {'gain':>5} "
        f"{'lat':>5} {'ddl':>5} {'cmp':>5} {'TTFTp50':>7} {'TTFTp99':>7} {'tok/s':>6} "
        f"{'xgood':>5} {'xDSLO':>5} {'xgain':>5} {'xtok/s':>6}"
    )
    lines = [head, "-" * len(head)]

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.0f}%"

    for r in rows:
        by = r["attainment_by_class"]
        lines.append(
            f"{r['policy']:<8} {r['requests']:>4} {r['lost']:>4} {r['cut_at_drain_timeout']:>4} "
            f"{pct(r['attainment']):>6} {r['goodput_rps']:>6.2f} "
            f"{r['dslo_tokens_per_s']:>7.1f} {pct(r['gain_ratio']):>5} {pct(by['latency']):>5} "
            f"{pct(by['deadline']):>5} {pct(by['compound']):>5} {r['ttft_p50_s'] or 0:>7.2f} "
            f"{r['ttft_p99_s'] or 0:>7.2f} {r['throughput_tok_s']:>6.1f} "
            f"{ratio(r['goodput_rps'], base['goodput_rps']):>5} "
            f"{ratio(r['dslo_tokens_per_s'], base['dslo_tokens_per_s']):>5} "
            f"{ratio(r['gain_ratio'], base['gain_ratio']):>5} "
            f"{ratio(r['throughput_tok_s'], base['throughput_tok_s']):>6}"
        )
    table = "\n".join(lines)
    print(table, flush=True)
    return table


def add_server_and_trace_args(p: argparse.ArgumentParser) -> None:
    """Flags shared with throughput.py: which engine, and how trace lengths are scaled."""
    p.add_argument("--model-path", default="default", help="default (SmolLM2), tiny, or an HF folder")
    p.add_argument("--max-running-requests", type=int, default=8, help="server batch cap M (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--length-scale", type=float, default=0.1, help="trace lengths times this (default 0.1)")
    p.add_argument("--max-prompt", type=int, default=256)
    p.add_argument("--max-output", type=int, default=64)
    p.add_argument("--start-attempts", type=int, default=3, help="tries per server start-up")
    p.add_argument("--server-arg", action="append", default=[], help="extra server flag (repeatable, use =)")
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--json", type=Path, help="write every row and the set-up here")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    add_server_and_trace_args(p)
    p.add_argument("--policies", default=POLICIES, help=f"comma-separated (default {POLICIES})")
    p.add_argument("--stock", action="store_true", help="also run stock `python -m sglang.launch_server` first")
    p.add_argument("--rate", type=float, default=1.0, help="arrivals (requests or programs) per second")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    p.add_argument("--max-requests", type=int, default=2000, help="cap on arrivals")
    p.add_argument("--drain-timeout", type=float, default=240.0, help="seconds after the last arrival")
    p.add_argument("--mix", default="3:1:1", help="latency:deadline:compound arrival weights")
    p.add_argument("--slo-scale", type=float, default=4.0, help="SLOs = this x zero-load (default 4)")
    p.add_argument("--calib-requests", type=int, default=5)
    p.add_argument("--calib-ttft-ms", type=float, help="skip calibration: zero-load TTFT (with --calib-tpot-ms)")
    p.add_argument("--calib-tpot-ms", type=float, help="skip calibration: zero-load per-token time")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    install_signal_handlers()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    names = (["stock"] if args.stock else []) + policies
    if "fcfs" in names:  # fcfs first: its server also does the calibration
        names.remove("fcfs")
        names.insert(0, "fcfs")
    trace = load_trace(args.trace)
    model_dir = resolve_model(args.model_path)
    prompts = PromptSource(model_dir)
    prompt_len = int(statistics.median(scaled_lengths(r, args)[0] for r in trace))
    begun = time.monotonic()
    try:
        servers: dict[str, BenchServer] = {}
        if args.calib_ttft_ms and args.calib_tpot_ms:
            cal = Calibration(args.calib_ttft_ms, args.calib_tpot_ms, prompt_len)
        else:
            print(f"calibrating on fcfs ({args.calib_requests} sequential requests, {prompt_len}-token prompt)")
            servers["fcfs"] = start_server("fcfs", args, prompts)
            cal = calibrate(servers["fcfs"], args, prompts, prompt_len)
            if "fcfs" not in names:
                servers.pop("fcfs").stop()
        targets = slo_targets(cal, args)
        units = build_workload(args, trace, prompts, targets)
        calls = sum(len(u.calls) for u in units)
        print(
            f"zero-load TTFT {cal.ttft0_ms:.0f} ms, per-token {cal.tpot0_ms:.1f} ms -> SLOs (x{args.slo_scale}): "
            f"latency TTFT {targets['ttft_ms']:.0f} ms / TPOT {targets['tpot_ms']:.0f} ms, "
            f"deadline {targets['deadline_ms'] / 1000:.1f} s, compound {targets['deadline_ms'] / 1000:.1f} s x stages"
        )
        print(f"workload: {len(units)} arrivals ({calls} requests) over {args.duration:.0f} s at {args.rate}/s")
        rows = []
        for name in names:
            print(f"== {name}", flush=True)
            server = servers.pop(name, None) or start_server(name, args, prompts)
            row = run_one(name, server, args, units)
            print(
                f"   {row['requests']} requests, lost {row['lost']}, cut {row['cut_at_drain_timeout']}, "
                f"attained {row['attainment']:.0%} "
                f"(server says {row['server_attained']}), {row['throughput_tok_s']:.1f} tok/s, "
                f"wall {row['wall_s']:.0f} s (+{row['startup_s']:.0f} s start-up)",
                flush=True,
            )
            if row["lost"]:
                print(f"   LOST: {row['lost_errors']}", flush=True)
            rows.append(row)
            write_json(args, cal, targets, units, rows, names)
    finally:
        stop_all()
    print(f"\nratios (x...) vs {baseline(names)}; {time.monotonic() - begun:.0f} s total")
    table = print_table(rows, baseline(names))
    write_json(args, cal, targets, units, rows, names, table)


def baseline(names: list[str]) -> str:
    return "fcfs" if "fcfs" in names else names[0]


def write_json(
    args: argparse.Namespace,
    cal: Calibration,
    targets: dict[str, float],
    units: list[Unit],
    rows: list[dict[str, Any]],
    names: list[str],
    table: str | None = None,
) -> None:
    """Written after every policy (a later failure keeps the rows so far) and at the end."""
    if not args.json:
        return
    out = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {platform.processor()}".strip(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "calibration": asdict(cal),
        "slo_targets": targets,
        "arrivals": len(units),
        "requests": sum(len(u.calls) for u in units),
        "baseline": baseline(names),
        "complete": table is not None,
        "rows": rows,
        "table": table,
    }
    args.json.write_text(json.dumps(out, indent=2))
    if table is not None:
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
