"""The dispatcher keeps every request answered and the pool trustworthy: the worker secret's
handshake, connections that speak for a worker they did not register, lost Submits and lost
finals reconciled from load reports, the inactivity timeout, sheds answered and never retried
(but a draining worker's handed on), the router's own queue bound, stalled engines and dead
workers forgotten. Real ZMQ, in-process fake workers (test_dispatcher.py's)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import zmq.asyncio

from router.dispatcher import Dispatcher
from router.flight import RouterQueueFull, StreamChunk, StreamError
from router.membership import WorkerRegistry
from router.policies.spread import RoundRobinPolicy
from router.protocol import Heartbeat, Register, RequestError, Sealed, Submit, TokenChunk
from router.transport import WorkerEndpoint
from router.worker_auth import RouterAuth
from tests.unit.router._fake_worker import load_report, until
from tests.unit.router.test_dispatcher import FakeWorker, _collect, _request, _run, _tokens, cluster

SECRET = b"sixteen bytes at least, secret"


class ReportingWorker(FakeWorker):
    """Reports the requests it holds, like the agent; switches make it lose Submits or hang on them."""

    def __init__(self, *args: Any, drop_submits: bool = False, hang: bool = False, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.drop_submits = drop_submits
        self.hang = hang
        self.extra_held: tuple[str, ...] = ()
        self.held: set[str] = set()
        self.seq = 1000

    async def start(self, wait: bool = True) -> None:
        await super().start(wait)
        self._spawn(self._reports())

    async def _reports(self) -> None:
        while self.alive:
            await asyncio.sleep(0.05)
            if self.registered.is_set():
                self.seq += 1
                report = load_report(
                    self.worker_id,
                    self.seq,
                    running=len(self.held),
                    inflight=(*sorted(self.held), *self.extra_held),
                    queue_drain_s=7.5,
                )
                await self.endpoint.send(report)

    async def _stream(self, submit: Submit) -> None:
        if self.drop_submits:
            return  # lost on the way: never held, never answered
        self.held.add(submit.rid)
        try:
            if self.hang:
                await asyncio.sleep(3600)
            await super()._stream(submit)
        finally:
            self.held.discard(submit.rid)


async def _add(dispatcher: Dispatcher, ctx: zmq.asyncio.Context, cls: type = ReportingWorker, **kw: Any) -> Any:
    worker = cls(ctx, dispatcher.endpoint.address, kw.pop("worker_id"), **kw)
    await worker.start()
    return worker


# -- the worker secret ---------------------------------------------------------------------


def test_workers_prove_the_secret_and_get_only_sealed_work(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with cluster(ctx, auth=RouterAuth(SECRET)) as (dispatcher, _):
            good = FakeWorker(ctx, dispatcher.endpoint.address, "good", secret=SECRET)
            await good.start()
            stream = await dispatcher.submit(*_request("r1", max_new=3))
            assert _tokens(await _collect(stream)) == [100, 101, 102]
            assert good.auth_dropped == 0 and good.acks[-1].proof is not None

            wrong = FakeWorker(ctx, dispatcher.endpoint.address, "wrong", secret=b"x" * 16)
            none = FakeWorker(ctx, dispatcher.endpoint.address, "none")
            for worker in (wrong, none):
                await worker.start(wait=False)
            await until(lambda: any(a.reason == "wrong worker secret" for a in wrong.acks))
            await asyncio.sleep(0.2)
            assert not any(a.accepted for a in wrong.acks + none.acks)
            assert set(dispatcher.registry.worker_ids()) == {"good"}
            for worker in (wrong, none):
                await worker.stop()
            await good.stop()

    _run(go)


def test_a_replayed_register_is_refused(ctx: zmq.asyncio.Context) -> None:
    """A Register captured on the wire is worthless: its challenge was spent."""

    async def go() -> None:
        async with cluster(ctx, auth=RouterAuth(SECRET)) as (dispatcher, _):
            sent: list[Register] = []
            worker = FakeWorker(ctx, dispatcher.endpoint.address, "w0", secret=SECRET)
            send = worker.endpoint.send

            async def record(msg: Any, *args: Any, **kw: Any) -> None:
                if isinstance(msg, Register) and msg.proof is not None:
                    sent.append(msg)
                await send(msg, *args, **kw)

            worker.endpoint.send = record  # type: ignore[method-assign]
            await worker.start()
            await worker.stop()
            attacker = WorkerEndpoint(dispatcher.endpoint.address, "w0", ctx=ctx, identity=b"attacker")
            await asyncio.sleep(1.0)  # the real worker fell silent: the id is free to claim
            await attacker.send(sent[0])
            answer = await asyncio.wait_for(attacker.recv(), 2.0)
            assert answer.accepted is False and "challenge" in answer.reason
            attacker.close()

    _run(go)


def test_another_connection_cannot_speak_for_a_worker(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with cluster(ctx, [{"delay_s": 0.1}]) as (dispatcher, (w0,)):
            stream = await dispatcher.submit(*_request("r1", max_new=3))
            await until(lambda: bool(w0.submits))
            impostor = WorkerEndpoint(dispatcher.endpoint.address, "w0", ctx=ctx, identity=b"impostor")
            forged = TokenChunk(rid="r1", worker_id="w0", token_ids=[666], completion_tokens=1)
            await impostor.send(forged)
            await impostor.send(Heartbeat(worker_id="w0", seq=10**6))
            assert _tokens(await _collect(stream)) == [100, 101, 102]
            await until(lambda: dispatcher.counters["foreign_dropped"] >= 2)
            impostor.close()

    _run(go)


# -- every request answered ------------------------------------------------------------------


def test_a_lost_submit_is_noticed_from_the_load_report_and_resubmitted(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with cluster(ctx, reconcile_grace_s=0.1) as (dispatcher, _):
            lossy = await _add(dispatcher, ctx, worker_id="lossy", drop_submits=True)
            good = await _add(dispatcher, ctx, worker_id="good")
            stream = await dispatcher.submit(*_request("r1", max_new=3))
            events = await _collect(stream)
            assert _tokens(events) == [100, 101, 102] and stream.workers == ("lossy", "good")
            assert dispatcher.counters["reconciled_lost"] == 1
            for worker in (lossy, good):
                await worker.stop()

    _run(go)


def test_a_request_the_router_does_not_own_is_aborted_on_its_worker(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with cluster(ctx) as (dispatcher, _):
            worker = await _add(dispatcher, ctx, worker_id="w0")
            worker.extra_held = ("from-before-a-router-restart",)
            await until(lambda: "from-before-a-router-restart" in worker.aborts)
            assert dispatcher.counters["orphans_aborted"] >= 1
            await worker.stop()

    _run(go)


def test_a_hung_request_moves_on_and_at_the_limit_gets_a_504(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with cluster(ctx, request_timeout_s=0.3, max_resubmits=1) as (dispatcher, _):
            hung = await _add(dispatcher, ctx, worker_id="hung", hang=True)
            good = await _add(dispatcher, ctx, worker_id="good")
            stream = await dispatcher.submit(*_request("r1", max_new=3))
            assert _tokens(await _collect(stream)) == [100, 101, 102] and stream.workers == ("hung", "good")
            await good.stop()
            stream = await dispatcher.submit(*_request("r2", max_new=3))
            events = await _collect(stream)
            assert isinstance(events[-1], StreamError) and events[-1].status == 504
            assert "no progress" in events[-1].message and dispatcher.counters["timed_out"] >= 2
            await hung.stop()

    _run(go)


@pytest.mark.parametrize(("reason", "moves"), [("queue_timeout", False), ("slo_infeasible", False), ("draining", True)])
def test_sheds_are_answered_not_retried_except_a_drain(ctx: zmq.asyncio.Context, reason: str, moves: bool) -> None:
    class Shedding(FakeWorker):
        async def _stream(self, submit: Submit) -> None:
            shed = {"reason": reason, "retry_after_s": 3, "predicted_wait_ms": 2500.0, "class": "latency"}
            await self.endpoint.send(
                RequestError(rid=submit.rid, worker_id=self.worker_id, status=503, message=reason, shed=shed)
            )

    async def go() -> None:
        async with cluster(ctx, policy=RoundRobinPolicy()) as (dispatcher, _):
            shedder = await _add(dispatcher, ctx, Shedding, worker_id="shedder")
            other = await _add(dispatcher, ctx, FakeWorker, worker_id="other")
            stream = await dispatcher.submit(*_request("r1", max_new=2))
            events = await _collect(stream)
            if moves:
                assert _tokens(events) == [100, 101] and stream.workers == ("shedder", "other")
            else:
                last = events[-1]
                assert isinstance(last, StreamError) and last.shed is not None and last.shed.reason == reason
                assert last.shed.retry_after_s == 3 and other.submits == []
            for worker in (shedder, other):
                await worker.stop()

    _run(go)


def test_a_full_router_queue_answers_at_once_with_the_workers_drain(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with cluster(ctx, max_queued=1) as (dispatcher, _):
            slow = await _add(dispatcher, ctx, worker_id="slow", hang=True)
            await until(lambda: bool(dispatcher.registry.views(dispatcher.clock())[0].queue_drain_s))
            first = await dispatcher.submit(*_request("r1"))
            with pytest.raises(RouterQueueFull) as info:
                await dispatcher.submit(*_request("r2"))
            shed = info.value.shed
            assert shed.status == 429 and shed.reason == "queue_full"
            assert shed.retry_after_s == 8 and shed.predicted_wait_ms == 7500.0  # the worker's own prediction
            assert dispatcher.status()["queued"] == 1 and dispatcher.counters["shed"] == 1
            await first.aclose()
            assert dispatcher.status()["queued"] == 0
            await slow.stop()

    _run(go)


# -- a trustworthy pool ----------------------------------------------------------------------


def test_a_worker_whose_engine_stalls_loses_its_requests_to_another(ctx: zmq.asyncio.Context) -> None:
    class Stalled(ReportingWorker):
        async def _heartbeat(self) -> None:
            seq = 0
            while self.alive:
                seq += 1
                await self.endpoint.send(Heartbeat(worker_id=self.worker_id, seq=seq, engine_steps=5, busy=True))
                await asyncio.sleep(self.heartbeat_s)

    async def go() -> None:
        registry = WorkerRegistry(dead_after_s=0.6, stall_after_s=0.4)
        async with cluster(ctx, registry=registry) as (dispatcher, _):
            stuck = await _add(dispatcher, ctx, Stalled, worker_id="stuck", hang=True)
            good = await _add(dispatcher, ctx, worker_id="good")
            stream = await dispatcher.submit(*_request("r1", max_new=2))
            assert _tokens(await _collect(stream)) == [100, 101] and stream.workers == ("stuck", "good")
            assert dispatcher.counters["workers_stalled"] == 1 and registry.is_alive("stuck")
            assert not next(v for v in registry.views(dispatcher.clock()) if v.worker_id == "stuck").healthy
            for worker in (stuck, good):
                await worker.stop()

    _run(go)


def test_dead_workers_are_forgotten(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        registry = WorkerRegistry(dead_after_s=0.3, forget_after_s=0.3)
        async with cluster(ctx, registry=registry) as (dispatcher, _):
            gone = await _add(dispatcher, ctx, FakeWorker, worker_id="gone")
            stream = await dispatcher.submit(*_request("r1", max_new=2))
            await _collect(stream)
            assert dispatcher.routed["gone"] == 1
            await gone.stop()
            await until(lambda: registry.worker_ids() == [], timeout_s=3.0)
            assert "gone" not in dispatcher.routed and dispatcher.counters["workers_forgotten"] == 1

    _run(go)


def test_a_sealed_message_is_what_reaches_the_worker(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with cluster(ctx, auth=RouterAuth(SECRET)) as (dispatcher, _):
            worker = FakeWorker(ctx, dispatcher.endpoint.address, "w0", secret=SECRET)
            raw: list[Any] = []
            recv = worker.endpoint.recv

            async def record() -> Any:
                msg = await recv()
                raw.append(msg)
                return msg

            worker.endpoint.recv = record  # type: ignore[method-assign]
            await worker.start()
            stream = await dispatcher.submit(*_request("r1", max_new=1))
            events = await _collect(stream)
            assert isinstance(events[-1], StreamChunk) and events[-1].finish_reason == "length"
            assert any(isinstance(m, Sealed) for m in raw) and not any(isinstance(m, Submit) for m in raw)
            await worker.stop()

    _run(go)
