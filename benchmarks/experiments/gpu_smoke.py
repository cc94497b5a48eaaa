"""Ten minutes on one GPU that say whether sglang-slo works there (benchmarks/experiments/gpu_smoke.sh).

Run it on a machine with one NVIDIA GPU after ./slo setup:

    benchmarks/experiments/gpu_smoke.sh                       # SmolLM2-135M from the package, no download
    benchmarks/experiments/gpu_smoke.sh --model-path /models/Llama-3.1-8B-Instruct --json smoke.json

It starts stock SGLang, then a router with our workers, on the one card (each server takes
--mem-fraction of it), and prints one table, a row per check; the exit status is 0 when every
check passes. The checks, in order:

  driver        nvidia-smi answers and torch sees a CUDA device
  setup         the CPU import hook (sglang_slo_cpu.pth) is not in the venv and torch is a CUDA build
  throughput    sglang.bench_serving (random-ids, fixed lengths, closed loop) against stock SGLang and
                against our server with --slo-policy fcfs, same flags: ours >= 98 % of stock
  router        the same benchmark through launch_router in front of that worker: no request fails
  perf model    the online perf model learns from CUDA events, is ready, and its decode step at batch 8
                is within 20 % of the TPOT sglang.bench_serving measures at concurrency 8
  preemption    LAS with two slots preempts two long requests for two short ones; the long ones
                resume token-identical to an un-preempted run (greedy)
  failover      a worker is killed while it streams a request through the router: the request ends on
                the other worker with every token, none repeated
  emulation     --emulate-gpu a40 on this GPU (the tiny model sized for GPU kernels): serves, and the
                share of late steps is reported

--allow-cpu runs the same flow on a machine without a GPU (the tiny model; driver and timing
rows are skipped), to check the command itself.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ("driver", "setup", "throughput", "router", "perf model", "preemption", "failover", "emulation")
THROUGHPUT_GOAL = 0.98  # ours / stock SGLang, --slo-policy fcfs
TPOT_TOLERANCE = 0.20  # |predicted decode step / measured TPOT - 1|


@dataclass
class Check:
    name: str
    passed: bool | None  # None: skipped or informational
    value: str
    goal: str

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "FAIL", None: "-"}[self.passed]


def render(checks: list[Check]) -> str:
    """The one table the command prints (Markdown, so it can go into benchmarks/RESULTS.md as is)."""
    rows = [("check", "result", "measured", "goal")] + [(c.name, c.verdict, c.value, c.goal) for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    line = lambda r: "| " + " | ".join(cell.ljust(w) for cell, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(rows[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows[1:])])


def within(measured: float, predicted: float, tolerance: float) -> bool:
    return measured > 0 and abs(predicted / measured - 1.0) <= tolerance


def bench_result(jsonl: str) -> dict[str, Any]:
    """The last result sglang.bench_serving appended to its --output-file."""
    lines = [line for line in jsonl.splitlines() if line.strip()]
    if not lines:
        raise ValueError("sglang.bench_serving wrote no result")
    return json.loads(lines[-1])


# ---- running things ---------------------------------------------------------------------------------


def _bench(url: str, tokenizer: str, prompts: int, concurrency: int, input_len: int, output_len: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.jsonl"
        cmd = [
            sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", url,
            "--dataset-name", "random-ids", "--random-input-len", str(input_len), "--random-output-len",
            str(output_len), "--random-range-ratio", "1.0", "--num-prompts", str(prompts), "--max-concurrency",
            str(concurrency), "--tokenizer", tokenizer, "--seed", "0", "--disable-tqdm", "--output-file", str(out),
        ]  # fmt: skip
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"sglang.bench_serving failed:\n{(done.stdout + done.stderr)[-3000:]}")
        return bench_result(out.read_text())


def _post(url: str, body: dict, timeout: float = 300) -> dict:
    import requests

    resp = requests.post(url + "/generate", json=body, timeout=timeout)
    resp.raise_for_status()
    return resp.json()


def _greedy(ids: list[int], n: int) -> dict:
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}


def _status(url: str) -> dict:
    import requests

    return requests.get(url + "/slo/status", timeout=10).json()


def _wait(ok: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.25)


class Smoke:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.checks: list[Check] = []
        self.on_gpu = not args.allow_cpu

    def add(self, name: str, passed: bool | None, value: str, goal: str) -> None:
        self.checks.append(Check(name, passed, value, goal))
        print(f"[gpu-smoke] {name}: {Check(name, passed, value, goal).verdict} {value}", flush=True)

    def guarded(self, name: str, goal: str, run: Callable[[], None]) -> None:
        if name in self.args.skip:
            self.add(name, None, "skipped (--skip)", goal)
            return
        try:
            run()
        except Exception as exc:  # noqa: BLE001 - a failed check is a row, the others still run
            self.add(name, False, f"{type(exc).__name__}: {str(exc)[:200]}", goal)

    # -- checks --

    def driver(self) -> None:
        if not self.on_gpu:
            self.add("driver", None, "skipped: --allow-cpu", "nvidia-smi, torch.cuda")
            return
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        import torch

        ok = smi.returncode == 0 and torch.cuda.is_available()
        self.add(
            "driver",
            ok,
            smi.stdout.strip().splitlines()[0] if smi.stdout.strip() else smi.stderr.strip()[:120],
            "nvidia-smi answers, torch sees CUDA",
        )

    def setup(self) -> None:
        import torch

        from server.cpu_support.venv_hook import installed_pth

        hook = installed_pth()
        cuda = torch.version.cuda
        ok = hook is None and (bool(cuda) or not self.on_gpu)
        self.add(
            "setup",
            ok,
            f"CPU hook {'present: ' + str(hook) if hook else 'absent'}; torch {torch.__version__}",
            "no CPU hook, a CUDA torch",
        )

    def run(self) -> list[Check]:
        from benchmarks._server import BenchServer, install_signal_handlers, resolve_model
        from server.process import ServerProcess, free_port

        install_signal_handlers()
        args = self.args
        self.driver()
        self.setup()
        model = resolve_model(args.model_path or ("default" if self.on_gpu else "tiny"))
        share = ["--mem-fraction-static", str(args.mem_fraction)]
        bench = (args.prompts, args.concurrency, args.input_len, args.output_len)
        stock_tp: dict[str, float] = {}

        def stock() -> None:
            with BenchServer(model, share, stock=True, name="smoke-stock") as server:
                stock_tp["tok/s"] = _bench(server.url, model, *bench)["output_throughput"]

        if "throughput" not in args.skip:
            self.guarded("throughput", "", stock)
        worker_port = free_port()
        router = ServerProcess(
            "--worker-port", str(worker_port), "--routing-policy", "least_request", "--tokenizer-path", model,
            "--dead-after-s", "2", name="smoke-router", module="launch_router", ready_path="/slo/status",
        )  # fmt: skip
        join = ["--router-address", f"tcp://127.0.0.1:{worker_port}"]
        w0 = BenchServer(model, [*share, "--slo-policy", "fcfs", *join, "--worker-id", "w0"], name="smoke-w0")
        las = [
            "--slo-policy", "las", "--slo-policy-param", "level_thresholds=[48]", "--slo-policy-param",
            "quantum_steps=1", "--slo-policy-param", "starvation_s=null", "--max-running-requests", "2",
        ]  # fmt: skip
        w1 = BenchServer(model, [*share, *las, *join, "--worker-id", "w1"], name="smoke-w1")
        try:
            router.start()
            w0.start()
            _wait(lambda: _healthy(router.url) == {"w0"}, 60, "w0 did not join the router")
            self.guarded(
                "throughput", f">= {THROUGHPUT_GOAL:.0%} of stock SGLang", lambda: self._throughput(w0, model, stock_tp)
            )
            self.guarded("router", "no failed request", lambda: self._router(router, model))
            self.guarded(
                "perf model", f"cuda_events, ready, within {TPOT_TOLERANCE:.0%}", lambda: self._perf(w0, model)
            )
            w1.start()
            _wait(lambda: _healthy(router.url) == {"w0", "w1"}, 60, "w1 did not join the router")
            self.guarded("preemption", "token-identical after a retraction", lambda: self._preemption(w1))
            self.guarded(
                "failover", "every token, on the other worker", lambda: self._failover(router, {"w0": w0, "w1": w1})
            )
        finally:
            for server in (w1, w0, router):
                server.stop()
        self.guarded("emulation", "serves; late share reported", self._emulation)
        return self.checks

    def _throughput(self, w0: Any, model: str, stock: dict[str, float]) -> None:
        ours = _bench(
            w0.url, model, self.args.prompts, self.args.concurrency, self.args.input_len, self.args.output_len
        )
        if "tok/s" not in stock:
            self.add("throughput", None, f"fcfs {ours['output_throughput']:.0f} tok/s (stock not run)", "")
            return
        ratio = ours["output_throughput"] / stock["tok/s"]
        self.add(
            "throughput",
            ratio >= THROUGHPUT_GOAL,
            f"fcfs {ours['output_throughput']:.0f} / stock {stock['tok/s']:.0f} tok/s = {ratio:.1%}",
            f">= {THROUGHPUT_GOAL:.0%} of stock SGLang",
        )

    def _router(self, router: Any, model: str) -> None:
        result = _bench(
            router.url, model, self.args.prompts, self.args.concurrency, self.args.input_len, self.args.output_len
        )
        ok = result["completed"] == self.args.prompts
        self.add(
            "router",
            ok,
            f"{result['completed']}/{self.args.prompts} completed, {result['output_throughput']:.0f} tok/s",
            "no failed request",
        )

    def _perf(self, w0: Any, model: str) -> None:
        # batch 8 at ~128 KV tokens per request: 64 prompt tokens, 128 generated (mean KV 128)
        result = _bench(w0.url, model, 96, 8, 64, 128)
        perf = _status(w0.url)["engine"]["perf_model"]
        predicted, measured = float(perf["predicted_decode_ms"]["8"]), float(result["mean_tpot_ms"])
        timing_ok = perf.get("timing") == ("cuda_events" if self.on_gpu else "wall")
        ok = timing_ok and perf["ready"] and within(measured, predicted, TPOT_TOLERANCE)
        self.add(
            "perf model",
            ok,
            f"{perf.get('timing')}, ready={perf['ready']}, predicted {predicted:.2f} ms vs TPOT {measured:.2f} ms",
            f"cuda_events, ready, within {TPOT_TOLERANCE:.0%}",
        )

    def _preemption(self, w1: Any) -> None:
        import requests

        long_ids = [[5 + (i * 7 + j) % 400 for i in range(30)] for j in range(2)]
        short_ids = [[9 + (i * 3 + j) % 400 for i in range(8)] for j in range(2)]
        reference = [_post(w1.url, _greedy(ids, 240))["output_ids"] for ids in long_ids]
        requests.post(w1.url + "/flush_cache", timeout=30)
        results: dict[int, dict] = {}
        started = [threading.Event() for _ in long_ids]

        def long_run(j: int) -> None:
            body = {**_greedy(long_ids[j], 240), "stream": True}
            with requests.post(w1.url + "/generate", json=body, stream=True, timeout=300) as resp:
                for line in resp.iter_lines():
                    if line.startswith(b"data:") and line.strip() != b"data: [DONE]":
                        results[j] = json.loads(line[5:])
                        if results[j]["meta_info"]["completion_tokens"] >= 96:
                            started[j].set()
            started[j].set()

        threads = [threading.Thread(target=long_run, args=(j,)) for j in range(2)]
        for t in threads:
            t.start()
        for e in started:
            e.wait(120)
        shorts = [threading.Thread(target=_post, args=(w1.url, _greedy(ids, 8))) for ids in short_ids]
        for t in shorts:  # newcomers while both slots are taken: LAS retracts the long requests
            t.start()
        for t in threads + shorts:
            t.join(300)
        retractions = sum(results[j]["meta_info"].get("num_retractions", 0) for j in results)
        same = all(results.get(j, {}).get("output_ids") == reference[j] for j in range(2))
        self.add(
            "preemption",
            same and retractions >= 1,
            f"{retractions} retraction(s), tokens identical: {same}",
            "token-identical after a retraction",
        )

    def _failover(self, router: Any, workers: dict[str, Any]) -> None:
        import requests

        n = 600
        body = {**_greedy([5 + (i * 13) % 400 for i in range(40)], n), "stream": True}
        out: dict[str, Any] = {"ids": []}

        def stream() -> None:
            with requests.post(router.url + "/generate", json=body, stream=True, timeout=600) as resp:
                for line in resp.iter_lines():
                    if line.startswith(b"data:") and line.strip() != b"data: [DONE]":
                        chunk = json.loads(line[5:])
                        out["ids"], out["meta"] = chunk.get("output_ids", out["ids"]), chunk.get("meta_info", {})

        thread = threading.Thread(target=stream)
        thread.start()
        _wait(lambda: len(out["ids"]) >= 50, 120, "the stream never started")
        busy = [w["worker_id"] for w in _status(router.url)["workers"] if w.get("inflight")]
        victim = workers[busy[0]]
        os.killpg(victim.proc.pid, signal.SIGKILL)
        thread.join(600)
        served_by = out.get("meta", {}).get("workers", [])
        ok = len(out["ids"]) == n and len(served_by) >= 2 and served_by[-1] != busy[0]
        self.add(
            "failover",
            ok,
            f"killed {busy[0]}; {len(out['ids'])}/{n} tokens, served by {served_by}",
            "every token, on the other worker",
        )

    def _emulation(self) -> None:
        from server.process import ServerProcess

        # no --model-path: launch_server serves the tiny model sized for this device's kernels
        with ServerProcess("--emulate-gpu", "a40", "--mem-fraction-static", "0.2", name="smoke-emulated") as s:
            _post(s.url, _greedy([5, 6, 7, 8], 64))
            emulation = _status(s.url)["engine"]["emulation"]
        self.add(
            "emulation",
            True,
            f"a40 on this device: {emulation['steps']} steps, late share {emulation['late_share']}",
            "serves; late share reported",
        )


def _healthy(router_url: str) -> set[str]:
    try:
        return {w["worker_id"] for w in _status(router_url)["workers"] if w["healthy"]}
    except Exception:  # noqa: BLE001 - not up yet
        return set()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks/experiments/gpu_smoke.sh",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model-path", help="a local model folder (default: SmolLM2-135M-Instruct from the package)")
    p.add_argument("--mem-fraction", type=float, default=0.3, help="each server's --mem-fraction-static (default 0.3)")
    p.add_argument("--prompts", type=int, default=256, help="requests per throughput run (default 256)")
    p.add_argument("--concurrency", type=int, default=32, help="closed-loop clients per throughput run (default 32)")
    p.add_argument("--input-len", type=int, default=256, help="prompt tokens per request (default 256)")
    p.add_argument("--output-len", type=int, default=128, help="output tokens per request (default 128)")
    p.add_argument("--skip", action="append", default=[], choices=CHECKS, help="leave a check out (repeatable)")
    p.add_argument("--json", type=Path, help="also write the table's rows here")
    p.add_argument("--allow-cpu", action="store_true", help="run the flow without a GPU (tiny model), to test it")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sys.path.insert(0, str(ROOT))
    started = time.monotonic()
    checks = Smoke(args).run()
    print(f"\nsglang-slo GPU smoke ({time.monotonic() - started:.0f} s)\n")
    print(render(checks))
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in checks], indent=2))
    return 0 if all(c.passed is not False for c in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
