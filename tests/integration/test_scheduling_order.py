"""EDF vs FCFS on the real engine: one running slot, a queue whose deadlines run opposite to
arrival order. EDF serves the queue in deadline order, FCFS in arrival order."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import requests

from server.process import ServerProcess
from tests.integration.test_policies_on_engine import assert_serves_mixed_workload

QUEUED = 4
# policy -> the module fixture whose server also runs test_policies_on_engine's mixed workload
MIXED_ON_ENGINE = {"edf": "edf_one_slot", "fcfs": "fcfs_one_slot"}


class Blocker(threading.Thread):
    """A long request that holds the only running slot; `ended` says when its stream closed and
    `release` aborts it, so a test need not guess how long the host takes to decode it."""

    def __init__(self, server: ServerProcess, tokens: int, rid: str | None) -> None:
        super().__init__()
        self.server, self.tokens, self.rid = server, tokens, rid
        self.running, self.ended = threading.Event(), threading.Event()
        self.status: int | None = None

    def run(self) -> None:
        body: dict = {
            "text": "blocker",
            "sampling_params": {"max_new_tokens": self.tokens, "ignore_eos": True, "temperature": 0},
            "stream": True,
        }
        if self.rid is not None:
            body["rid"] = self.rid
        try:
            with requests.post(self.server.url + "/generate", json=body, timeout=300, stream=True) as resp:
                self.status = resp.status_code
                for line in resp.iter_lines():
                    if line:
                        self.running.set()
        finally:
            self.ended.set()
            self.running.set()  # ended early (an error): let the caller's checks report it

    def release(self) -> None:
        """Aborts it (it must have been started with a rid) and waits for its stream to close."""
        requests.post(self.server.url + "/abort_request", json={"rid": self.rid}, timeout=30)
        self.join(timeout=300)


def _blocker(server: ServerProcess, tokens: int = 800, rid: str | None = None) -> Blocker:
    """Occupies the only running slot long enough for the queue to build up behind it. Two
    300 ms queue timeouts back to back need ~0.8 s, and 800 tokens keep a slot busy for longer
    than that even on a CPU several times faster than ours. Returns once its first token has streamed
    back: then it holds the slot for certain (/slo/status is published periodically, so a
    request that just finished can still show there as running)."""
    t = Blocker(server, tokens, rid)
    t.start()
    if not t.running.wait(timeout=60):
        raise TimeoutError("blocker never started running")
    if t.ended.is_set():
        raise RuntimeError(f"the blocker ended before it held the slot (HTTP {t.status})")
    return t


# Each queued request holds the one slot this long, so the first tokens of consecutive requests
# are 0.6–1 s apart here (300 tokens alone took 0.6 s; the host's speed varies 2x from day to
# day): far more than the jitter of reading them from client clocks on 2 busy
# cores (4 tokens, ~20 ms apart, once let two swap; 48 tokens, ~0.1 s apart, swapped two on a
# CI host).
QUEUED_TOKENS = 300
# Sends this far apart reach the server in the order sent even when the client's threads stall.
ARRIVAL_GAP_S = 0.3
# The queue needs QUEUED * ARRIVAL_GAP_S (1.2 s) to build: 2000 tokens took 4.9–6.6 s here
# alone, still ~2.4 s on a CPU twice as fast.
QUEUE_BLOCKER_TOKENS = 2000


def served_order(server: ServerProcess) -> list[int]:
    """Queue requests i = 0..n-1 in arrival order with deadlines decreasing in i; the order
    their first tokens came out in."""
    finished: list[tuple[float, int]] = []
    lock = threading.Lock()

    def send(i: int) -> None:
        r = requests.post(
            server.url + "/generate",
            json={
                "text": f"request {i}",
                "sampling_params": {
                    "max_new_tokens": QUEUED_TOKENS,
                    "ignore_eos": True,
                    "temperature": 0,
                },
                "slo": {"deadline_ms": 60_000 - 10_000 * i},
            },
            timeout=300,
        )
        assert r.status_code == 200, r.text
        report = r.json()["meta_info"]["slo"]
        with lock:
            finished.append((time.time() - report["e2e_ms"] / 1000 + report["ttft_ms"] / 1000, i))

    blocker = _blocker(server, QUEUE_BLOCKER_TOKENS)
    senders = []
    for i in range(QUEUED):
        t = threading.Thread(target=send, args=(i,))
        t.start()
        senders.append(t)
        time.sleep(ARRIVAL_GAP_S)  # distinct, known arrival order
    queued = requests.get(server.url + "/slo/status", timeout=5).json()["engine"]
    for t in senders:
        t.join(timeout=300)
    blocker.join(timeout=300)
    assert queued["running"] == 1, "the blocker must hold the only slot while the queue builds"
    return [i for _, i in sorted(finished)]


def _one_slot(policy: str) -> Iterator[ServerProcess]:
    """The tiny model under `policy` with one running slot, so the queue's order is the policy's."""
    with ServerProcess(
        "--model-path", "tiny", "--slo-policy", policy, "--max-running-requests", "1", name=f"{policy}-1"
    ) as server:
        yield server


@pytest.fixture(scope="module")
def edf_one_slot() -> Iterator[ServerProcess]:
    yield from _one_slot("edf")


def test_edf_serves_the_queue_in_deadline_order(edf_one_slot: ServerProcess) -> None:
    assert served_order(edf_one_slot) == list(reversed(range(QUEUED)))


@pytest.fixture(scope="module")
def fcfs_one_slot() -> Iterator[ServerProcess]:
    yield from _one_slot("fcfs")


def test_fcfs_serves_the_queue_in_arrival_order(fcfs_one_slot: ServerProcess) -> None:
    assert served_order(fcfs_one_slot) == list(range(QUEUED))


def test_max_queue_ms_ends_a_request_that_never_started(edf_one_slot: ServerProcess) -> None:
    # Held until released, however fast the host decodes (800 tokens once ended before the queued
    # request arrived on a CI host: it ran at once with an 85 ms TTFT).
    blocker = _blocker(edf_one_slot, tokens=3000, rid="max-queue-blocker")
    try:
        r = requests.post(
            edf_one_slot.url + "/generate",
            json={"text": "late", "sampling_params": {"max_new_tokens": 4}, "slo": {"max_queue_ms": 300}},
            timeout=120,
        )
        assert not blocker.ended.is_set(), "the blocker ended before the queued request was answered"
        assert r.status_code == 503, r.text
        assert "slo_queue_timeout" in r.text
        body = {
            "text": "late stream",
            "sampling_params": {"max_new_tokens": 4},
            "stream": True,
            "slo": {"ttft_ms": 100000, "max_queue_ms": 300},
        }
        with requests.post(edf_one_slot.url + "/generate", json=body, stream=True, timeout=120) as resp:
            text = b"".join(resp.iter_content()).decode()
        assert "slo_queue_timeout" in text
        assert not blocker.ended.is_set(), "the blocker ended before the queued stream was answered"
        status = edf_one_slot.status_when(lambda s: s["engine"].get("dropped_in_queue", 0) >= 2)
        assert status["engine"]["dropped_in_queue"] >= 2  # the snapshot is published periodically
        assert status["attainment"]["latency"]["dropped"] >= 1
    finally:
        blocker.release()


@pytest.mark.parametrize("policy", sorted(MIXED_ON_ENGINE))
def test_one_slot_servers_serve_a_mixed_workload(policy: str, request: pytest.FixtureRequest) -> None:
    """test_policies_on_engine's engine run for these policies, on servers started here anyway;
    last, so the queue-order tests above see servers that served nothing else."""
    assert_serves_mixed_workload(request.getfixturevalue(MIXED_ON_ENGINE[policy]), policy)
