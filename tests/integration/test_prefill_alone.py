"""Prefill alone on the real engine: under mixed batching, a pass whose prefill starts a first
token at risk runs without the decodes when their slack can pay for it, and nothing else changes.

One emulated H100 (x10, paced) under SLOs-Serve with mixed batching: four streams with loose
per-token targets decode (their slack banked), then short prompts arrive one at a time with a
TTFT only a few mixed passes long. The plan marks those passes `prefill_alone`
(scheduler/core/batch_limits.py), and the adapter runs SGLang's own admission with mixing off
for them (scheduler/sglang_scheduler.py). The engine must report such passes, every request must
be answered in full, and the streams, which waited those passes out, must keep every token on
time. About a minute.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from server.process import ServerProcess
from tests.integration.engine_calls import generate, wait_until_running

pytestmark = pytest.mark.paced  # asserts the engine's pace: runs alone (tests/conftest.py)

SLOWDOWN = 10  # every H100 step takes ten times its profile's time here, which the host can pace
STREAMS = 4
STREAM_TOKENS = 60  # long enough to still decode when the urgent prompts arrive
STREAM_SLO = {"ttft_ms": 5_000, "tpot_ms": 500}  # hundreds of ms banked per token
URGENT = 3
URGENT_SLO = {"ttft_ms": 200}  # under three mixed passes of a short prompt: at risk on arrival
URGENT_TOKENS = 4


def _ids(n: int, seed: int) -> list[int]:
    return [5 + (i * 7 + seed * 13) % 500 for i in range(n)]  # inside the tiny model's vocabulary


def test_an_urgent_first_token_runs_its_prefill_alone_and_the_streams_keep_their_pace() -> None:
    server = ServerProcess(
        "--model-path", "tiny", "--emulate-gpu", "h100", "--emulate-slowdown", str(SLOWDOWN),
        "--slo-policy", "slos", "--slo-batching", "mixed", "--max-running-requests", "16",
        name="prefill-alone",
    )  # fmt: skip
    try:
        server.start()
        with ThreadPoolExecutor(STREAMS) as pool:
            streams = [
                pool.submit(generate, server.url, _ids(100, i), STREAM_SLO, STREAM_TOKENS) for i in range(STREAMS)
            ]
            wait_until_running(server)
            time.sleep(0.5)  # the streams decode, their slack banked
            urgent = []
            for i in range(URGENT):
                urgent.append(generate(server.url, _ids(40, 10 + i), URGENT_SLO, URGENT_TOKENS))
                time.sleep(0.3)
            metas = [s.result(timeout=600) for s in streams]
        status = server.status_when(lambda s: s["engine"]["running"] == 0)["engine"]
    finally:
        server.stop()

    assert status["mixed_batching"] is True, status
    assert status["emulation"]["late_share"] <= 0.1, status["emulation"]  # paced: times are the card's
    # The lever decided live: SGLang admitted a prefill with mixing off at least once.
    assert status["prefill_alone"] >= 1, status
    # Nothing lost, and the decodes that waited those passes out kept their pace.
    assert [m["completion_tokens"] for m in urgent] == [URGENT_TOKENS] * URGENT, urgent
    assert [m["completion_tokens"] for m in metas] == [STREAM_TOKENS] * STREAMS, metas
    assert all(m["slo"]["attained"]["overall"] is True for m in metas), metas
