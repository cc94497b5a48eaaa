"""SLOs-Serve sequential admission over replicas with a best-effort fallback."""

from __future__ import annotations

import pytest

from router.policies.slos_routing import SlosRoutingParams, SlosRoutingPolicy
from tests.unit.router._policy_views import deadline_slo, request, worker

WORKERS = [worker("a", inflight=5), worker("b", inflight=1), worker("c", inflight=3), worker("x", healthy=False)]
REQ = request("r", slo=deadline_slo(2000))


class Admit:
    """Fake per-replica admission: admits only the listed replicas and records who was asked."""

    def __init__(self, *admitting: str) -> None:
        self.admitting = set(admitting)
        self.asked: list[str] = []

    def __call__(self, req, w) -> bool:
        self.asked.append(w.worker_id)
        return w.worker_id in self.admitting


def test_asks_in_ascending_load_and_takes_the_first_that_admits() -> None:
    admit = Admit("c", "a")
    d = SlosRoutingPolicy(admit).choose(REQ, WORKERS, now=0.0)
    assert (d.worker_id, d.reason, d.best_effort) == ("c", "admitted", False)
    assert admit.asked == ["b", "c"]
    assert d.detail["refusals"] == 1


def test_best_effort_on_least_loaded_after_the_limit() -> None:
    admit = Admit("a")  # only the most loaded would admit, but the limit stops before it
    d = SlosRoutingPolicy(admit, SlosRoutingParams(limit=2)).choose(REQ, WORKERS, now=0.0)
    assert (d.worker_id, d.reason, d.best_effort) == ("b", "refused_everywhere", True)
    assert admit.asked == ["b", "c"]
    nobody = Admit()
    d = SlosRoutingPolicy(nobody).choose(REQ, WORKERS, now=0.0)
    assert (d.worker_id, d.best_effort) == ("b", True)
    assert nobody.asked == ["b", "c", "a"]


def test_round_robin_order_rotates_the_first_replica() -> None:
    admit = Admit("a", "b", "c")
    policy = SlosRoutingPolicy(admit, SlosRoutingParams(order="round_robin"))
    assert [policy.choose(REQ, WORKERS, now=0.0).worker_id for _ in range(4)] == ["a", "b", "c", "a"]


def test_requests_without_slo_skip_admission() -> None:
    admit = Admit()
    d = SlosRoutingPolicy(admit).choose(request("be"), WORKERS, now=0.0)
    assert (d.worker_id, d.best_effort, admit.asked) == ("b", False, [])


def test_bad_parameters() -> None:
    with pytest.raises(ValueError):
        SlosRoutingPolicy(Admit(), SlosRoutingParams(order="random"))
    with pytest.raises(ValueError):
        SlosRoutingPolicy(Admit(), SlosRoutingParams(limit=0))
