"""The routing-policy registry and the shared contract: healthy workers only."""

from __future__ import annotations

import pytest

from router.policies import ROUTING_POLICIES, NoWorkerError, RoutingPolicy, accepted_params, make_routing_policy
from tests.unit.router._policy_views import request, worker


def _build(name: str) -> RoutingPolicy:
    if name == "slos":
        return make_routing_policy(name, admit=lambda req, w: True)
    return make_routing_policy(name)


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown routing policy 'nope'") as err:
        make_routing_policy("nope")
    for name in ROUTING_POLICIES:
        assert name in str(err.value)


def test_unknown_parameter_is_an_error() -> None:
    with pytest.raises(ValueError, match="takes no parameter 'tau'"):
        make_routing_policy("round_robin", tau=3)


def test_parameters_reach_the_policy() -> None:
    assert "tau" in accepted_params("goodserve")
    assert make_routing_policy("goodserve", tau=7).tau == 7


@pytest.mark.parametrize("name", sorted(ROUTING_POLICIES))
def test_every_policy_skips_unhealthy_and_raises_when_none(name: str) -> None:
    policy = _build(name)
    assert policy.name == name
    workers = [worker("sick", healthy=False), worker("ok"), worker("down", healthy=False)]
    for i in range(6):
        assert policy.choose(request(f"r{i}", prefix_hashes=(1, 2)), workers, now=0.0).worker_id == "ok"
    with pytest.raises(NoWorkerError):
        policy.choose(request(), [worker("sick", healthy=False)], now=0.0)
    with pytest.raises(NoWorkerError):
        policy.choose(request(), [], now=0.0)
    assert policy.migrations([], workers, now=0.0) == []
