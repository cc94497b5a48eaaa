"""The worker agent keeps its heartbeats going while the process it lives in is busy: it runs on
its own thread and event loop, so a server loop holding the interpreter (tokenizing, building a
batch) does not make the router's `--dead-after-s` declare a live worker dead. A real router
socket (ZMQ) receives them from the real agent, run as `start_agent_thread` runs it; the only
stand-in is the agent's check that its HTTP server answers."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import zmq.asyncio

from router.protocol import Ack, Heartbeat, Register
from router.transport import RouterEndpoint
from server.draining import Drain
from server.worker_agent import AgentConfig, WorkerAgent

HEARTBEAT_S = 0.1
BEATS_WANTED = 3
HOLD_LIMIT_S = 120.0  # a hang guard only
ENGINE = {"steps": 1, "waiting": 0, "running": 0, "kv_capacity_tokens": 100, "max_running_requests": 4}


class Router:
    """A router socket on its own thread that accepts every Register and notes when each
    heartbeat arrived."""

    def __init__(self) -> None:
        self.beats: list[float] = []
        self.address = ""
        self._ready = threading.Event()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> None:
        self.thread.start()
        assert self._ready.wait(30)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)

    async def _main(self) -> None:
        ctx = zmq.asyncio.Context()
        with RouterEndpoint("tcp://127.0.0.1:0", ctx=ctx) as endpoint:
            self.address = endpoint.address
            self._ready.set()
            while not self._stop.is_set():
                try:
                    identity, msg = await asyncio.wait_for(endpoint.recv(), 0.2)
                except asyncio.TimeoutError:
                    continue
                if isinstance(msg, Register):
                    await endpoint.send(identity, Ack(accepted=True))
                elif isinstance(msg, Heartbeat):
                    self.beats.append(time.monotonic())
        ctx.term()


def _hold_the_interpreter_until(beats: list[float], wanted: int, limit_s: float) -> list[float]:
    """Pure-Python work (the thread holds the GIL but for the interpreter's switch interval) until
    `wanted` heartbeats arrived meanwhile, or `limit_s` passed: the heartbeats that did."""
    start = time.monotonic()
    end = start + limit_s
    while time.monotonic() < end:
        sum(range(2000))
        arrived = [t for t in beats if t >= start]
        if len(arrived) >= wanted:
            return arrived
    return [t for t in beats if t >= start]


class AgentThread:
    """The agent as start_agent_thread runs it (its own thread and event loop), and stoppable."""

    def __init__(self, config: AgentConfig) -> None:
        self.agent = WorkerAgent(config, lambda: dict(ENGINE), Drain())

        async def answers() -> bool:  # the agent's HTTP server: not part of this test
            return True

        self.agent.requests.server_answers = answers  # type: ignore[method-assign]
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        self._started.set()
        run = asyncio.create_task(self.agent.run())
        await self._stop.wait()
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run

    def start(self) -> None:
        self.thread.start()
        assert self._started.wait(30)

    def stop(self) -> None:
        loop, stop = self.agent.loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        self.thread.join(10)


def test_heartbeats_keep_coming_while_the_servers_thread_holds_the_interpreter() -> None:
    router = Router()
    router.start()
    config = AgentConfig(
        router_address=router.address, worker_id="w0", gpu="cpu", model="m", http_url="http://127.0.0.1:1",
        heartbeat_s=HEARTBEAT_S,
    )  # fmt: skip
    agent = AgentThread(config)
    try:
        agent.start()
        deadline = time.monotonic() + 30
        while not router.beats and time.monotonic() < deadline:
            time.sleep(0.05)
        assert router.beats, "the agent never registered"
        # Heartbeats are due every HEARTBEAT_S: the agent keeps sending them while this thread
        # never lets go (the wait ends when they came, however slow the host). An agent sharing
        # the busy thread's loop would deliver none until it let go.
        during = _hold_the_interpreter_until(router.beats, BEATS_WANTED, HOLD_LIMIT_S)
        assert len(during) >= BEATS_WANTED, (len(during), len(router.beats))
    finally:
        agent.stop()
        router.stop()
    assert not agent.thread.is_alive() and not router.thread.is_alive()
