"""Worker membership on a fake clock: liveness, revival, stale reports, in-flight bookkeeping,
connections, stalled engines, draining and forgetting the dead."""

from __future__ import annotations

import pytest

from router.membership import ID_IN_USE, WorkerRegistry
from router.protocol import Heartbeat, LoadReport, Register
from tests.unit.router._fake_worker import load_report


def _reg(worker_id: str = "w1", gpu: str = "h100", capacity: int = 1000) -> Register:
    return Register(worker_id=worker_id, gpu=gpu, model="tiny", kv_capacity_tokens=capacity, max_running=8)


def _report(seq: int, queue_len: int = 0, worker_id: str = "w1") -> LoadReport:
    return load_report(worker_id, seq, queue_len=queue_len)


def test_a_silent_worker_is_dead_after_two_seconds_and_not_before() -> None:
    reg = WorkerRegistry()
    assert reg.register(_reg(), now=0.0).accepted
    assert reg.heartbeat(Heartbeat(worker_id="w1", seq=0), now=1.0)
    assert reg.reap(2.9) == [] and reg.views(2.9)[0].healthy
    assert reg.reap(3.01) == ["w1"]
    assert reg.reap(4.0) == []  # reported once
    assert not reg.views(4.0)[0].healthy and not reg.is_alive("w1")
    assert not reg.heartbeat(Heartbeat(worker_id="w1", seq=1), now=4.0)  # the dead must re-register


def test_a_restarted_worker_re_registers_and_is_healthy_again() -> None:
    reg = WorkerRegistry()
    reg.register(_reg(), now=0.0)
    reg.report(_report(5), now=0.5)
    reg.reap(10.0)
    ack = reg.register(_reg(gpu="a40", capacity=500), now=10.0)
    assert ack.accepted and ack.reason == "revived"
    (view,) = reg.views(10.0)
    assert view.healthy and view.gpu == "a40" and view.kv_capacity_tokens == 500
    assert view.queue_len == 0  # the old process's load was dropped
    assert reg.report(_report(0), now=10.1)  # sequence numbers restart with the new process


def test_stale_or_repeated_reports_are_ignored() -> None:
    reg = WorkerRegistry()
    reg.register(_reg(), now=0.0)
    assert reg.report(_report(2, queue_len=7), now=0.1)
    assert not reg.report(_report(1, queue_len=99), now=0.2)
    assert not reg.report(_report(2, queue_len=99), now=0.2)
    assert reg.views(0.3)[0].queue_len == 7
    assert not reg.report(_report(3, worker_id="ghost"), now=0.3)


def test_in_flight_requests_are_tracked_moved_and_listed_for_resubmission() -> None:
    reg = WorkerRegistry()
    reg.register(_reg("w1"), now=0.0)
    reg.register(_reg("w2"), now=0.0)
    for rid in ("a", "b", "c"):
        reg.track(rid, "w1")
    reg.track("b", "w2")  # migrated
    assert reg.inflight_on("w1") == ["a", "c"] and reg.worker_of("b") == "w2"
    assert [v.inflight for v in reg.views(0.1)] == [2, 1]
    assert reg.untrack("a") == "w1" and reg.untrack("a") is None
    reg.reap(5.0)
    assert reg.inflight_on("w1") == ["c"]  # what the router resubmits after the death
    with pytest.raises(KeyError):
        reg.track("d", "nobody")


def test_a_live_workers_id_is_not_handed_to_another_connection() -> None:
    reg = WorkerRegistry()
    assert reg.register(_reg(), now=0.0, identity=b"first").accepted
    refused = reg.register(_reg(gpu="a40"), now=0.5, identity=b"second")
    assert not refused.accepted and refused.reason == ID_IN_USE
    assert reg.speaks_for("w1", b"first") and not reg.speaks_for("w1", b"second")
    assert reg.register(_reg(), now=0.6, identity=b"first").accepted  # the same connection again: fine
    reg.reap(3.0)  # the first falls silent: now a new process may take the id
    assert reg.register(_reg(gpu="a40"), now=3.0, identity=b"second").accepted
    assert reg.speaks_for("w1", b"second") and not reg.speaks_for("w1", b"first")


def test_a_busy_engine_that_stops_stepping_is_stalled_until_it_steps_again() -> None:
    reg = WorkerRegistry(stall_after_s=5.0)
    reg.register(_reg(), now=0.0)
    for t in range(1, 12):  # the agent heartbeats on, but the engine's step counter stands at 40
        reg.heartbeat(Heartbeat(worker_id="w1", seq=t, engine_steps=40, busy=True), now=float(t))
        assert reg.reap(float(t)) == ([] if t <= 6 else (["w1"] if t == 7 else []))
    assert reg.is_stalled("w1") and not reg.views(11.0)[0].healthy and reg.is_alive("w1")
    reg.heartbeat(Heartbeat(worker_id="w1", seq=20, engine_steps=41, busy=True), now=11.5)
    assert not reg.is_stalled("w1") and reg.views(11.5)[0].healthy


def test_an_idle_engine_need_not_step() -> None:
    reg = WorkerRegistry(stall_after_s=5.0)
    reg.register(_reg(), now=0.0)
    for t in range(1, 20):
        reg.heartbeat(Heartbeat(worker_id="w1", seq=t, engine_steps=40, busy=False), now=float(t))
    assert reg.reap(19.0) == [] and reg.views(19.0)[0].healthy


def test_a_draining_worker_is_alive_but_not_routable() -> None:
    reg = WorkerRegistry()
    reg.register(_reg(), now=0.0)
    reg.heartbeat(Heartbeat(worker_id="w1", seq=1, draining=True), now=0.5)
    assert reg.is_alive("w1") and not reg.views(0.6)[0].healthy


def test_dead_workers_are_forgotten_after_the_ttl() -> None:
    reg = WorkerRegistry(forget_after_s=60.0)
    reg.register(_reg("w1"), now=0.0)
    reg.register(_reg("w2"), now=0.0)
    reg.track("a", "w1")
    reg.heartbeat(Heartbeat(worker_id="w2", seq=1), now=50.0)
    reg.reap(3.0)
    assert reg.forget_dead(60.0) == []
    assert reg.forget_dead(63.5) == ["w1"]
    assert reg.worker_ids() == ["w2"] and reg.worker_of("a") is None


def test_dead_after_must_be_positive() -> None:
    with pytest.raises(ValueError, match="dead_after_s"):
        WorkerRegistry(dead_after_s=0)


def test_a_worker_bound_to_every_interface_is_reached_where_it_connects_from() -> None:
    from dataclasses import replace

    from router.pd import bootstrap_for

    reg = WorkerRegistry()
    wildcard = replace(_reg("p0"), http_url="http://0.0.0.0:31000", bootstrap_port=32000, role="prefill")
    assert reg.register(wildcard, now=0.0, peer_host="10.231.0.2").accepted
    url = reg.registration("p0").http_url
    assert url == "http://10.231.0.2:31000"
    assert bootstrap_for(url, 32000)["host"] == "10.231.0.2"  # PD decode workers fetch KV there
    advertised = replace(_reg("w2"), http_url="http://10.9.9.9:31001")
    assert reg.register(advertised, now=0.0, peer_host="10.231.0.2").accepted
    assert reg.registration("w2").http_url == "http://10.9.9.9:31001"  # --advertise-host wins
