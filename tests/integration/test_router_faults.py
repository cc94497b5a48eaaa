"""Faults and trust through the router, on real tiny-model workers that share a worker secret
(separate from the client API key): forged Registers are refused; a worker frozen with SIGSTOP
(hung, its sockets open) loses its stream to the other worker with nothing lost or repeated,
and once it thaws the request it still holds is aborted; a router that crashes and restarts
under a stream aborts what the workers still hold for the old one; an abusive chat request is
refused quickly while another stream keeps flowing; and a worker drained with SIGTERM finishes
its stream, gets no new work and exits. About 2.5 minutes (two workers and a router start once).
A router that crashes under a stream leaves its client with a closed connection (an answer, not
a hang); the workers keep what they held until the restarted router sees it in their reports.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
import requests
import zmq

from router.protocol import Ack, Challenge, Heartbeat, Register, decode
from router.worker_auth import SECRET_ENV, WorkerAuth, legacy_secret
from server.process import ServerProcess, free_port

API_KEY = "client-key-of-the-faults-test"
SECRET = "the workers' own secret of the faults test"
HTTP = requests.Session()
HTTP.headers["Authorization"] = f"Bearer {API_KEY}"
ADMIN_KEY = "the operator's key of the faults test"  # the router's /slo/status is the admin's
ADMIN = requests.Session()
ADMIN.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
PROMPT = [5 + (i * 7) % 500 for i in range(40)]
WORKERS = ("tiny-a", "tiny-b")


@dataclass
class Pool:
    router: ServerProcess
    worker_port: int
    workers: dict[str, ServerProcess] = field(default_factory=dict)

    def status(self) -> dict:
        return ADMIN.get(self.router.url + "/slo/status", timeout=10).json()

    def healthy(self) -> set[str]:
        return {w["worker_id"] for w in self.status()["workers"] if w["healthy"]}

    def wait(self, cond, timeout: float = 60.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"{what} not met in {timeout:g} s"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    env = {**os.environ, SECRET_ENV: SECRET}
    worker_port = free_port()
    router = ServerProcess(
        "--worker-port", str(worker_port), "--routing-policy", "round_robin", "--api-key", API_KEY,
        "--dead-after-s", "2", name="router-faults", module="launch_router", ready_path="/slo/status",
        api_key=ADMIN_KEY, env={**env, "SGLANG_SLO_ADMIN_API_KEY": ADMIN_KEY},
    )  # fmt: skip
    p = Pool(router, worker_port)
    for wid in WORKERS:
        p.workers[wid] = ServerProcess(
            "--model-path", "tiny", "--router-address", f"tcp://127.0.0.1:{worker_port}", "--worker-id", wid,
            "--api-key", API_KEY, "--slo-drain-timeout-s", "20", name=wid, api_key=API_KEY, env=env,
        )  # fmt: skip
    every = [router, *p.workers.values()]
    try:
        with ThreadPoolExecutor(len(every)) as ex:
            list(ex.map(lambda s: s.start(), every))
        p.wait(lambda: set(WORKERS) <= p.healthy(), what="workers joined")
        yield p
    finally:
        for proc in p.workers.values():  # a frozen worker must thaw to stop
            if proc.proc is not None:
                try:
                    os.killpg(proc.proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        with ThreadPoolExecutor(len(every)) as ex:
            list(ex.map(lambda s: s.stop(), every))


class Stream(threading.Thread):
    """A native stream through the router, recording its ids and when each chunk came."""

    def __init__(self, url: str, rid: str, n: int) -> None:
        super().__init__()
        self.url, self.rid, self.n = url, rid, n
        self.ids: list[int] = []
        self.times: list[float] = []
        self.meta: dict = {}
        self.error: str | None = None
        self.start()

    def run(self) -> None:
        body = {
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": self.n, "ignore_eos": True, "temperature": 0},
            "stream": True,
            "rid": self.rid,
        }
        try:
            with HTTP.post(self.url + "/generate", json=body, stream=True, timeout=120) as resp:
                for line in resp.iter_lines():
                    if not line.startswith(b"data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        self.error = chunk["error"]["message"]
                        return
                    self.ids = chunk["output_ids"]
                    self.meta = chunk["meta_info"]
                    self.times.append(time.monotonic())
        except requests.RequestException as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def max_gap_s(self) -> float:
        return max((b - a for a, b in zip(self.times, self.times[1:])), default=0.0)


def _owner(pool: Pool, rid: str) -> str:
    pool.wait(lambda: rid in pool.status()["dispatcher"]["owners"], timeout=30, what=f"{rid} placed")
    return pool.status()["dispatcher"]["owners"][rid]


def _dealer(pool: Pool, identity: bytes) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, identity)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(f"tcp://127.0.0.1:{pool.worker_port}")
    return sock


def _register(sock: zmq.Socket, auth: WorkerAuth, worker_id: str) -> tuple[Register, object]:
    reg = Register(worker_id=worker_id, gpu="cpu", model="m", kv_capacity_tokens=16, max_running=1)
    sock.send(auth.hello(reg).to_wire())
    challenge = decode(sock.recv())
    assert isinstance(challenge, Challenge)
    answer = auth.answer(challenge, reg)
    assert answer is not None
    sock.send(answer.to_wire())
    return answer, decode(sock.recv())


def test_forged_registers_are_refused(pool: Pool) -> None:
    key_holder = _dealer(pool, b"forger-1")
    _, ack = _register(key_holder, WorkerAuth(legacy_secret(API_KEY)), "forged-key")  # the client key is no credential
    assert isinstance(ack, Ack) and not ack.accepted and ack.reason == "wrong worker secret"

    honest = _dealer(pool, b"forger-2")
    signed, ack = _register(honest, WorkerAuth(SECRET.encode()), "replayed")
    assert isinstance(ack, Ack) and ack.accepted
    replayer = _dealer(pool, b"forger-3")
    replayer.send(signed.to_wire())  # the same proof again, from another connection
    again = decode(replayer.recv())
    assert isinstance(again, Ack) and not again.accepted and "challenge" in again.reason

    before = pool.status()["dispatcher"]["foreign_dropped"]
    replayer.send(Heartbeat(worker_id="tiny-a", seq=10**9).to_wire())  # speaking for another's id
    pool.wait(lambda: pool.status()["dispatcher"]["foreign_dropped"] > before, timeout=10, what="dropped")
    assert "forged-key" not in {w["worker_id"] for w in pool.status()["workers"]}
    for sock in (key_holder, honest, replayer):
        sock.close()
    pool.wait(lambda: "replayed" not in pool.healthy(), timeout=10, what="the silent test worker dead")
    info = HTTP.get(pool.router.url + "/get_model_info", timeout=30)  # fetched over the worker link
    assert info.status_code == 200 and "model_path" in info.json()


def test_a_frozen_worker_loses_its_stream_whole_and_its_orphan_is_aborted(pool: Pool) -> None:
    stream = Stream(pool.router.url, "frozen-1", 1200)  # its orphan outlives the thaw
    owner = _owner(pool, "frozen-1")
    pool.wait(lambda: len(stream.times) >= 3, timeout=30, what="tokens flowing")
    before = pool.status()["dispatcher"]
    pid = pool.workers[owner].proc.pid  # type: ignore[union-attr]
    os.killpg(pid, signal.SIGSTOP)  # hung: no heartbeats, sockets open
    try:
        stream.join(timeout=120)
    finally:
        os.killpg(pid, signal.SIGCONT)
    assert stream.error is None and len(stream.ids) == 1200, stream.error
    other = next(w for w in WORKERS if w != owner)
    # It moved to the other worker and never back to the frozen one. A starved host can make
    # the router miss the other's messages for its 2 s liveness window too; the stream then
    # resumes there once more (seen in CI: [owner, other, other]), still whole.
    legs = stream.meta["workers"]
    assert legs[0] == owner and legs[1:] and set(legs[1:]) == {other}, legs
    after = pool.status()["dispatcher"]
    assert after["resubmitted"] > before["resubmitted"] and after["workers_lost"] > before["workers_lost"]
    pool.wait(lambda: owner in pool.healthy(), timeout=30, what="the thawed worker back")
    # Its copy is aborted either by the abort queued on its socket while it hung, or by the
    # reconciliation of its first load report when it answers again.
    aborts = ("orphans_aborted", "stale_aborts_sent")
    pool.wait(
        lambda: sum(pool.status()["dispatcher"][k] - before[k] for k in aborts) > 0,
        timeout=30,
        what="orphan aborted",
    )
    worker = pool.workers[owner]
    pool.wait(lambda: HTTP.get(worker.url + "/slo/status", timeout=10).json()["engine"]["running"] == 0, 30, "idle")


def test_an_abusive_chat_request_is_refused_quickly_while_a_stream_flows(pool: Pool) -> None:
    stream = Stream(pool.router.url, "flowing-1", 400)
    pool.wait(lambda: len(stream.times) >= 3, timeout=30, what="tokens flowing")
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    started = time.monotonic()
    assert HTTP.post(pool.router.url + "/v1/chat/completions", json=chat, timeout=60).status_code == 200
    served_s = time.monotonic() - started
    started = time.monotonic()
    resp = HTTP.post(
        pool.router.url + "/v1/chat/completions",
        json={**chat, "chat_template_kwargs": {"x": "{{ 9 ** 9 }}"}},
        timeout=60,
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "chat_template_kwargs.x"
    # Refused before any rendering or engine work: no slower than serving the plain request
    # (relative, so a slow host slows both).
    assert time.monotonic() - started <= 2 * served_s + 0.5
    huge = {"messages": [{"role": "user", "content": "lorem ipsum " * 600_000}], "max_tokens": 2}  # ~7 MB
    resp = HTTP.post(pool.router.url + "/v1/chat/completions", json=huge, timeout=120)
    assert resp.status_code in (400, 413), resp.text[:300]
    stream.join(timeout=300)
    assert stream.error is None and len(stream.ids) == 400
    gaps = sorted(b - a for a, b in zip(stream.times, stream.times[1:]))
    # Tokenizing 7 MB on the router's event loop would stall every stream for seconds; the
    # stream's own pace sets the bar, so a slow host does not fail it.
    assert stream.max_gap_s() < max(3.0, 20 * gaps[len(gaps) // 2]), "the router's event loop stalled"


def test_a_router_crash_and_restart_answers_its_streams_and_aborts_what_workers_still_hold(pool: Pool) -> None:
    stream = Stream(pool.router.url, "restart-1", 4000)  # with the 40-token prompt: the tiny model's context
    owner = _owner(pool, "restart-1")
    pool.wait(lambda: len(stream.times) >= 3, timeout=30, what="tokens flowing")
    pool.router.stop(0.0)  # a crash: no chance to tell the workers anything
    stream.join(timeout=30)
    assert not stream.is_alive() and stream.error is not None  # answered, not left hanging
    pool.router.start()
    pool.wait(lambda: set(WORKERS) <= pool.healthy(), what="workers rejoined the new router")
    worker = pool.workers[owner]

    def running() -> int:
        return requests.get(worker.url + "/slo/status", headers=HTTP.headers, timeout=10).json()["engine"]["running"]

    if running() > 0:  # a slow host's restart can outlast the orphan; while it lives, it is aborted
        pool.wait(lambda: pool.status()["dispatcher"]["orphans_aborted"] >= 1, timeout=30, what="orphan aborted")
    pool.wait(lambda: running() == 0, timeout=30, what="worker idle")


def test_a_draining_worker_finishes_its_stream_takes_nothing_new_and_exits(pool: Pool) -> None:
    """Last in the module: the drained worker is gone afterwards."""
    stream = Stream(pool.router.url, "drain-1", 600)
    owner = _owner(pool, "drain-1")
    pool.wait(lambda: len(stream.times) >= 3, timeout=30, what="tokens flowing")
    proc = pool.workers[owner].proc
    assert proc is not None
    os.kill(proc.pid, signal.SIGTERM)  # the worker's own process only: its scheduler keeps running
    pool.wait(lambda: owner not in pool.healthy(), timeout=10, what="draining worker unroutable")
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4}}
    fresh = HTTP.post(pool.router.url + "/generate", json=body, timeout=60)
    assert fresh.status_code == 200 and owner not in fresh.json()["meta_info"]["workers"]
    stream.join(timeout=60)
    assert stream.error is None and len(stream.ids) == 600, stream.error
    assert proc.wait(timeout=30) is not None  # it exited by itself
