"""Tensor-parallel ranks make one decision per pass: the leading rank's plan, speculation length
and dynamic-chunk step, applied verbatim by the others (scenario: _rank_scenario.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scheduler.components.rank_sync import PassDecision, PassSync
from scheduler.core.plan_path import FinalPlan
from server.process import free_port
from tests.unit.scheduler._rank_scenario import STARTUP_CHUNK, outcome, rank_scheduler
from tests.unit.scheduler._stand_in_engine import StandInReq

ROOT = Path(__file__).resolve().parents[3]


class _Relay:
    """An in-process broadcast: the leader's values, handed to a follower run after it."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def leader(self, value: Any) -> Any:
        self.sent.append(value)
        return value

    def follower(self, value: Any) -> Any:
        return self.sent.pop(0)


def test_alone_the_ranks_would_diverge() -> None:
    """The scenario's premise: without a shared decision the ranks run different passes."""
    leader, other = rank_scheduler(leader=True), rank_scheduler(leader=False)
    for s in (leader, other):
        s.get_new_batch_prefill(s.running_batch)
    assert outcome(leader)["dropped"] == ["late"] and outcome(other)["dropped"] == []
    assert outcome(leader)["chunk"] < STARTUP_CHUNK == outcome(other)["chunk"]


def test_the_other_ranks_apply_the_leaders_decision_verbatim() -> None:
    relay = _Relay()
    leader, other = rank_scheduler(leader=True), rank_scheduler(leader=False)
    leader.slo.sync = PassSync(relay.leader, leader=True)
    other.slo.sync = PassSync(relay.follower, leader=False)
    for _ in range(2):
        leader.get_new_batch_prefill(leader.running_batch)
        other.get_new_batch_prefill(other.running_batch)
    assert outcome(other) == outcome(leader)
    assert outcome(other)["dropped"] == ["late"]
    assert other.slo.planner.errors == 0 and not relay.sent


def test_a_failing_leader_still_sends_a_decision() -> None:
    sent: list[Any] = []

    def broadcast(value: Any) -> Any:
        sent.append(value)
        return value

    def boom() -> PassDecision:
        raise RuntimeError("policy bug")

    sync = PassSync(broadcast, leader=True)
    assert sync.decide(boom, PassDecision()) == PassDecision()
    assert sent == [PassDecision()]  # the followers waiting on the group get SGLang's choice
    assert sync.failed == 1


def test_a_leaders_failed_pass_is_counted_as_a_fallback_in_the_status(monkeypatch: pytest.MonkeyPatch) -> None:
    """A TP leader whose pass raises keeps the group on SGLang's scheduling: /slo/status says so."""
    s = rank_scheduler(leader=True)
    s.slo.sync = PassSync(lambda value: value, leader=True)  # a group: the leader's failure is caught

    def broken_view(running_batch: Any) -> Any:
        raise AttributeError("an SGLang request attribute moved")

    monkeypatch.setattr(s, "_slo_view", broken_view)
    s.get_new_batch_prefill(s.running_batch)
    status = s.slo_status_snapshot()
    assert (status["fallbacks"], status["plan_errors"], status["planned_passes"]) == (1, 1, 0)
    monkeypatch.undo()
    s.waiting_queue.append(StandInReq("next", 100, ttft_ms=60_000))  # SGLang admitted the others
    s.get_new_batch_prefill(s.running_batch)
    assert s.slo_status_snapshot()["planned_passes"] == 1


def test_a_follower_never_decides_itself() -> None:
    plan = FinalPlan(order=("b", "a"))
    sync = PassSync(lambda value: PassDecision(plan), leader=False)
    assert sync.decide(lambda: pytest.fail("a follower must not plan"), PassDecision()).plan is plan


@pytest.mark.timeout(120)
def test_two_ranks_over_a_gloo_group_run_the_same_passes() -> None:
    """Two processes, one gloo group, SGLang's own broadcast (as the adapter wires it)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.setdefault("OMP_NUM_THREADS", "1")
    ranks = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.unit.scheduler._rank_scenario", str(rank), str(port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outcomes = []
    for proc in ranks:
        try:
            out, _ = proc.communicate(timeout=100)
        finally:
            proc.kill()
        assert proc.returncode == 0, out[-3000:]
        line = next(line for line in out.splitlines() if line.startswith("OUTCOME "))
        outcomes.append(json.loads(line[len("OUTCOME ") :]))
    leader, other = outcomes
    assert other == leader
    assert leader["dropped"] == ["late"] and leader["chunk"] < STARTUP_CHUNK
    assert leader["shared"] == 2  # one shared decision per pass


# ---- data parallelism: one status address per replica, merged by the HTTP process ---------------


def test_each_replica_publishes_on_its_own_address() -> None:
    from scheduler.components.status_channel import dp_status_address

    base = "ipc:///tmp/status-1"
    addresses = {dp_status_address(base, i) for i in range(4)}
    assert len(addresses) == 4 and dp_status_address(base, 0) == base


def test_replicas_merge_into_one_engine_status() -> None:
    from scheduler.components.status_channel import merge_replicas

    a = {"waiting": 3, "running": 5, "kv_capacity_tokens": 1000, "kv_used_tokens": 10, "steps": 40, "policy": "slos"}
    b = {"waiting": 1, "running": 2, "kv_capacity_tokens": 1000, "kv_used_tokens": None, "steps": 90, "policy": "slos"}
    merged = merge_replicas([a, b])
    assert (merged["waiting"], merged["running"], merged["kv_capacity_tokens"]) == (4, 7, 2000)
    assert merged["kv_used_tokens"] is None  # not every replica knows it: unknown, not a partial sum
    assert merged["steps"] == 40  # a rate of its own per replica: replica 0's
    assert merged["data_parallel"] == {"replicas": 2, "reporting": 2}
    assert merge_replicas([a, {}])["data_parallel"] == {"replicas": 2, "reporting": 1}
    assert merge_replicas([a]) == a and merge_replicas([{}]) == {}
