"""The routing-policy registry and the shared contract: healthy workers only."""

from __future__ import annotations

import pytest

from router.policies import ROUTING_POLICIES, NoWorkerError, accepted_params, make_routing_policy
from scheduler.core.registry import ParamError
from tests.unit.router._policy_views import request, worker


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown routing policy 'nope'") as err:
        make_routing_policy("nope")
    for name in ROUTING_POLICIES:
        assert name in str(err.value)


def test_unknown_parameter_is_an_error() -> None:
    with pytest.raises(ParamError, match="takes no parameter 'tau'") as err:
        make_routing_policy("round_robin", tau=3)
    assert err.value.field == "tau"


def test_bad_values_name_their_field() -> None:
    with pytest.raises(ParamError, match="tau must be positive") as err:
        make_routing_policy("goodserve", tau=0)
    assert err.value.field == "tau"
    with pytest.raises(ParamError, match="tiers_ms must be") as err:
        make_routing_policy("polyserve", tiers_ms="50")
    assert err.value.field == "tiers_ms"
    with pytest.raises(ParamError, match="default_perf.base_s must be float") as err:
        make_routing_policy("slos", default_perf={"base_s": "fast"})
    assert err.value.field == "default_perf.base_s"


def test_parameters_reach_the_policy() -> None:
    assert "tau" in accepted_params("goodserve")
    assert make_routing_policy("goodserve", tau=7).params.tau == 7


@pytest.mark.parametrize("name", sorted(ROUTING_POLICIES))
def test_every_policy_skips_unhealthy_and_raises_when_none(name: str) -> None:
    policy = make_routing_policy(name)  # slos: admission over an empty in-flight view
    assert policy.name == name
    workers = [worker("sick", healthy=False), worker("ok"), worker("down", healthy=False)]
    for i in range(6):
        assert policy.choose(request(f"r{i}", prefix_hashes=(1, 2)), workers, now=0.0).worker_id == "ok"
    with pytest.raises(NoWorkerError):
        policy.choose(request(), [worker("sick", healthy=False)], now=0.0)
    with pytest.raises(NoWorkerError):
        policy.choose(request(), [], now=0.0)
    assert policy.migrations([], workers, now=0.0) == []
