"""PD disaggregation for real (issue #8): SGLang prefill and decode workers under our launcher
(the SLO adapter active in both modes), KV moved by Mooncake over TCP, paired per request by
our router.

- A PD pair behind the router returns the tokens a co-located server returns (temperature 0).
- A prefill worker SIGKILLed while it holds a request's prefill: the router aborts the decode
  half and pairs the request again; the client gets every token.
- A decode worker SIGKILLed mid-stream: the request resumes on a new pair from the tokens
  already streamed; nothing is lost or repeated.

The workers are emulated H100s, slowed down so a prefill or a stream lasts long enough to kill
a worker in the middle of it. Killed workers stay down (the tests run in file order: the decode
kill needs one prefill worker and both decode workers).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import requests

from server.models import ensure_tiny_model
from server.process import ServerProcess, free_port
from tests.integration.test_router import HTTP, JOIN_TIMEOUT_S, stream_generate

pytest.importorskip("mooncake.engine", reason="the Mooncake transfer engine is installed by ./slo setup")

PROMPTS = [[5 + (i * 7 + j) % 500 for i in range(24 + 8 * j)] for j in range(4)]
LONG_PROMPT = [5 + (i * 13) % 500 for i in range(1500)]  # ~4 s of emulated prefill at x100
PREFILL_SLOWDOWN = "100"
DECODE_SLOWDOWN = "20"  # ~0.14 s per token


@dataclass
class PdPool:
    router: ServerProcess
    workers: dict[str, ServerProcess]

    def status(self) -> dict:
        return HTTP.get(self.router.url + "/slo/status", timeout=5).json()

    def healthy(self) -> set[str]:
        return {w["worker_id"] for w in self.status()["workers"] if w["healthy"]}

    def wait_joined(self, want: set[str], timeout: float = JOIN_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not want <= self.healthy():
            assert time.monotonic() < deadline, f"{want - self.healthy()} did not join"
            time.sleep(0.2)


def _worker(worker_port: int, worker_id: str, mode: str, slowdown: str) -> ServerProcess:
    flags = ["--disaggregation-mode", mode, "--emulate-gpu", "h100", "--emulate-slowdown", slowdown]
    flags.append("--emulate-full-forward")  # the tiny model's own tokens: the pair is compared with a tiny server
    if mode == "prefill":  # B = 1024: LONG_PROMPT (1500) is one whole-finish step, not two chunks
        flags += ["--disaggregation-bootstrap-port", str(free_port()), "--chunked-prefill-size", "1024"]
    return ServerProcess(
        *flags, "--router-address", f"tcp://127.0.0.1:{worker_port}", "--worker-id", worker_id,
        "--slo-policy", "edf", name=worker_id,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pd() -> Iterator[PdPool]:
    worker_port = free_port()
    # The workers' model (emulated cards run the tiny one): named up front, the router loads its
    # tokenizer while the workers start, not during the first request after they joined.
    router = ServerProcess(
        "--worker-port", str(worker_port), "--routing-policy", "polyserve", "--dead-after-s", "2",
        "--tokenizer-path", str(ensure_tiny_model()),
        name="router-pd", module="launch_router", ready_path="/slo/status",
    )  # fmt: skip
    workers = {
        "prefill-0": _worker(worker_port, "prefill-0", "prefill", PREFILL_SLOWDOWN),
        "prefill-1": _worker(worker_port, "prefill-1", "prefill", PREFILL_SLOWDOWN),
        "decode-0": _worker(worker_port, "decode-0", "decode", DECODE_SLOWDOWN),
        "decode-1": _worker(worker_port, "decode-1", "decode", DECODE_SLOWDOWN),
    }
    everything = [router, *workers.values()]
    try:
        with ThreadPoolExecutor(len(everything)) as ex:
            list(ex.map(lambda s: s.start(), everything))
        pool = PdPool(router, workers)
        pool.wait_joined(set(workers))
        yield pool
    finally:
        with ThreadPoolExecutor(len(everything)) as ex:
            list(ex.map(lambda s: s.stop(), everything))


def _generate(url: str, ids: list[int], n: int, headers: dict | None = None) -> dict:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
    resp = requests.post(url + "/generate", json=body, headers=headers or {}, timeout=300)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_a_pd_pair_returns_the_tokens_of_a_co_located_server(pd: PdPool, tiny_server: ServerProcess) -> None:
    for ids in PROMPTS:
        reference = _generate(tiny_server.url, ids, 12)["output_ids"]
        out = _generate(pd.router.url, ids, 12, HTTP.headers)
        assert out["output_ids"] == reference
        meta = out["meta_info"]
        assert meta["workers"][0].startswith("decode-") and meta["prefill_workers"][0].startswith("prefill-")
        assert meta["slo"] is not None  # scored once, at the router, for the pair
    status = pd.status()
    assert status["dispatcher"]["pd_pairs"] >= len(PROMPTS)
    for wid in ("decode-0", "decode-1"):
        engine = requests.get(pd.workers[wid].url + "/slo/status", timeout=5).json()["engine"]
        assert engine["disaggregation_mode"] == "decode" and engine["dynamic_chunking"] is None
    roles = {w["worker_id"]: w["role"] for w in status["workers"]}
    assert roles == {"prefill-0": "prefill", "prefill-1": "prefill", "decode-0": "decode", "decode-1": "decode"}
    engines = {wid: w.status_when(lambda s: bool(s["engine"]))["engine"] for wid, w in pd.workers.items()}
    for wid, engine in engines.items():  # no worker's pass fell back to SGLang's own scheduling
        assert engine["plan_errors"] == 0 and engine["fallbacks"] == 0, (wid, engine)
    for role in ("prefill", "decode"):  # and the policy planned both halves of the pairs
        assert any(e["planned_passes"] > 0 for wid, e in engines.items() if wid.startswith(role)), role


def _kill(process: ServerProcess) -> None:
    """SIGKILL the whole server (HTTP process, scheduler, detokenizer), as a crash would."""
    assert process.proc is not None
    os.killpg(os.getpgid(process.proc.pid), signal.SIGKILL)
    process.proc.wait(timeout=30)


def _start_in_background(url: str, body: dict, out: dict) -> threading.Thread:
    def run() -> None:
        try:
            out["result"] = stream_generate(url, body)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _partner_of(pd: PdPool, rid: str, key: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = pd.status()["dispatcher"][key].get(rid)
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{rid} never showed up in {key}")


def test_prefill_workers_start_sglang_at_twice_their_chunk(pd: PdPool) -> None:
    """PD start-up sizing: a prefill worker asked for chunks of B (1024) starts SGLang at 2B, so
    that a whole-finish step fits the buffers sized at start-up, and plans normal passes at B."""
    for wid in ("prefill-0", "prefill-1"):
        engine = pd.workers[wid].status_when(lambda s: bool(s["engine"]))["engine"]
        assert (engine["startup_chunk_size"], engine["chunk_budget"]) == (2048, 1024), (wid, engine)
        assert engine["dynamic_chunking"] is not None


def test_a_prefill_worker_killed_mid_prefill_loses_nothing(pd: PdPool) -> None:
    rid = "pd-kill-prefill"
    body = {
        "input_ids": LONG_PROMPT,
        "rid": rid,
        "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
    }
    out: dict = {}
    thread = _start_in_background(pd.router.url, body, out)
    victim = _partner_of(pd, rid, "prefill_partners")
    time.sleep(0.5)  # inside the ~4 s prefill
    _kill(pd.workers[victim])
    thread.join(timeout=180)
    assert not thread.is_alive() and "error" not in out, out.get("error")
    ids, meta, counts = out["result"]
    assert len(ids) == 8 and counts == sorted(counts)
    other = "prefill-1" if victim == "prefill-0" else "prefill-0"
    assert meta["prefill_workers"] == [victim, other]
    assert pd.status()["dispatcher"]["pd_prefill_failed"] >= 1
    engine = requests.get(pd.workers[other].url + "/slo/status", timeout=5).json()["engine"]
    assert engine["disaggregation_mode"] == "prefill"
    assert engine["startup_chunk_size"] == 2048 and engine["chunk_budget"] == 1024  # started at 2B
    assert engine["dynamic_chunking"]["finished_whole"] >= 1  # PolyServe §4.7: 1500 tokens in one step


def test_a_decode_worker_killed_mid_stream_loses_nothing(pd: PdPool) -> None:
    rid = "pd-kill-decode"
    body = {
        "input_ids": PROMPTS[0],
        "rid": rid,
        "sampling_params": {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True},
    }
    out: dict = {}
    thread = _start_in_background(pd.router.url, body, out)
    victim = _partner_of(pd, rid, "owners")
    time.sleep(2.5)  # ~1 s of prefill, then tokens stream at ~0.14 s each
    assert "result" not in out, "the stream ended before the kill: slow the decode workers down"
    _kill(pd.workers[victim])
    thread.join(timeout=180)
    assert not thread.is_alive() and "error" not in out, out.get("error")
    ids, meta, counts = out["result"]
    assert len(ids) == 40 and counts == sorted(counts) and len(set(counts)) == len(counts)
    other = "decode-1" if victim == "decode-0" else "decode-0"
    assert meta["workers"] == [victim, other]
