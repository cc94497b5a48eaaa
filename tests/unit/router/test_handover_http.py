"""Hand-overs through the router's HTTP API (real RouterService, real ZMQ, scripted workers, the
tiny model's tokenizer): /slo/migrate refuses a grammar-constrained request with a 409 naming
why, a constrained request whose worker failed restarts from scratch or ends with an error, and
a stop string split by the hand-over (even inside one multi-byte character) still stops it.

The script decodes as " Hello wörld, ..."; its first six tokens end inside the "ö".
"""

from __future__ import annotations

import asyncio

import zmq.asyncio

from tests.unit.router._fake_worker import until
from tests.unit.router._router_harness import SCRIPT_TEXT, router, run, script_ids, sse_events

SCHEMA = '{"type": "string"}'
SLOW_HOST_S = 90.0  # each test starts a router and streams a few short requests: generous on a loaded host
FAILS_AFTER_6 = {"chunk": 2, "error_status": 502, "error_after": 3}  # 6 tokens, then a 5xx: retried on w1


def test_slo_migrate_refuses_a_constrained_request_with_409(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        slow = {"chunk": 1, "delay_s": 0.05, "script": script_ids() * 4}  # still running when it is asked to move
        async with router(ctx, [slow, slow]) as h:
            dispatcher = h.service.dispatcher
            chat = {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}
            bodies = [
                ("/generate", {"input_ids": [1], "rid": "g1", "sampling_params": {"json_schema": SCHEMA}}),
                ("/v1/chat/completions", {**chat, "rid": "c1"}),
            ]
            for path, body in bodies:
                task = asyncio.ensure_future(h.client.post(path, json=body))
                await until(lambda: any(r.generated > 0 for w in ("w0", "w1") for r in dispatcher.running_on(w)), 30.0)
                (running,) = [r for w in ("w0", "w1") for r in dispatcher.running_on(w)]
                other = "w1" if running.worker_id == "w0" else "w0"
                resp = await h.client.post("/slo/migrate", json={"rid": running.request.rid, "to": other})
                assert resp.status_code == 409, resp.text
                error = resp.json()["error"]
                assert error["param"] == "rid" and "json_schema" in error["message"]
                assert (await task).status_code == 200
            assert [len(w.submits) for w in h.workers] == [1, 1]  # each ran where it started
            assert dispatcher.status()["migrations_refused"] == 2 and dispatcher.status()["migrated"] == 0

    run(go, timeout_s=SLOW_HOST_S)


def test_a_constrained_request_not_streamed_restarts_transparently(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [FAILS_AFTER_6, {"chunk": 2}]) as h:
            body = {"input_ids": [1], "sampling_params": {"json_schema": SCHEMA}}
            resp = await h.client.post("/generate", json=body)
            assert resp.status_code == 200, resp.text
            out = resp.json()
            assert out["output_ids"] == script_ids() and out["text"] == SCRIPT_TEXT  # nothing doubled
            assert out["meta_info"]["workers"] == ["w0", "w1"]
            assert out["meta_info"]["completion_tokens"] == len(script_ids())
            (restart,) = h.workers[1].submits
            assert restart.resume_output_ids == ()  # its grammar starts at the root, with its output

    run(go, timeout_s=SLOW_HOST_S)


def test_a_streamed_constrained_request_ends_with_an_error_naming_the_grammar(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [FAILS_AFTER_6, {"chunk": 2}]) as h:
            body = {"input_ids": [1], "stream": True, "sampling_params": {"regex": "[ -~]+"}}
            resp = await h.client.post("/generate", json=body)
            events = sse_events(resp.content)
            assert events[-1] == "[DONE]"
            error = events[-2]["error"]
            assert error["code"] == 502 and "regex" in error["message"]
            assert all("error" not in e for e in events[:-2]) and h.workers[1].submits == []

    run(go, timeout_s=SLOW_HOST_S)


def test_a_stop_string_across_the_hand_over_stops_the_request(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [FAILS_AFTER_6, {"chunk": 2}]) as h:
            body = {"input_ids": [1], "sampling_params": {"stop": ["wörld"]}}
            out = (await h.client.post("/generate", json=body)).json()
            assert out["text"] == " Hello "  # cut before the stop string, as SGLang does
            assert out["output_ids"] == script_ids()[:9]  # ends with the token that completes it
            assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "wörld"}
            assert h.workers[1].submits[0].resume_output_ids == tuple(script_ids()[:6])
            await until(lambda: bool(h.workers[1].aborts), 30.0)  # the new worker stops generating too

            stream = {**body, "stream": True}
            events = sse_events((await h.client.post("/generate", json=stream)).content)
            final = events[-2]
            assert final["meta_info"]["finish_reason"] == {"type": "stop", "matched": "wörld"}
            assert final["meta_info"]["completion_tokens"] == 9 and final["meta_info"]["workers"][-1] != "w0"
            assert final["text"] == " Hello wör"  # what was streamed before the match cannot be taken back

    run(go, timeout_s=SLOW_HOST_S)
