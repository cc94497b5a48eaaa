"""An SLO is validated once per process on its way to the scheduler, and carried as the parsed
object within a process: a direct request is validated at the worker's HTTP edge only (the
tokenizer manager reads the middleware's object, the scheduler decodes without re-checking); a
routed one at the router's edge and at the worker's link to the router (the worker's trust
boundary), and nowhere else. The real edge, link, agent and intake code run in sequence, one
process's part at a time, with `parse_slo` (validation) and `SloSpec.to_dict` (serialisation)
counted: a change that parses or serialises again on the way fails here."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

import router.protocol as protocol
import scheduler.core.slo_wire as slo_wire
from router.protocol import Submit, decode
from router.requests import ParseContext, parse_native
from scheduler.components.request_state import RequestStates
from scheduler.core.slo import SloClass, SloSpec
from scheduler.reporting.metrics import SloMetrics
from scheduler.reporting.reports import SloReportBook
from server import request_context
from server.agent_config import AgentConfig
from server.sglang_http import request_slo
from server.slo_middleware import SloMiddleware
from server.worker_agent import WorkerAgent
from wire import AGENT_TOKEN_HEADER

SLO = {"ttft_ms": 500.0, "tpot_ms": 50.0}
TOKEN = "agent-token"


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """`parse` and `serialise` calls, wherever the code under test makes them."""
    counted: Counter[str] = Counter()

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            counted[name] += 1
            return real(*args, **kwargs)

        return wrapped

    for module in (slo_wire, protocol):  # every importer of parse_slo on a request's way
        monkeypatch.setattr(module, "parse_slo", counting("parse", module.parse_slo))
    monkeypatch.setattr(SloSpec, "to_dict", counting("serialise", SloSpec.to_dict))
    return counted


def _taken(counted: Counter[str]) -> tuple[int, int]:
    """(parses, serialisations) since the last call: one process's share."""
    got = (counted["parse"], counted["serialise"])
    counted.clear()
    return got


def _through_http_process(body: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> tuple[Any, dict[str, Any]]:
    """The worker's HTTP process: SloMiddleware, then (inside its request's context, as SGLang's
    route handler calls it) the tokenizer manager's SLO; returns that and the injected body."""
    seen, status = _serve(body, headers)
    assert status == 200
    return seen["slo"], seen["body"]


def _serve(body: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> tuple[dict[str, Any], int]:
    seen: dict[str, Any] = {}
    statuses: list[int] = []

    async def tokenizer_manager(scope: Any, receive: Any, send: Any) -> None:
        msg = await receive()
        seen["body"] = orjson.loads(msg["body"])
        obj = SimpleNamespace(sampling_params=seen["body"]["sampling_params"])
        seen["slo"] = request_slo(request_context.current(), obj)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    mw = SloMiddleware(tokenizer_manager, SloReportBook(SloMetrics()), None, lambda: {}, agent_token=TOKEN)
    pending = [{"type": "http.request", "body": orjson.dumps(body), "more_body": False}]

    async def receive() -> dict[str, Any]:
        return pending.pop(0)

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    scope = {"type": "http", "method": "POST", "path": "/generate", "headers": headers}
    asyncio.run(mw(scope, receive, send))
    return seen, statuses[0]


def _through_scheduler(body: dict[str, Any]) -> SloSpec:
    """The scheduler process: its intake reads the custom_params SGLang carried over ZMQ."""
    params = SimpleNamespace(custom_params=body["sampling_params"]["custom_params"])
    return RequestStates().of(SimpleNamespace(rid="r1", sampling_params=params), now=0.0).slo


def test_a_direct_request_is_parsed_once_at_the_edge(counts: Counter[str]) -> None:
    (spec, _), body = _through_http_process({"input_ids": [1, 2], "slo": SLO}, [])
    assert spec.slo_class is SloClass.LATENCY and spec.tpot_ms == 50.0
    assert _taken(counts) == (1, 1)  # the middleware parses; it serialises into custom_params
    assert _through_scheduler(body) == spec
    assert _taken(counts) == (0, 0)  # decoded, not validated again


def test_a_routed_request_is_parsed_once_by_the_router_and_once_by_the_worker(counts: Counter[str]) -> None:
    async def tokenizer() -> Any:
        raise AssertionError("input_ids need no tokenizer")

    call = asyncio.run(parse_native({"input_ids": [1, 2], "slo": SLO}, ParseContext({}, tokenizer)))
    # as RouterService.submit builds it; PD pairing and resume rebuild it with `replace`
    submit = Submit(rid=call.rid, input_ids=tuple(call.input_ids), sampling_params=call.sampling_params, slo=call.slo)
    submit = dataclasses.replace(submit, bootstrap={"host": "h", "port": 1, "room": 7})
    raw = submit.to_wire()
    assert _taken(counts) == (1, 1)  # the router's edge parses; the wire form is written once

    received = decode(raw)
    assert isinstance(received, Submit) and received.slo == call.slo
    assert _taken(counts) == (1, 0)  # the worker's link to the router validates what it is sent
    agent_post = _agent_post(received)
    (spec, _), body = _through_http_process(agent_post["json"], _ascii_headers(agent_post["headers"]))
    assert spec == call.slo
    # nothing validated again in the worker's process: the agent serialises for its own server's
    # HTTP hop, the middleware into custom_params for the scheduler
    assert _taken(counts) == (0, 2)
    assert _through_scheduler(body) == spec
    assert _taken(counts) == (0, 0)


def test_a_client_cannot_skip_the_workers_validation(counts: Counter[str]) -> None:
    """Only the agent's token makes the middleware decode without checking."""
    forged = [(AGENT_TOKEN_HEADER.encode(), b"not-the-token")]
    seen, status = _serve({"input_ids": [1], "slo": {"ttft_ms": -1.0}}, forged)
    assert status == 400 and seen == {}  # answered at the edge: SGLang never saw it
    assert counts["parse"] == 1


class _CapturingSession:
    """Records the agent's POST to its own server and ends the run there."""

    def __init__(self) -> None:
        self.posted: dict[str, Any] = {}

    def post(self, url: str, json: dict[str, Any], headers: dict[str, str]) -> Any:
        self.posted.update(url=url, json=json, headers=headers)
        raise ConnectionError("captured")


def _agent_post(submit: Submit) -> dict[str, Any]:
    config = AgentConfig(router_address="tcp://127.0.0.1:1", worker_id="w0", gpu="cpu", model="m", http_url="http://x")
    agent = WorkerAgent(dataclasses.replace(config, agent_token=TOKEN), lambda: {}, None)
    session = _CapturingSession()
    agent.requests._session = session  # type: ignore[assignment]
    with pytest.raises(ConnectionError):
        asyncio.run(agent.requests._stream(submit))
    # the agent's JSON body as its server receives it (aiohttp encodes it)
    return {"json": orjson.loads(orjson.dumps(session.posted["json"])), "headers": session.posted["headers"]}


def _ascii_headers(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode(), v.encode()) for k, v in headers.items()]
