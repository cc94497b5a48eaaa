"""The best-effort tier's hold on the real engine: a request already past due waits for the SLO
work to finish instead of taking a batch slot beside it, and is still answered in full; and a
lost request that started in a lull gives its slot back to a newcomer that can still be on time.

One emulated H100 (x10, paced) under SLOs-Serve: a stream with an SLO runs for several seconds;
then a request arrives whose first token was due 1 ms after it arrived, so it is lost before the
first pass sees it. Admission declines it to the best-effort tier, and the plan holds it while
the stream runs (scheduler/core/lost_hold.py). Without the hold, a free slot would start it in
the next pass, about 0.1 s after it arrived. About a minute each.
"""

from __future__ import annotations

import threading
import time

import pytest

from server.process import ServerProcess
from tests.integration.engine_calls import generate, wait_until_running

pytestmark = pytest.mark.paced  # asserts the engine's pace: runs alone (tests/conftest.py)

SLOWDOWN = 10  # an H100 decode step (~7 ms) takes ~70 ms here
STREAM_TOKENS = 80  # ~6 s of decoding at the card's pace
STREAM_SLO = {"ttft_ms": 5_000, "tpot_ms": 500}
LOST_SLO = {"ttft_ms": 1}  # due before any pass can see it
LOST_TOKENS = 4
MARGIN_S = 0.5  # client-side timing slack between two requests' reports


def _on_emulated_h100(max_running: int, name: str, *policy: str) -> ServerProcess:
    return ServerProcess(
        "--model-path", "tiny", "--emulate-gpu", "h100", "--emulate-slowdown", str(SLOWDOWN),
        *policy, "--max-running-requests", str(max_running), name=name,
    )  # fmt: skip


def test_a_past_due_request_waits_for_the_slo_work_and_is_still_answered() -> None:
    server = _on_emulated_h100(16, "lost-hold", "--slo-policy", "slos")
    try:
        server.start()
        stream: dict = {}

        def run_stream() -> None:
            stream["sent"] = time.monotonic()
            stream["meta"] = generate(server.url, list(range(5, 105)), STREAM_SLO, STREAM_TOKENS)

        thread = threading.Thread(target=run_stream)
        thread.start()
        wait_until_running(server)
        lost_sent = time.monotonic()
        lost = generate(server.url, list(range(200, 240)), LOST_SLO, LOST_TOKENS)
        thread.join(timeout=600)
        status = server.status_when(lambda s: s["engine"]["running"] == 0)["engine"]
    finally:
        server.stop()

    meta = stream["meta"]
    assert meta["completion_tokens"] == STREAM_TOKENS and meta["slo"]["attained"]["overall"] is True, meta
    # Nothing lost: the past-due request is answered in full, late.
    assert lost["completion_tokens"] == LOST_TOKENS and lost["slo"]["attained"]["ttft"] is False, lost
    assert status["emulation"]["late_share"] <= 0.1, status["emulation"]  # paced: times are the card's
    # Held: its first token came no earlier than the stream's end (both measured from the
    # client's send times), seconds after a free slot would have started it.
    stream_end = stream["sent"] + meta["slo"]["e2e_ms"] / 1000.0
    lost_first = lost_sent + lost["slo"]["ttft_ms"] / 1000.0
    assert lost_first >= stream_end - MARGIN_S, (lost_first - lost_sent, stream_end - lost_sent)
    assert status["lost_held_passes"] > 0, status


YIELD_LOST_TOKENS = 80  # ~6 s of decoding at the card's pace: far longer than the newcomer's answer
NEWCOMER_SLO = {"ttft_ms": 2_500, "tpot_ms": 500}


def test_a_lost_request_gives_its_slot_to_a_newcomer_and_is_still_answered() -> None:
    """Two requests lost on arrival fill both slots (no SLO work to hold them for); a newcomer
    that can keep its SLO arrives. GMAX values it at the batch without the lost ones and keeps
    it out of the tier; the cap leaves it no room, so one lost request is retracted
    (scheduler/core/lost_hold.py, `yielding_lost`) and the newcomer is answered while both lost
    requests still run, instead of waiting for one to end. Both lost requests still end whole."""
    # GMAX's own frame-boundary swaps off: the slot must come from the plan path's yield.
    server = _on_emulated_h100(2, "lost-yield", "--slo-policy", "gmax", "--slo-policy-param", "preempt=false")
    try:
        server.start()
        lost: list[dict] = []
        threads = [
            threading.Thread(
                target=lambda i=i: lost.append(
                    generate(server.url, list(range(300 + 50 * i, 340 + 50 * i)), LOST_SLO, YIELD_LOST_TOKENS)
                )
            )
            for i in range(2)
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while server.status_when(lambda s: True)["engine"]["running"] < 2:
            assert time.monotonic() < deadline, "the lost requests never both started"
            time.sleep(0.05)
        newcomer = generate(server.url, list(range(5, 45)), NEWCOMER_SLO, LOST_TOKENS)
        # The order on the paced card, not a time: without a yield the newcomer waits for a lost
        # request's whole answer, so one of them would be done by now.
        both_still_running = all(t.is_alive() for t in threads)
        for t in threads:
            t.join(timeout=600)
        status = server.status_when(lambda s: s["engine"]["running"] == 0)["engine"]
    finally:
        server.stop()

    retractions = [meta.get("num_retractions", 0) for meta in lost]
    assert newcomer["completion_tokens"] == LOST_TOKENS, newcomer
    assert both_still_running, (newcomer["slo"], retractions, status)
    assert newcomer["slo"]["tier"] == "admitted", newcomer["slo"]  # valued without the lost ones
    assert len(lost) == 2
    for meta in lost:  # nothing lost: each answered in full, retracted or not
        assert meta["completion_tokens"] == YIELD_LOST_TOKENS and meta["slo"]["attained"]["ttft"] is False, meta
    retracted = sum(retractions)
    assert retracted >= 1, lost
    assert status["preempted"] == retracted, status
    assert status["emulation"]["late_share"] <= 0.1, status["emulation"]  # paced: times are the card's
