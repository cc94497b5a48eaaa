"""The agent's delta stream over SGLang's cumulative chunks, and the drain's bounded wait."""

from __future__ import annotations

from server.delta_stream import DeltaStream
from server.draining import Drain, drain_then_exit, install_drain_handler
from wire import TIER_KEY, TOKEN_TS_KEY


def test_cumulative_chunks_become_deltas_without_touching_sglangs_objects():
    ids: list[int] = []
    meta: dict = {"id": "r", TOKEN_TS_KEY: [], TIER_KEY: [], "completion_tokens": 0}
    stream = DeltaStream()
    seen, stamps = [], []
    for step in range(1, 6):
        ids.extend([step] * step)  # SGLang appends to the same list it streams
        meta[TOKEN_TS_KEY] = [float(i) for i in range(len(ids))]
        meta[TIER_KEY] = [0] * len(ids)
        out = stream.next({"text": "cumulative text", "output_ids": ids, "meta_info": dict(meta)})
        seen += out["output_ids"]
        stamps += out["meta_info"][TOKEN_TS_KEY]
        assert len(out["output_ids"]) == step and out["text"] == ""
        assert out["meta_info"]["id"] == "r"
    assert seen == ids and stamps == [float(i) for i in range(len(ids))]
    assert len(ids) == 15  # the shared list was not cut


def test_an_abort_chunk_with_fewer_ids_adds_nothing():
    stream = DeltaStream()
    stream.next({"output_ids": [1, 2, 3], "meta_info": {}})
    assert stream.next({"output_ids": [3], "meta_info": {"finish_reason": {"type": "abort"}}})["output_ids"] == []


def test_a_drain_waits_for_the_last_request_then_exits():
    busy = iter([3, 2, 1, 0])
    exits, clock = [], [0.0]
    why = drain_then_exit(
        Drain(),
        lambda: next(busy),
        30.0,
        lambda: exits.append(clock[0]),
        sleep=lambda s: clock.__setitem__(0, clock[0] + s),
        clock=lambda: clock[0],
    )
    assert why == "drained" and len(exits) == 1 and abs(exits[0] - 0.6) < 1e-9


def test_a_drain_gives_up_at_its_timeout():
    clock = [0.0]
    exits: list[float] = []
    drain = Drain()
    why = drain_then_exit(
        drain,
        lambda: 1,
        2.0,
        lambda: exits.append(clock[0]),
        sleep=lambda s: clock.__setitem__(0, clock[0] + s),
        clock=lambda: clock[0],
    )
    assert why == "timeout" and len(exits) == 1 and 2.0 <= exits[0] < 2.5
    assert drain.active and not drain.start()


def test_sigterm_drains_and_a_second_one_exits_at_once() -> None:
    import signal
    import threading

    drain = Drain()
    exits: list[str] = []
    done = threading.Event()
    busy = iter([1, 1, 0])
    previous = signal.getsignal(signal.SIGTERM)
    try:
        handler = install_drain_handler(drain, lambda: next(busy, 0), 5.0, lambda: (exits.append("exit"), done.set()))
        assert signal.getsignal(signal.SIGTERM) is handler
        handler(signal.SIGTERM, None)
        assert drain.active
        assert done.wait(5.0) and exits == ["exit"]  # drained: the thread ended the process
        handler(signal.SIGTERM, None)  # another while (still) draining: at once
        assert exits == ["exit", "exit"]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_on_a_loop_the_drain_handler_replaces_the_one_registered_there() -> None:
    """SGLang's tokenizer manager registers its own SIGTERM handler on the event loop (at the
    first request, often after start-up); ours, installed on the loop, runs instead of it."""
    import asyncio
    import os
    import signal
    import threading

    async def go() -> tuple[list[str], bool]:
        loop = asyncio.get_running_loop()
        theirs: list[str] = []
        loop.add_signal_handler(signal.SIGTERM, lambda: theirs.append("sglang"))
        drain, done = Drain(), threading.Event()
        install_drain_handler(drain, lambda: 0, 5.0, done.set, loop)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):
            if drain.active:
                break
            await asyncio.sleep(0.01)
        loop.remove_signal_handler(signal.SIGTERM)
        return theirs, drain.active and done.wait(5.0)

    previous = signal.getsignal(signal.SIGTERM)
    try:
        theirs, drained = asyncio.run(go())
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert drained and theirs == []
