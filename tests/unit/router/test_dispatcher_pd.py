"""PD pairing in the dispatcher, over real ZMQ with fake prefill and decode workers.

A fake prefill worker answers a Submit with one token and a finish after `delay_s`, then marks
the Submit's bootstrap room as transferred. A fake decode worker streams only once its room has
been transferred (as SGLang's decode waits for the KV), so a pair whose prefill half dies or
fails never streams unless the router pairs the request again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import pytest
import zmq.asyncio

from router.dispatcher import Dispatcher
from router.flight import StreamError
from router.membership import WorkerRegistry
from router.pd import PrefillChooser, decode_side_views
from router.policies.load_metrics import LeastRequestPolicy
from router.protocol import Register, RequestError, Submit, TokenChunk
from router.routing_views import RouteRequest, WorkerView
from router.transport import RouterEndpoint
from scheduler.core.slo import SloSpec
from tests.unit.router._fake_worker import until
from tests.unit.router.test_dispatcher import DEAD_AFTER_S, FakeWorker, _collect, _request, _run, _tokens


class PdFakeWorker(FakeWorker):
    def __init__(self, *args: Any, role: str, rooms: dict[int, asyncio.Event], **kw: Any) -> None:
        self.role = role
        self.rooms = rooms
        self.spent_aborts: list[str] = []  # aborts followed by a new Submit of the same rid
        super().__init__(*args, **kw)

    def register_message(self) -> Register:
        reg = super().register_message()
        port = 9000 + len(self.worker_id) if self.role == "prefill" else None
        return Register(**{**reg.__dict__, "role": self.role, "bootstrap_port": port, "http_url": "http://127.0.0.1:1"})

    def room(self, submit: Submit) -> asyncio.Event:
        assert submit.bootstrap is not None, "a PD worker got a Submit without bootstrap fields"
        return self.rooms.setdefault(submit.bootstrap["room"], asyncio.Event())

    def told_to_abort(self, rid: str) -> bool:
        return rid in self.aborts or rid in self.spent_aborts

    async def _stream(self, submit: Submit) -> None:
        while submit.rid in self.aborts:  # an Abort before this Submit was for the old placement
            self.aborts.remove(submit.rid)
            self.spent_aborts.append(submit.rid)
        if self.role == "mixed":
            await super()._stream(submit)
            return
        if self.role == "decode":
            await self.room(submit).wait()
            await super()._stream(submit)
            return
        await asyncio.sleep(self.delay_s)
        if not self.alive or submit.rid in self.aborts:
            return
        if self.error_status is not None:
            err = RequestError(rid=submit.rid, worker_id=self.worker_id, status=self.error_status, message="pf")
            await self.endpoint.send(err)
            return
        self.room(submit).set()
        first = TokenChunk(
            rid=submit.rid, worker_id=self.worker_id, token_ids=[self.base], completion_tokens=1, finish_reason="length"
        )
        await self.endpoint.send(first)


@contextlib.asynccontextmanager
async def pd_cluster(
    ctx: zmq.asyncio.Context, workers: Sequence[dict[str, Any]], prefill_placement: str = "spread"
) -> AsyncIterator[tuple[Dispatcher, dict[str, PdFakeWorker]]]:
    endpoint = RouterEndpoint(ctx=ctx)
    dispatcher = Dispatcher(
        endpoint,
        LeastRequestPolicy(),
        WorkerRegistry(dead_after_s=DEAD_AFTER_S),
        reap_interval_s=0.05,
        migrate_interval_s=None,
        admission_timeout_s=1.0,
        prefill_placement=prefill_placement,
    )
    rooms: dict[int, asyncio.Event] = {}
    fakes: dict[str, PdFakeWorker] = {}
    try:
        await dispatcher.start()
        for spec in workers:
            spec = dict(spec)
            wid = spec.pop("worker_id")
            fakes[wid] = PdFakeWorker(ctx, endpoint.address, wid, rooms=rooms, **spec)
            await fakes[wid].start()
        yield dispatcher, fakes
    finally:
        for fake in fakes.values():
            await fake.stop()
        await dispatcher.stop()
        endpoint.close()


PAIR = [{"worker_id": "p0", "role": "prefill"}, {"worker_id": "d0", "role": "decode"}]


def test_a_pd_pair_gets_the_same_submit_with_one_fresh_room(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with pd_cluster(ctx, PAIR) as (dispatcher, w):
            stream = await dispatcher.submit(*_request("r1", max_new=4))
            events = await _collect(stream)
            assert _tokens(events) == [100, 101, 102, 103]  # only the decode half reaches the client
            assert all(e.worker_id == "d0" for e in events)
            (pf,), (dc,) = w["p0"].submits, w["d0"].submits
            assert pf == dc and pf.bootstrap is not None
            assert pf.bootstrap["host"] == "127.0.0.1" and pf.bootstrap["port"] == 9002
            assert 0 <= pf.bootstrap["room"] < 2**63
            assert stream.workers == ("d0",) and stream.prefill_workers == ("p0",)
            status = dispatcher.status()
            assert status["pd_pairs"] == 1 and status["late_chunks_dropped"] == 0 and status["completed"] == 1
            assert dispatcher.prefill_chooser.outstanding_tokens("p0") == 0
            second = await dispatcher.submit(*_request("r2", max_new=2))
            await _collect(second)
            assert w["p0"].submits[1].bootstrap["room"] != pf.bootstrap["room"]

    _run(go)


def test_decode_workers_are_not_used_without_a_prefill_partner(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        specs = [*PAIR, {"worker_id": "m0", "role": "mixed"}]
        async with pd_cluster(ctx, specs) as (dispatcher, w):
            w["p0"].stalled = True  # goes silent: reaped
            await until(lambda: not dispatcher.registry.is_alive("p0"))
            events = await _collect(await dispatcher.submit(*_request("r1", max_new=3)))
            assert _tokens(events) == [100, 101, 102] and {e.worker_id for e in events} == {"m0"}
            assert w["d0"].submits == [] and w["m0"].submits[0].bootstrap is None

    _run(go)


def test_a_prefill_worker_dying_before_the_handover_repairs_the_request(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        specs = [
            {"worker_id": "p0", "role": "prefill", "delay_s": 5.0},
            {"worker_id": "p1", "role": "prefill", "delay_s": 0.02},
            {"worker_id": "d0", "role": "decode"},
        ]
        async with pd_cluster(ctx, specs) as (dispatcher, w):
            w["p1"].stalled = True  # p0 is the only prefill worker alive when r1 arrives
            await until(lambda: not dispatcher.registry.is_alive("p1"))
            w["p1"].stalled = False
            await w["p1"]._register()
            await until(lambda: dispatcher.registry.is_alive("p1"))
            # both are alive now; make p1 the busier one so that p0 finishes the prompt soonest
            dispatcher.prefill_chooser.on_routed("other", "p1", 1_000)
            stream = await dispatcher.submit(*_request("r1", max_new=3))
            await until(lambda: len(w["p0"].submits) == 1)
            dispatcher.prefill_chooser.on_done("other")
            w["p0"].stalled = True  # dies holding r1's prefill
            events = await _collect(stream)
            assert _tokens(events) == [100, 101, 102]
            assert stream.prefill_workers == ("p0", "p1") and stream.workers == ("d0", "d0")
            first, second = w["d0"].submits
            assert first.bootstrap["room"] != second.bootstrap["room"]
            assert w["d0"].told_to_abort("r1")  # the first decode half was told to give up its room
            status = dispatcher.status()
            assert status["pd_prefill_failed"] == 1 and status["resubmitted"] == 1 and status["completed"] == 1

    _run(go)


def test_a_prefill_5xx_repairs_and_a_4xx_reaches_the_client(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        specs = [
            {"worker_id": "p0", "role": "prefill", "error_status": 503},
            {"worker_id": "p1", "role": "prefill"},
            {"worker_id": "d0", "role": "decode"},
        ]
        async with pd_cluster(ctx, specs) as (dispatcher, w):
            dispatcher.prefill_chooser.on_routed("other", "p1", 1_000)  # p1 is the busier: p0 chosen first
            events = await _collect(await dispatcher.submit(*_request("r1", max_new=2)))
            assert _tokens(events) == [100, 101]
            assert dispatcher.status()["pd_prefill_failed"] == 1
            w["p1"].error_status = 400
            dispatcher.prefill_chooser.on_done("other")
            w["p0"].stalled = True
            await until(lambda: not dispatcher.registry.is_alive("p0"))
            events = await _collect(await dispatcher.submit(*_request("r2", max_new=2)))
            assert isinstance(events[-1], StreamError) and events[-1].status == 400
            assert events[-1].worker_id == "p1"
            await until(lambda: w["d0"].told_to_abort("r2"))

    _run(go)


def test_a_decode_worker_dying_resumes_on_a_new_pair(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        specs = [
            {"worker_id": "p0", "role": "prefill"},
            {"worker_id": "d0", "role": "decode", "die_after": 3, "delay_s": 0.05},
            {"worker_id": "d1", "role": "decode"},
        ]
        async with pd_cluster(ctx, specs) as (dispatcher, w):
            stream = await dispatcher.submit(*_request("r1", max_new=8))
            events = await _collect(stream)
            assert _tokens(events) == list(range(100, 108))
            assert stream.workers == ("d0", "d1") and stream.prefill_workers == ("p0", "p0")
            resume = w["d1"].submits[0]
            assert resume.resume_output_ids == (100, 101, 102) and w["p0"].submits[1] == resume

    _run(go)


def _view(wid: str, role: str, **kw: Any) -> WorkerView:
    return WorkerView(worker_id=wid, gpu="h100", kv_capacity_tokens=1000, max_running=8, role=role, **kw)


def test_the_dispatcher_places_prompts_as_its_prefill_placement_says(ctx: zmq.asyncio.Context) -> None:
    """Both prefill workers meet the TTFT (their reports predict no wait): `spread` keeps the
    idle one, `pack` the one already holding prompts."""
    specs = [
        {"worker_id": "p0", "role": "prefill"},
        {"worker_id": "p1", "role": "prefill"},
        {"worker_id": "d0", "role": "decode"},
    ]

    chosen: dict[str, tuple[str, ...]] = {}

    async def go(placement: str) -> None:
        async with pd_cluster(ctx, specs, placement) as (dispatcher, _):
            dispatcher.prefill_chooser.on_routed("other", "p1", 1_000)
            route, submit = _request("r1", max_new=2)
            stream = await dispatcher.submit(replace(route, slo=SloSpec(ttft_ms=5_000.0)), submit)
            assert _tokens(await _collect(stream)) == [100, 101]
            chosen[placement] = stream.prefill_workers

    for placement in ("spread", "pack"):
        _run(functools.partial(go, placement))
    assert chosen == {"spread": ("p0",), "pack": ("p1",)}


def test_prefill_choice_spreads_to_the_soonest_finish_or_packs_the_busiest_that_makes_the_ttft() -> None:
    views = [
        _view("p0", "prefill", prefill_s_per_token=0.001, iteration_s=0.05),
        _view("p1", "prefill", prefill_s_per_token=0.001, iteration_s=0.05),
    ]
    now = 100.0
    req = RouteRequest(rid="r", prompt_tokens=100, slo=SloSpec(ttft_ms=500), arrival_s=now)
    spread = PrefillChooser(ttft_margin=1.0)
    spread.on_routed("a", "p0", 200)  # p0: 0.05 + 0.3 = 0.35 s, busier; p1: 0.15 s
    choice = spread.choose(req, views, now)
    assert choice is not None and choice.worker_id == "p1" and choice.meets_ttft
    assert abs(choice.predicted_s - 0.15) < 1e-9

    pack = PrefillChooser(placement="pack", ttft_margin=1.0)  # the bare slack; test_pd_tiers covers the margin
    pack.on_routed("a", "p0", 200)
    choice = pack.choose(req, views, now)
    assert choice is not None and choice.worker_id == "p0" and choice.meets_ttft
    assert abs(choice.predicted_s - 0.35) < 1e-9
    pack.on_routed("b", "p0", 200)  # p0 now needs 0.55 s > 0.5: the other one
    choice = pack.choose(req, views, now)
    assert choice is not None and choice.worker_id == "p1" and choice.meets_ttft
    late = RouteRequest(rid="r2", prompt_tokens=100, slo=SloSpec(ttft_ms=100), arrival_s=now)
    for chooser in (spread, pack):  # nobody makes 100 ms: the soonest finish, flagged
        choice = chooser.choose(late, views, now)
        assert choice is not None and choice.worker_id == "p1" and not choice.meets_ttft
    pack.on_done("a")
    pack.on_done("b")
    assert pack.outstanding_tokens("p0") == 0
    assert pack.choose(req, [_view("p0", "prefill", healthy=False)], now) is None


def test_an_unknown_prefill_placement_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="prefill_placement"):
        PrefillChooser(placement="busiest")


def test_decode_views_carry_the_partners_prefill_time() -> None:
    views = [
        _view("p0", "prefill"),
        _view("d0", "decode", queue_delay_s=0.1, prefill_s_per_token=0.01),
        _view("m0", "mixed", prefill_s_per_token=0.01),
    ]
    chooser = PrefillChooser()
    req = RouteRequest(rid="r", prompt_tokens=10, slo=SloSpec(), arrival_s=time.monotonic())
    choice = chooser.choose(req, views[:1], 0.0)
    shown = {v.worker_id: v for v in decode_side_views(views, choice)}
    assert set(shown) == {"d0", "m0"}
    assert shown["d0"].healthy and shown["d0"].prefill_s_per_token == 0.0
    assert shown["m0"].prefill_s_per_token == 0.01
    alone = {v.worker_id: v for v in decode_side_views(views, None)}
    assert not alone["d0"].healthy and alone["m0"].healthy
