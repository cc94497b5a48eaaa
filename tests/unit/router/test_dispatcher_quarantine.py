"""Poison containment in the dispatcher: a request that ran on a stalled engine is quarantined, not
resubmitted (so it cannot hang the next worker), while requests only queued there move on; one
that sat in two stalled engines is quarantined though it never ran; a request's no-progress
budget counts across its resubmissions; router-made errors carry a reason and a Retry-After.
Real ZMQ, in-process fake workers whose heartbeats report a frozen step counter."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
import zmq.asyncio

from router.dispatcher import DEFAULT_MAX_QUEUED, Dispatcher
from router.flight import QUARANTINED, TIMED_OUT, StreamError
from router.membership import WorkerRegistry
from router.protocol import Heartbeat, Submit, TokenChunk
from tests.unit.router._fake_worker import until
from tests.unit.router.test_dispatcher import FakeWorker, _collect, _request, _run, _tokens, cluster

STALL_AFTER_S = 0.4


class Freezing(FakeWorker):
    """Its engine steps until a Submit of `poison` (or any Submit, with poison=None) reaches it:
    it streams `tokens_first` tokens of that one, then the engine stops stepping while the agent
    keeps heartbeating busy, holding every request it has without a further word."""

    def __init__(self, *args: Any, poison: str | None = None, tokens_first: int = 0, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.poison = poison
        self.tokens_first = tokens_first
        self.frozen = False
        self.steps = 0

    async def _heartbeat(self) -> None:
        seq = 0
        while self.alive:
            seq += 1
            if not self.frozen:
                self.steps += 1
            beat = Heartbeat(worker_id=self.worker_id, seq=seq, engine_steps=self.steps, busy=self.frozen)
            await self.endpoint.send(beat)
            await asyncio.sleep(0.05)

    async def _stream(self, submit: Submit) -> None:
        if self.frozen or (self.poison is not None and submit.rid != self.poison):
            await asyncio.sleep(3600)  # queued behind the hung engine
        for pos in range(self.tokens_first):
            chunk = TokenChunk(
                rid=submit.rid, worker_id=self.worker_id, token_ids=[100 + pos], completion_tokens=pos + 1
            )
            await self.endpoint.send(chunk)
        self.frozen = True
        await asyncio.sleep(3600)


def pool(ctx: zmq.asyncio.Context, **kw: Any) -> AbstractAsyncContextManager[tuple[Dispatcher, list[FakeWorker]]]:
    """test_dispatcher's cluster on a registry that finds an engine stalled after STALL_AFTER_S;
    the workers `_add` puts in its list are stopped with it."""
    return cluster(ctx, registry=WorkerRegistry(dead_after_s=0.6, stall_after_s=STALL_AFTER_S), **kw)


async def _add(
    ctx: zmq.asyncio.Context, dispatcher: Dispatcher, workers: list[Any], cls: type, name: str, **kw: Any
) -> Any:
    worker = cls(ctx, dispatcher.endpoint.address, name, **kw)
    workers.append(worker)
    await worker.start()
    return worker


def test_a_request_running_on_a_stalled_engine_is_quarantined_and_a_queued_one_moves(
    ctx: zmq.asyncio.Context,
) -> None:
    async def go() -> None:
        async with pool(ctx) as (dispatcher, workers):
            sick = await _add(ctx, dispatcher, workers, Freezing, "sick", poison="poison", tokens_first=1)
            poison = await dispatcher.submit(*_request("poison", max_new=4))
            first = await poison.__anext__()
            assert _tokens([first]) == [100]  # it ran on "sick": the engine stepped it
            await until(lambda: sick.frozen)
            queued = await dispatcher.submit(*_request("queued", max_new=3))  # behind the hung engine
            await until(lambda: any(s.rid == "queued" for s in sick.submits))
            healthy = await _add(ctx, dispatcher, workers, FakeWorker, "healthy")

            events = await _collect(poison)
            last = events[-1]
            assert isinstance(last, StreamError) and last.status == 503 and last.reason == QUARANTINED
            assert "sick" in last.message and last.retry_after_s is not None and last.retry_after_s >= 1
            assert _tokens(await _collect(queued)) == [100, 101, 102] and queued.workers == ("sick", "healthy")
            assert [s.rid for s in healthy.submits] == ["queued"]  # the suspect never reached it
            assert dispatcher.counters["quarantined"] == 1 and dispatcher.counters["workers_stalled"] == 1
            await until(lambda: {"poison", "queued"} <= set(sick.aborts))  # if it wakes, it drops both

    _run(go)


def test_a_request_on_two_stalled_engines_is_quarantined_though_it_never_ran(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with pool(ctx) as (dispatcher, workers):
            first = await _add(ctx, dispatcher, workers, Freezing, "first")
            stream = await dispatcher.submit(*_request("r1", max_new=3))
            second = await _add(ctx, dispatcher, workers, Freezing, "second")
            await until(lambda: any(s.rid == "r1" for s in second.submits))  # moved after the first stall
            assert first.frozen
            healthy = await _add(ctx, dispatcher, workers, FakeWorker, "healthy")
            events = await _collect(stream)
            last = events[-1]
            assert isinstance(last, StreamError) and last.reason == QUARANTINED, events
            assert "2 workers that stalled or died" in last.message and stream.workers == ("first", "second")
            assert healthy.submits == [] and dispatcher.counters["workers_stalled"] == 2

    _run(go)


def test_a_request_running_on_two_workers_that_died_is_quarantined(ctx: zmq.asyncio.Context) -> None:
    """One death is routine (its requests resume elsewhere); a request that was running on two
    workers that died is the likeliest cause and does not get a third."""

    async def go() -> None:
        async with pool(ctx) as (dispatcher, workers):
            first = await _add(ctx, dispatcher, workers, FakeWorker, "first", die_after=1)
            stream = await dispatcher.submit(*_request("r1", max_new=5))
            second = await _add(ctx, dispatcher, workers, FakeWorker, "second", die_after=1)
            await until(lambda: any(s.rid == "r1" for s in second.submits), timeout_s=5.0)
            assert not first.alive
            third = await _add(ctx, dispatcher, workers, FakeWorker, "third")
            events = await _collect(stream)
            last = events[-1]
            assert isinstance(last, StreamError) and last.reason == QUARANTINED, events
            assert _tokens(events) == [100, 101] and stream.workers == ("first", "second")
            assert "2 workers that stalled or died" in last.message and third.submits == []
            assert dispatcher.counters["workers_lost"] == 2 and dispatcher.counters["quarantined"] == 1

    _run(go)


@pytest.mark.timeout(60)
def test_the_no_progress_budget_counts_across_resubmissions(ctx: zmq.asyncio.Context) -> None:
    """Virtual time: the loop clock is pushed forward in steps, so no step depends on host speed.
    With a 100 s budget and 3 resubmissions, four 30 s silences end the request (504); counted
    per placement, 120 s would have moved it once and left it waiting another 300 s."""

    class Silent(FakeWorker):
        async def _stream(self, submit: Submit) -> None:
            await asyncio.sleep(3600)

    async def go() -> None:
        loop = asyncio.get_running_loop()
        real_time, offset = loop.time, [0.0]
        loop.time = lambda: real_time() + offset[0]  # type: ignore[method-assign]
        try:
            async with pool(ctx, request_timeout_s=100.0, max_resubmits=3) as (dispatcher, workers):
                for name in ("s0", "s1"):
                    await _add(ctx, dispatcher, workers, Silent, name)
                stream = await dispatcher.submit(*_request("r1"))
                ended = asyncio.ensure_future(_collect(stream))
                for ticks in range(4):
                    offset[0] += 30.0
                    await until(lambda t=ticks: dispatcher.counters["timed_out"] > t or ended.done())
                events = await asyncio.wait_for(ended, 2.0)
                last = events[-1]
                assert isinstance(last, StreamError) and last.status == 504 and last.reason == TIMED_OUT
                assert last.retry_after_s is not None and "no progress" in last.message
                assert len(stream.workers) == 4  # it moved three times within the one budget
        finally:
            loop.time = real_time  # type: ignore[method-assign]

    asyncio.run(go())  # not under _run's wait_for: its timer would fire on the pushed clock


def test_the_router_queue_is_bounded_by_default(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with pool(ctx) as (dispatcher, _):
            assert dispatcher.max_queued == DEFAULT_MAX_QUEUED and DEFAULT_MAX_QUEUED > 0
            assert dispatcher.status()["max_queued"] == DEFAULT_MAX_QUEUED

    _run(go)
