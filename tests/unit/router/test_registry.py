"""Worker membership on a fake clock: liveness, revival, stale reports, in-flight bookkeeping, keys."""

from __future__ import annotations

import pytest

from router.protocol import Heartbeat, LoadReport, Register, hash_api_key
from router.registry import WorkerRegistry


def _reg(worker_id: str = "w1", gpu: str = "h100", capacity: int = 1000, key: str | None = None) -> Register:
    return Register(
        worker_id=worker_id,
        gpu=gpu,
        model="tiny",
        kv_capacity_tokens=capacity,
        max_running=8,
        api_key_hash=None if key is None else hash_api_key(key),
    )


def _report(seq: int, queue_len: int = 0, worker_id: str = "w1") -> LoadReport:
    return LoadReport(
        worker_id=worker_id,
        seq=seq,
        queue_len=queue_len,
        running=1,
        kv_used_tokens=100,
        queue_delay_s=0.1,
        prefill_s_per_token=0.001,
        decode_s_per_token=0.01,
        iteration_s=0.02,
        tokens_per_minute=600.0,
    )


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


@pytest.mark.parametrize("key, reason", [(None, "missing api key"), ("wrong", "wrong api key")])
def test_a_worker_without_the_right_key_is_refused(key: str | None, reason: str) -> None:
    reg = WorkerRegistry(api_key="secret")
    ack = reg.register(_reg(key=key), now=0.0)
    assert not ack.accepted and ack.reason == reason
    assert reg.worker_ids() == []
    assert reg.register(_reg(key="secret"), now=0.0).accepted


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
