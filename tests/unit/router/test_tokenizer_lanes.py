"""The router's tokenizer threads under load, with work that blocks on an event (a stand-in for a
slow tokenizer, so that nothing depends on how fast this host is): the time limit counts from when
a job starts, a job that waits too long for a thread is a 503 with Retry-After and never runs,
huge inputs have their own lane, and inputs past the character bound are refused before queueing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
import zmq.asyncio

from router.tokenizer import InputTooLong, RouterTokenizer, TokenizerBusy, TokenizeTimeout
from tests.unit.router._router_harness import router, run, tiny_hf, tiny_path

HOLD_S = 3.0  # how long the test keeps threads busy; longer than the limits it tests


def _blocker(gate: threading.Event, started: threading.Event | None = None) -> Callable[[], str]:
    def work() -> str:
        if started is not None:
            started.set()
        gate.wait(60)
        return "held"

    return work


async def _occupy(tok: RouterTokenizer, gate: threading.Event, n: int, size: int = 0) -> list[asyncio.Task[str]]:
    """`n` jobs that hold their lane's threads until `gate` is set."""
    tasks = [asyncio.create_task(tok.run(_blocker(gate), 60.0, size=size)) for _ in range(n)]
    await asyncio.sleep(0)
    return tasks


def test_the_limit_counts_from_when_the_job_starts_not_from_queueing() -> None:
    async def go() -> None:
        tok = RouterTokenizer(tokenizer=object(), queue_timeout_s=60.0)
        gate = threading.Event()
        held = await _occupy(tok, gate, 2)  # both short-lane threads
        waiting = asyncio.create_task(tok.run(lambda: "done", 2.0, size=10))
        await asyncio.sleep(HOLD_S)  # queued longer than its 2 s limit
        assert not waiting.done()
        gate.set()
        assert await waiting == "done"
        assert await asyncio.gather(*held) == ["held", "held"]

    asyncio.run(asyncio.wait_for(go(), 60))


def test_a_job_that_runs_past_its_limit_is_a_timeout() -> None:
    async def go() -> None:
        tok = RouterTokenizer(tokenizer=object())
        gate = threading.Event()
        try:
            with pytest.raises(TokenizeTimeout):
                await tok.run(_blocker(gate), 0.2, size=10)
        finally:
            gate.set()

    asyncio.run(asyncio.wait_for(go(), 60))


def test_a_job_that_waits_too_long_for_a_thread_is_busy_and_never_runs() -> None:
    async def go() -> None:
        tok = RouterTokenizer(tokenizer=object(), queue_timeout_s=0.2)
        gate = threading.Event()
        ran = threading.Event()
        held = await _occupy(tok, gate, 2)
        try:
            with pytest.raises(TokenizerBusy) as busy:
                await tok.run(ran.set, 60.0, size=10)
            shed = busy.value.shed
            assert shed.status == 503 and shed.reason == "queue_timeout" and shed.retry_after_s >= 1
        finally:
            gate.set()
        await asyncio.gather(*held)
        await tok.run(lambda: None, 60.0)  # the lane is free again: everything before it ran
        assert not ran.is_set()

    asyncio.run(asyncio.wait_for(go(), 60))


def test_huge_inputs_cannot_starve_short_ones() -> None:
    async def go() -> None:
        tok = RouterTokenizer(tokenizer=object(), queue_timeout_s=60.0, large_input_chars=1000)
        gate = threading.Event()
        huge = await _occupy(tok, gate, 4, size=100_000)  # more than every thread there is
        try:
            assert await tok.run(lambda: "short", 60.0, size=100) == "short"
            assert not any(t.done() for t in huge)
        finally:
            gate.set()
        assert await asyncio.gather(*huge) == ["held"] * 4

    asyncio.run(asyncio.wait_for(go(), 60))


def test_an_input_past_the_bound_is_refused_before_it_queues() -> None:
    async def go() -> None:
        tok = RouterTokenizer(tokenizer=object(), max_input_chars=1000)
        ran = threading.Event()
        with pytest.raises(InputTooLong):
            await tok.run(ran.set, 60.0, size=1001)
        assert not ran.is_set()

    asyncio.run(asyncio.wait_for(go(), 60))


def test_a_busy_tokenizer_is_a_503_with_retry_after_and_a_long_text_a_400(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        tok = RouterTokenizer(
            tiny_path(), tokenizer=tiny_hf(), queue_timeout_s=0.2, max_input_chars=5000, large_input_chars=2000
        )
        async with router(ctx, tokenizer=tok) as h:
            gate = threading.Event()
            held = await _occupy(tok, gate, 2)
            try:
                resp = await h.client.post("/generate", json={"text": "Hello", "sampling_params": {}})
                assert resp.status_code == 503, resp.text
                assert int(resp.headers["retry-after"]) >= 1
                assert resp.json()["error"]["reason"] == "queue_timeout"
                resp = await h.client.post("/v1/completions", json={"prompt": "x" * 5001, "max_tokens": 4})
                assert resp.status_code == 400 and resp.json()["error"]["param"] == "prompt", resp.text
            finally:
                gate.set()
            await asyncio.gather(*held)
            resp = await h.client.post("/generate", json={"text": "Hello", "sampling_params": {}})
            assert resp.status_code == 200, resp.text

    run(go, 60.0)
