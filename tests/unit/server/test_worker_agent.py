"""The worker agent's promises without a router or a server: one final message per request
however its run ends (none when the router withdrew it), a drain handing requests back as
`draining`, heartbeats that carry the engine's progress, load reports that list the requests
held, and the local stream read as deltas with sheds recognised."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from router.protocol import Ack, Heartbeat, LoadReport, Register, RequestError, Submit, TokenChunk
from server.agent_stream import parse_error_body, parse_line
from server.draining import Drain
from server.worker_agent import AgentConfig, WorkerAgent
from wire import REGISTER_AGAIN

CONFIG = AgentConfig(router_address="tcp://127.0.0.1:1", worker_id="w0", gpu="cpu", model="m", http_url="http://x")
ENGINE = {
    "steps": 41,
    "waiting": 2,
    "running": 1,
    "queue_drain_s": 1.5,
    "decode_step_ms": 12.5,
    "kv_capacity_tokens": 100,
}


class Recorder:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send(self, msg: Any) -> None:
        self.sent.append(msg)


def _agent(drain: Drain | None = None) -> tuple[WorkerAgent, Recorder]:
    agent = WorkerAgent(CONFIG, lambda: dict(ENGINE), drain)
    endpoint = Recorder()
    agent._endpoint = endpoint  # type: ignore[assignment]
    return agent, endpoint


def _submit(rid: str = "r1") -> Submit:
    return Submit(rid=rid, input_ids=[1, 2], sampling_params={"max_new_tokens": 2})


def _serve_with(agent: WorkerAgent, stream: Any, rid: str = "r1") -> asyncio.Task[None]:
    agent.requests._stream = stream  # type: ignore[method-assign]
    agent.requests.start(_submit(rid))
    return agent.requests.tasks[rid]


def test_a_crash_in_a_run_still_sends_a_final_error() -> None:
    async def go() -> None:
        agent, endpoint = _agent()

        async def broken(submit: Submit) -> Any:
            raise KeyError("a bug in the agent")

        await asyncio.gather(_serve_with(agent, broken), return_exceptions=True)
        (final,) = endpoint.sent
        assert isinstance(final, RequestError) and final.status == 502 and "KeyError" in final.message
        assert agent.requests.tasks == {}

    asyncio.run(go())


def test_the_final_chunk_is_sent_once() -> None:
    async def go() -> None:
        agent, endpoint = _agent()

        async def ok(submit: Submit) -> Any:
            return TokenChunk(rid=submit.rid, worker_id="w0", token_ids=[7], completion_tokens=1, finish_reason="stop")

        await _serve_with(agent, ok)
        assert [type(m) for m in endpoint.sent] == [TokenChunk]

    asyncio.run(go())


@pytest.mark.parametrize("draining", [False, True])
def test_a_withdrawn_request_is_silent_and_a_drained_one_is_handed_back(draining: bool) -> None:
    async def go() -> None:
        drain = Drain()
        agent, endpoint = _agent(drain)

        async def forever(submit: Submit) -> Any:
            await asyncio.sleep(3600)

        task = _serve_with(agent, forever)
        await asyncio.sleep(0)
        if draining:
            drain.start()
            await agent.hand_back()
            (final,) = endpoint.sent
            assert isinstance(final, RequestError) and final.status == 503
            assert final.shed is not None and final.shed["reason"] == "draining" and final.shed["retry_after_s"] == 2
        else:
            agent.requests.cancel("r1")  # the router's Abort
            await asyncio.gather(task, return_exceptions=True)
            assert endpoint.sent == []

    asyncio.run(go())


def test_a_replaced_run_owes_nothing_and_the_new_one_answers() -> None:
    async def go() -> None:
        agent, endpoint = _agent()
        started = asyncio.Event()

        async def slow(submit: Submit) -> Any:
            started.set()
            await asyncio.sleep(3600)

        first = _serve_with(agent, slow)
        await started.wait()

        async def ok(submit: Submit) -> Any:
            return TokenChunk(rid=submit.rid, worker_id="w0", token_ids=[], completion_tokens=0, finish_reason="stop")

        second = _serve_with(agent, ok)  # the router placed it here again
        await asyncio.gather(first, second, return_exceptions=True)
        assert [type(m) for m in endpoint.sent] == [TokenChunk]

    asyncio.run(go())


def test_heartbeats_carry_progress_and_reports_the_requests_held() -> None:
    async def go() -> None:
        drain = Drain()
        agent, _ = _agent(drain)

        async def forever(submit: Submit) -> Any:
            await asyncio.sleep(3600)

        tasks = [_serve_with(agent, forever, rid) for rid in ("a", "b")]
        beat = agent._heartbeat()
        assert isinstance(beat, Heartbeat) and beat.engine_steps == 41 and beat.busy and not beat.draining
        drain.start()
        report = agent._report()
        assert isinstance(report, LoadReport) and set(report.inflight or ()) == {"a", "b"}
        assert report.queue_drain_s == 1.5 and report.draining
        assert report.decode_step_s == pytest.approx(0.0125)  # the engine's predicted step, for the router
        for rid in ("a", "b"):
            agent.requests.cancel(rid)
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(go())


def test_stream_lines_are_deltas_and_sheds_are_recognised() -> None:
    assert parse_line(b"data: [DONE]") is None and parse_line(b": keep-alive") is None
    chunk = parse_line(b'data: {"output_ids": [4, 5], "meta_info": {"finish_reason": null}}')
    assert chunk is not None and chunk.token_ids == [4, 5] and chunk.finish is None
    done = parse_line(b'data: {"output_ids": [], "meta_info": {"finish_reason": {"type": "length", "length": 2}}}')
    assert done is not None and done.finish == "length"
    shed = parse_line(
        b'data: {"output_ids": [], "meta_info": {"finish_reason": {"type": "abort", "status_code": 429,'
        b' "reason": "queue_full", "retry_after_s": 4}}}'
    )
    assert shed is not None and shed.error_status == 429 and shed.shed is not None and shed.shed.retry_after_s == 4
    plain_abort = parse_line(b'data: {"output_ids": [], "meta_info": {"finish_reason": {"type": "abort"}}}')
    assert plain_abort is not None and plain_abort.error_status == 503 and plain_abort.shed is None
    error = parse_line(b'data: {"error": {"message": "bad", "code": 400}}')
    assert error is not None and error.error_status == 400
    body = b'{"error": {"reason": "draining", "retry_after_s": 3, "code": 503, "message": "m"}}'
    answer = parse_error_body(503, body)
    assert answer.shed is not None and answer.shed.reason == "draining" and answer.error_status == 503
    with pytest.raises(ValueError):
        parse_line(b"data: [1, 2]")


def test_a_burst_of_register_again_answers_sends_one_register() -> None:
    """A worker that wakes from a stall hears REGISTER_AGAIN once per message it had queued; a
    Register per answer made each new challenge replace the one being answered, and the router
    refused them all (a thawed worker stayed out for 5 s)."""

    async def go() -> None:
        agent, endpoint = _agent()
        for _ in range(3):
            await agent._on_message(Ack(accepted=False, reason=REGISTER_AGAIN))
        registers = [m for m in endpoint.sent if isinstance(m, Register)]
        assert len(registers) == 1 and not agent._refused

    asyncio.run(go())


def test_registration_announces_whether_the_engine_applies_the_slo_levers() -> None:
    assert not WorkerAgent(CONFIG, lambda: dict(ENGINE))._registration().slo_levers  # stock: not reported
    levered = WorkerAgent(CONFIG, lambda: {**ENGINE, "slo_levers": True})._registration()
    assert levered.slo_levers
    assert not WorkerAgent(CONFIG, lambda: {**ENGINE, "slo_levers": "yes"})._registration().slo_levers
