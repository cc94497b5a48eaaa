"""SIGTERM to a real router process (launch_router) while a stream is open: the stream ends with
the 503 error event and [DONE], and the worker is told to abort it, however long the stream would
still have run (uvicorn alone would wait a few seconds and then cut it without a word)."""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import orjson
import zmq.asyncio

from server.process import ServerProcess, free_port
from tests.unit.router._router_harness import ScriptedWorker, tiny_path

SCRIPT = [100 + i % 300 for i in range(2000)]  # at one token per 50 ms: far longer than the test


async def _events(resp: httpx.Response, first: asyncio.Event) -> list[object]:
    """The SSE events until the stream ends, "[DONE]" kept (`first` set at the first one); a cut
    connection just ends the list."""
    out: list[object] = []
    try:
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                out.append("[DONE]" if payload == "[DONE]" else orjson.loads(payload))
                first.set()
    except httpx.HTTPError:
        pass
    return out


def test_sigterm_ends_open_streams_with_the_503_event_and_aborts_their_worker(ctx: zmq.asyncio.Context) -> None:
    worker_port = free_port()
    router = ServerProcess(
        "--worker-port", str(worker_port), "--routing-policy", "round_robin", "--tokenizer-path", tiny_path(),
        name="router-shutdown", module="launch_router", ready_path="/slo/status",
    )  # fmt: skip

    async def go() -> None:
        first = asyncio.Event()
        await asyncio.to_thread(router.start)
        worker = ScriptedWorker(ctx, f"tcp://127.0.0.1:{worker_port}", "w0", script=SCRIPT, chunk=1, delay_s=0.05)
        try:
            await worker.start(wait=False)
            await asyncio.wait_for(worker.registered.wait(), 60)
            async with httpx.AsyncClient(base_url=router.url, timeout=120) as client:
                body = {"input_ids": [5, 6, 7], "stream": True, "sampling_params": {"max_new_tokens": len(SCRIPT)}}
                async with client.stream("POST", "/generate", json=body) as resp:
                    assert resp.status_code == 200
                    reading = asyncio.create_task(_events(resp, first))
                    await asyncio.wait_for(first.wait(), 60)  # the stream is open and flowing
                    assert router.proc is not None
                    os.kill(router.proc.pid, signal.SIGTERM)
                    events = await asyncio.wait_for(reading, 100)
            assert events[-1] == "[DONE]", events[-3:]
            error = events[-2]
            assert isinstance(error, dict) and error["error"]["code"] == 503, error
            assert len(events) - 2 < len(SCRIPT)  # it was cut short, with a word
            (rid,) = {s.rid for s in worker.submits}
            for _ in range(600):  # the Abort reaches the worker soon after the event
                if rid in worker.aborts:
                    break
                await asyncio.sleep(0.1)
            assert rid in worker.aborts
        finally:
            await worker.stop()

    try:
        asyncio.run(asyncio.wait_for(go(), 240))
        assert router.proc is not None  # it exits by itself, by the signal uvicorn passes on
        assert router.proc.wait(timeout=60) in (0, -signal.SIGTERM)
    finally:
        router.stop()
