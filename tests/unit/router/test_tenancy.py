"""Per-key SLO limits, program namespaces and tenants through the real router app (its guard,
dispatcher and ZMQ endpoint) to scripted workers: a key limited to TTFT >= 1 s that asks for
0.001 ms reaches the worker with 1000 ms, so under edf it cannot jump ahead of another tenant,
and its response says what was clamped."""

from __future__ import annotations

from typing import Any

import httpx
import zmq.asyncio

from router.access import AccessTable, Principal, Role
from router.protocol import Submit
from scheduler.core.plan_path import LeverModel, PlanSettings, plan_pass
from scheduler.core.policies import make_policy
from scheduler.core.slo import SloClass, parse_slo
from scheduler.core.slo_limits import REJECT, SloLimits
from scheduler.core.types import EngineView, RequestView
from tests.unit.core.test_batch_levers import PERF
from tests.unit.router._router_harness import Harness, router, run
from wire import SHARE_PARAM, TENANT_PARAM

A_KEY = "tenant-a-client-key-0123456789"
B_KEY = "tenant-b-client-key-0123456789"
STRICT_KEY = "tenant-s-client-key-0123456789"
WORKER_SECRET = b"the workers' own secret, not an HTTP key"
ONE_SECOND = SloLimits(min_ttft_ms=1000.0, max_weight=2.0)


def _table() -> AccessTable:
    return AccessTable(
        [
            (A_KEY, Principal("tenant-a", Role.CLIENT, ONE_SECOND, share=2.0)),
            (B_KEY, Principal("tenant-b", Role.CLIENT)),
            (STRICT_KEY, Principal("tenant-s", Role.CLIENT, SloLimits(min_ttft_ms=1000.0, on_violation=REJECT))),
        ],
        worker_secret=WORKER_SECRET.decode(),
    )


def _client(h: Harness, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(h.app), base_url="http://router", headers={"Authorization": f"Bearer {key}"}
    )


def _last_submit(h: Harness) -> Submit:
    return h.workers[0].submits[-1]


def _edf_first(submits: list[tuple[Submit, float]]) -> str:
    """The rid edf starts first, given each Submit's SLO as the worker reads it and its arrival."""
    waiting = [
        RequestView(rid=s.rid, slo=s.slo or parse_slo({}), arrival=arrival, prompt_len=len(s.input_ids))
        for s, arrival in submits
    ]
    view = EngineView(0.6, waiting, [], 8, 512, 10**6, 10**6)
    plan = plan_pass(view, make_policy("edf"), PlanSettings(tenant_fairness=0.0), LeverModel(PERF))
    assert plan.order is not None
    return plan.order[0]


def test_a_limited_key_cannot_jump_ahead_and_is_told_it_was_clamped(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [{}], access=_table(), worker_secret=WORKER_SECRET) as h:
            a, b = _client(h, A_KEY), _client(h, B_KEY)
            body: dict[str, Any] = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}
            resp = await b.post("/generate", json={**body, "rid": "b-patient", "slo": {"ttft_ms": 1000}})
            assert resp.status_code == 200, resp.text
            assert "clamped" not in resp.json()["meta_info"]["slo"]  # b asked within its (no) limits
            b_submit = _last_submit(h)
            resp = await a.post("/generate", json={**body, "rid": "a-greedy", "slo": {"ttft_ms": 0.001, "weight": 9}})
            assert resp.status_code == 200, resp.text
            report = resp.json()["meta_info"]["slo"]
            assert report["clamped"] == {
                "ttft_ms": {"asked": 0.001, "granted": 1000.0},
                "weight": {"asked": 9.0, "granted": 2.0},
            }
            a_submit = _last_submit(h)
            assert a_submit.slo is not None and a_submit.slo.ttft_ms == 1000.0 and a_submit.slo.weight == 2.0
            assert a_submit.sampling_params["custom_params"] == {TENANT_PARAM: "tenant-a", SHARE_PARAM: 2.0}
            # b arrived first with 1 s; a half a second later: under edf a no longer goes first
            assert _edf_first([(b_submit, 0.0), (a_submit, 0.5)]) == "b-patient"
            chat = await a.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "slo": {"ttft_ms": 1}},
            )
            assert chat.status_code == 200, chat.text
            assert chat.json()["slo"]["clamped"] == {"ttft_ms": {"asked": 1.0, "granted": 1000.0}}
            await a.aclose()
            await b.aclose()

    run(go)


def test_a_reject_key_gets_403_naming_the_field_and_nothing_reaches_a_worker(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [{}], access=_table(), worker_secret=WORKER_SECRET) as h:
            s = _client(h, STRICT_KEY)
            for path, body in (
                ("/generate", {"input_ids": [1], "slo": {"ttft_ms": 0.001}}),
                ("/v1/completions", {"model": "m", "prompt": [1], "slo": {"ttft_ms": 5}}),
                ("/generate", {"input_ids": [1], "sampling_params": {"custom_params": {"slo": {"ttft_ms": 5}}}}),
            ):
                resp = await s.post(path, json=body)
                assert resp.status_code == 403, resp.text
                assert resp.json()["error"]["param"] == "slo.ttft_ms"
            assert h.workers[0].submits == []
            ok = await s.post("/generate", json={"input_ids": [1], "slo": {"ttft_ms": 1500}})
            assert ok.status_code == 200 and "clamped" not in ok.json()["meta_info"]["slo"]
            await s.aclose()

    run(go)


def test_program_ids_are_per_key_and_a_client_cannot_forge_its_tenant(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [{}], access=_table(), worker_secret=WORKER_SECRET) as h:
            a, b = _client(h, A_KEY), _client(h, B_KEY)
            forged = {TENANT_PARAM: "tenant-b", SHARE_PARAM: 1000.0, "mine": 1}
            slo = {"program_id": "p1", "deadline_ms": 60_000, "stage": 0}
            body = {"input_ids": [1, 2], "slo": slo, "sampling_params": {"custom_params": forged}}
            resp = await a.post("/generate", json=body)
            assert resp.status_code == 200, resp.text
            a_submit = _last_submit(h)
            assert a_submit.slo is not None and a_submit.slo.program_id == "tenant-a/p1"
            assert a_submit.sampling_params["custom_params"] == {TENANT_PARAM: "tenant-a", SHARE_PARAM: 2.0, "mine": 1}
            # the report scores what was scheduled: the spec names the namespaced program
            assert resp.json()["meta_info"]["slo"]["spec"]["program_id"] == "tenant-a/p1"
            assert (await b.post("/generate", json=body)).status_code == 200
            b_submit = _last_submit(h)
            assert b_submit.slo is not None and b_submit.slo.program_id == "tenant-b/p1"
            assert b_submit.slo.slo_class is SloClass.COMPOUND
            await a.aclose()
            await b.aclose()

    run(go)
