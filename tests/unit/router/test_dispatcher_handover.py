"""What survives a hand-over between workers (router/handover.py), over real ZMQ with the fake
workers of test_dispatcher: a grammar-constrained request is never moved by choice once it has a
token, restarts from scratch (not streamed) or ends with an error naming why (streamed) when its
worker is lost, and a stop string spanning the hand-over still stops the request.

The fake workers emit token `base + position`; the decoder used here spells token t as the letter
`t % 100` of the alphabet, so w0 and w1 with the same base write "abcdefgh..." between them.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
import zmq.asyncio

from router.flight import StreamChunk, StreamError
from router.handover import MigrationRefused, StopWatch, migration_blocker
from tests.unit.router._fake_worker import until
from tests.unit.router.test_dispatcher import MoveOnce, _collect, _request, _run, _tokens, cluster


def _letters(ids: Sequence[int]) -> str:
    return "".join(string.ascii_lowercase[t % 100 % 26] for t in ids)


def _constrained(rid: str, max_new: int, stream: bool = True, **params: Any) -> tuple[Any, Any]:
    route, submit = _request(rid, max_new=max_new)
    return route, replace(submit, stream=stream, sampling_params={**submit.sampling_params, **params})


def test_the_policy_never_moves_a_constrained_request_once_it_has_a_token(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        specs = [{"delay_s": 0.03}, {"base": 500}]
        async with cluster(ctx, specs, policy=MoveOnce(after=2)) as (dispatcher, (w0, w1)):
            events = await _collect(await dispatcher.submit(*_constrained("r1", 8, json_schema='{"type": "object"}')))
            assert _tokens(events) == list(range(100, 108)) and w1.submits == []
            status = dispatcher.status()
            assert status["migrated"] == 0 and status["migrations_pinned"] == 1

    _run(go)


def test_an_operator_move_of_a_constrained_request_is_refused_naming_why(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with cluster(ctx, [{"delay_s": 0.03}, {"base": 500}], migrate_interval_s=None) as (dispatcher, (w0, w1)):
            stream = await dispatcher.submit(*_constrained("r1", 100, regex="[a-z]+"))
            await until(lambda: bool(dispatcher.running_on("w0")) and dispatcher.running_on("w0")[0].generated > 0)
            with pytest.raises(MigrationRefused, match="regex"):
                await dispatcher.migrate("r1", "w1")
            await stream.aclose()
            assert w1.submits == [] and dispatcher.status()["migrations_refused"] == 1
            # before its first token nothing of the grammar exists yet: it may move
            fresh = await dispatcher.submit(*_constrained("r2", 3, regex="[a-z]+"))
            target, base = ("w1", 500) if dispatcher.registry.worker_of("r2") == "w0" else ("w0", 100)
            assert await dispatcher.migrate("r2", target) is True
            assert _tokens(await _collect(fresh)) == [base, base + 1, base + 2]

    _run(go)


def test_a_streamed_constrained_request_that_lost_its_worker_ends_with_an_error(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with cluster(ctx, [{"die_after": 3}, {"base": 500}]) as (dispatcher, (w0, w1)):
            events = await _collect(await dispatcher.submit(*_constrained("r1", 8, ebnf='root ::= "a"+')))
            assert _tokens(events) == [100, 101, 102]
            error = events[-1]
            assert isinstance(error, StreamError) and error.status == 502 and error.reason == "worker_failed"
            assert error.retry_after_s is not None  # a fresh request may be sent: when, it says
            assert "ebnf" in error.message and "3 streamed tokens" in error.message
            assert w1.submits == []  # nothing resumed that could break the grammar

    _run(go)


def test_a_constrained_request_not_streamed_restarts_from_scratch(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with cluster(ctx, [{"die_after": 3}, {"base": 500}]) as (dispatcher, (w0, w1)):
            request = _constrained("r1", 6, stream=False, json_schema='{"type": "string"}')
            events = await _collect(await dispatcher.submit(*request))
            restarts = [i for i, e in enumerate(events) if isinstance(e, StreamChunk) and e.restart]
            assert restarts == [3] and _tokens(events[:3]) == [100, 101, 102]
            assert _tokens(events[4:]) == list(range(500, 506))  # the whole answer, from w1 alone
            assert [e.completion_tokens for e in events[4:]] == list(range(1, 7))
            (submit,) = w1.submits
            assert submit.resume_output_ids == () and submit.sampling_params["max_new_tokens"] == 6
            assert dispatcher.status()["restarted"] == 1

    _run(go)


@pytest.mark.parametrize(
    ("stop", "matched"),
    [
        # "bc" lies wholly in w0's part (its worker matches that one); "cde" spans "abc" | "de"
        ({"stop": ["bc", "cde"]}, "cde"),
        ({"stop_regex": ["x+", "c[d-z]{2}"]}, "c[d-z]{2}"),
    ],
    ids=["string", "regex"],
)
def test_a_stop_spanning_the_hand_over_stops_the_request(
    ctx: zmq.asyncio.Context, stop: dict[str, list[str]], matched: str
) -> None:
    async def go() -> None:
        async with cluster(ctx, [{"die_after": 3}, {}], decode=_letters) as (dispatcher, (w0, w1)):
            events = await _collect(await dispatcher.submit(*_constrained("r1", 10, **stop)))
            assert _letters(_tokens(events)) == "abcde"
            final = events[-1]
            assert isinstance(final, StreamChunk) and final.finish_reason == "stop"
            assert final.meta == {"finish_reason": {"type": "stop", "matched": matched}}
            await until(lambda: "r1" in w1.aborts)
            assert dispatcher.status()["stopped_at_handover"] == 1

    _run(go)


def test_a_request_whose_stop_string_never_spans_runs_to_its_end(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with cluster(ctx, [{"die_after": 3}, {}], decode=_letters) as (dispatcher, (w0, w1)):
            events = await _collect(await dispatcher.submit(*_constrained("r1", 10, stop="ghij")))
            assert _letters(_tokens(events)) == "abcdefghij"  # wholly in w1's part: w1's to match
            assert events[-1].finish_reason == "length" and w1.aborts == []

    _run(go)


def test_the_stop_watch_ends_once_no_stop_string_can_span() -> None:
    watch = StopWatch(["xyz"], [0, 1, 2], _letters)
    assert watch.feed([3]) is None and not watch.done
    assert watch.feed([4]) is None and watch.done  # "de" after the hand-over: "xyz" cannot span now
    assert StopWatch(["bcd"], [0, 1, 2], _letters).feed([3, 4]) == (1, "bcd")
    assert StopWatch([], [0, 1, 2], _letters, ["b[a-z]d"]).feed([3, 4]) == (1, "b[a-z]d")
    assert StopWatch([], [0, 1, 2], _letters, ["ab", "d"]).feed([3]) is None  # wholly on one side: the workers'
    assert StopWatch([], [0, 1, 2], _letters, ["(a+)+$"]).done  # an unbounded pattern is never run here


def test_what_blocks_a_move() -> None:
    assert migration_blocker({"json_schema": "{}"}, 0, True) is None  # no token yet: nothing to lose
    assert "json_schema" in (migration_blocker({"json_schema": "{}"}, 2, True) or "")
    assert migration_blocker({"stop": ["x"], "stop_regex": ["a{2}", "b"]}, 2, True) is None
    assert "stop_regex" in (migration_blocker({"stop_regex": "(a+)+$"}, 2, True) or "")  # never run here
    assert "decoder" in (migration_blocker({"stop": "x"}, 2, False) or "")
    assert "decoder" in (migration_blocker({"stop_regex": "x"}, 2, False) or "")
    assert migration_blocker({"regex": None, "stop": ""}, 2, False) is None
