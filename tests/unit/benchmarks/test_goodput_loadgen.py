"""The load generator against an in-process stand-in for /generate (one component, real HTTP).

The stand-in streams SGLang-shaped chunks (cumulative output_ids, completion_tokens, a final
finish_reason) at a fixed per-token delay and records every body it receives, so the tests can
check what the generator sent and when: open-loop arrivals, DAG order and prompts, the length
controls, and how failures and the drain timeout are recorded.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import pytest
from aiohttp import web

from benchmarks.goodput.loadgen import (
    LATE_SEND_GRACE_S,
    LengthControl,
    LoadGenerator,
    LoadOptions,
    compose_prompt,
    last_chances,
)
from benchmarks.goodput.records import PlannedRequest
from benchmarks.workloads.traces import TraceRequest
from wire import ORACLE_HINT_PARAM

TOKEN_DELAY_S = 0.01


class FakeEngine:
    """Streams `hint or max_new_tokens` tokens; output ids are 1000 + prompt length + i."""

    def __init__(self, fail_prompts: set[int] | None = None, token_delay_s: float = TOKEN_DELAY_S) -> None:
        self.bodies: list[tuple[float, dict[str, Any]]] = []
        self.fail_prompts = fail_prompts or set()
        self.token_delay_s = token_delay_s
        self.disconnects = 0

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append((time.perf_counter(), body))
        ids = body["input_ids"]
        if len(ids) in self.fail_prompts:
            return web.json_response({"error": "boom"}, status=500)
        params = body["sampling_params"]
        n = (params.get("custom_params") or {}).get(ORACLE_HINT_PARAM) or params["max_new_tokens"]
        resp = web.StreamResponse()
        await resp.prepare(request)
        out: list[int] = []
        try:
            for i in range(n):
                await asyncio.sleep(self.token_delay_s)
                out.append(1000 + len(ids) + i)
                meta: dict[str, Any] = {"completion_tokens": len(out), "finish_reason": None}
                if i == n - 1:
                    meta["finish_reason"] = {"type": "length"}
                    meta["slo"] = {"tier": "admitted", "ttft_ms": 12.5}
                await resp.write(
                    b"data: " + json.dumps({"output_ids": list(out), "meta_info": meta}).encode() + b"\n\n"
                )
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            self.disconnects += 1
            raise
        return resp


def _run(engine: FakeEngine, planned: list[PlannedRequest], opts: LoadOptions) -> list:
    async def go() -> list:
        app = web.Application()
        app.router.add_post("/generate", engine.generate)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            gen = LoadGenerator(f"http://127.0.0.1:{port}", _prompt, opts)
            return await gen.run(planned)
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def _prompt(p: PlannedRequest, rng: random.Random) -> list[int]:
    return [rng.randrange(500) for _ in range(p.req.prompt_tokens)]


def _req(rid: str, at: float, prompt: int = 8, out: int = 5, **kw: Any) -> PlannedRequest:
    slo = kw.pop("slo", {"class": "deadline", "deadline_ms": 5000})
    r = TraceRequest(arrival_s=at, prompt_tokens=prompt, output_tokens=out, rid=rid, **kw)
    return PlannedRequest(r, slo.get("class", "none"), slo)


def test_arrivals_are_open_loop_even_when_the_server_is_slow() -> None:
    engine = FakeEngine(token_delay_s=0.05)  # each request takes 0.5 s, arrivals every 0.1 s
    planned = [_req(f"r{i}", 0.1 * i, out=10) for i in range(5)]
    records = _run(engine, planned, LoadOptions())
    sends = [r.send_s for r in records]
    assert all(abs(s - 0.1 * i) < 0.08 for i, s in enumerate(sends)), sends
    assert all(r.finished and r.output_tokens == 10 and not r.lost for r in records)
    assert all(len(set(r.token_s)) == 10 and r.token_s == sorted(r.token_s) for r in records)


def test_a_dag_stage_waits_for_its_parents_and_starts_with_their_outputs() -> None:
    planned = [
        _req("a", 0.0, prompt=6, out=3, program_id="p", stage=0),
        _req("b", 0.0, prompt=7, out=4, program_id="p", stage=0),
        _req("c", 0.0, prompt=20, out=2, program_id="p", stage=1, parents=("a", "b"), think_s=0.2),
    ]
    engine = FakeEngine()
    records = {r.key: r for r in _run(engine, planned, LoadOptions())}
    a, b, c = records["a"], records["b"], records["c"]
    assert c.send_s >= max(a.finish_s, b.finish_s) + 0.2 - 1e-3
    assert c.program_start_s == pytest.approx(min(a.send_s, b.send_s), abs=1e-6)
    body_c = next(body for _, body in engine.bodies if len(body["input_ids"]) == 20)
    a_out = [1000 + 6 + i for i in range(3)]
    b_out = [1000 + 7 + i for i in range(4)]
    assert body_c["input_ids"][:7] == a_out + b_out  # parents' real outputs lead the prompt


def test_a_failed_parent_means_its_children_are_never_sent() -> None:
    planned = [
        _req("a", 0.0, prompt=9, program_id="p", stage=0),
        _req("b", 0.0, prompt=10, program_id="p", stage=1, parents=("a",)),
    ]
    records = {r.key: r for r in _run(FakeEngine(fail_prompts={9}), planned, LoadOptions())}
    assert "HTTP 500" in records["a"].error and records["a"].lost
    assert not records["b"].sent and "parent" in records["b"].error


def test_hint_control_sends_the_clients_cap_and_the_length_only_in_the_hidden_channel() -> None:
    engine = FakeEngine()
    records = _run(engine, [_req("r", 0.0, out=7)], LoadOptions(LengthControl.HINT, client_max_tokens=64))
    (_, body), (rec,) = engine.bodies[0], records
    assert body["sampling_params"]["max_new_tokens"] == 64
    assert body["sampling_params"]["custom_params"] == {ORACLE_HINT_PARAM: 7}
    assert body["slo"] == {"class": "deadline", "deadline_ms": 5000}
    assert rec.output_tokens == 7 and rec.finish_reason == "length" and rec.tier == "admitted"
    assert rec.server_ttft_ms == 12.5  # the server's own TTFT, beside the client's token times


def test_client_control_stops_reading_at_the_true_length() -> None:
    engine = FakeEngine()
    opts = LoadOptions(LengthControl.CLIENT, send_slo=False, client_max_tokens=40)
    (rec,) = _run(engine, [_req("r", 0.0, out=5)], opts)
    _, body = engine.bodies[0]
    assert body["sampling_params"]["max_new_tokens"] == 40 and "custom_params" not in body["sampling_params"]
    assert "slo" not in body
    assert rec.output_tokens == 5 and rec.finish_reason == "client_stop" and rec.finished
    assert rec.finish_s == rec.token_s[-1]


def test_max_tokens_control_puts_the_true_length_in_the_request() -> None:
    engine = FakeEngine()
    (rec,) = _run(engine, [_req("r", 0.0, out=6)], LoadOptions(LengthControl.MAX_TOKENS))
    assert engine.bodies[0][1]["sampling_params"]["max_new_tokens"] == 6 and rec.output_tokens == 6


def test_the_drain_timeout_cuts_what_is_still_running_and_the_duration_bounds_sends() -> None:
    engine = FakeEngine(token_delay_s=0.2)
    planned = [_req("slow", 0.0, out=50, slo={}), _req("late", 5.0, out=1)]  # best effort: no SLO to wait for
    records = {r.key: r for r in _run(engine, planned, LoadOptions(duration_s=1.0, drain_timeout_s=0.5))}
    assert records["slow"].cut and not records["slow"].lost and records["slow"].finish_s is None
    assert not records["late"].sent and "never sent" in records["late"].error


def test_the_drain_waits_for_what_can_still_meet_its_slo_and_cuts_the_rest_after_their_due() -> None:
    engine = FakeEngine(token_delay_s=0.05)
    planned = [
        _req("patient", 0.0, out=30, slo={"class": "deadline", "deadline_ms": 4000}),  # done ~1.5 s, due 4 s
        _req("hopeless", 0.0, out=200, slo={"class": "deadline", "deadline_ms": 100}),  # runs ~10 s, due 0.1 s
    ]
    records = {r.key: r for r in _run(engine, planned, LoadOptions(drain_timeout_s=0.2))}
    assert records["patient"].finished and not records["patient"].cut
    assert records["hopeless"].cut and records["hopeless"].output_tokens < 200
    # without it, both are cut at the drain timeout (1 s at the least)
    records = {r.key: r for r in _run(engine, planned, LoadOptions(drain_timeout_s=0.2, drain_until_due=False))}
    assert records["patient"].cut and records["hopeless"].cut


def test_last_chances_per_class() -> None:
    planned = [
        _req("dl", 1.0, slo={"class": "deadline", "deadline_ms": 3000}),
        _req("lat", 2.0, out=11, slo={"class": "latency", "ttft_ms": 500, "tpot_ms": 100}),
        _req("ttft", 2.0, out=11, slo={"class": "latency", "ttft_ms": 500}),
        _req("be", 0.0, slo={}),
    ]
    stage = TraceRequest(arrival_s=9.0, prompt_tokens=8, output_tokens=5, rid="c1", program_id="p", stage=1)
    first = TraceRequest(arrival_s=4.0, prompt_tokens=8, output_tokens=5, rid="c0", program_id="p", stage=0)
    body = {"class": "compound", "deadline_ms": 20000, "program_id": "p"}
    planned += [PlannedRequest(first, "compound", body, 20000.0), PlannedRequest(stage, "compound", body, 20000.0)]
    due = last_chances(planned)
    grace = LATE_SEND_GRACE_S
    assert due["dl"] == pytest.approx(4.0 + grace)
    assert due["lat"] == pytest.approx(2.0 + 0.5 + 10 * 0.1 + grace)  # the 11th token's due time
    assert due["ttft"] == pytest.approx(2.5 + grace)
    assert due["c0"] == due["c1"] == pytest.approx(4.0 + 20.0 + grace)  # from the program's first arrival
    assert "be" not in due


def test_compose_prompt_reuses_the_previous_rounds_context_for_agent_rounds() -> None:
    p = _req("r2", 0.0, prompt=10, prefix_tokens=6, program_id="s", parents=("r1",))
    prompt = compose_prompt(p, fresh=list(range(100, 110)), parents_prompt=[[1, 2, 3, 4]], parents_output=[[5, 6, 7]])
    assert prompt == [1, 2, 3, 4, 5, 6, 100, 101, 102, 103]
    too_long = compose_prompt(
        _req("x", 0.0, prompt=3), fresh=[9, 9, 9], parents_prompt=[], parents_output=[[1, 2, 3, 4]]
    )
    assert too_long == [1, 2, 3]
