"""The best-effort tier's hold on the real engine: a request already past due waits for the SLO
work to finish instead of taking a batch slot beside it, and is still answered in full.

One emulated H100 (x10, paced) under SLOs-Serve: a stream with an SLO runs for several seconds;
then a request arrives whose first token was due 1 ms after it arrived, so it is lost before the
first pass sees it. Admission declines it to the best-effort tier, and the plan holds it while
the stream runs (scheduler/core/lost_hold.py). Without the hold, a free slot would start it in
the next pass, about 0.1 s after it arrived. About a minute.
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


def test_a_past_due_request_waits_for_the_slo_work_and_is_still_answered() -> None:
    server = ServerProcess(
        "--model-path", "tiny", "--emulate-gpu", "h100", "--emulate-slowdown", str(SLOWDOWN),
        "--slo-policy", "slos", "--max-running-requests", "16", name="lost-hold",
    )  # fmt: skip
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
