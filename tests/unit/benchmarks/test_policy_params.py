import pytest

from benchmarks.cli import policy_overrides
from scheduler.core.policies import POLICIES, make_policy


def test_values_are_json_or_strings_per_policy():
    out = policy_overrides(["gmax:objective=tokens", "gmax:cutoff=0.8", "tempo:preempt=false"], POLICIES)
    assert out == {"gmax": {"objective": "tokens", "cutoff": 0.8}, "tempo": {"preempt": False}}
    assert not make_policy("gmax", **out["gmax"]).per_request  # what the simulator builds from them
    assert make_policy("gmax").per_request


@pytest.mark.parametrize(("item", "message"), [("gmax=1", "POLICY:KEY=VALUE"), ("nope:x=1", "unknown policy 'nope'")])
def test_malformed_or_unknown_is_refused(item, message):
    with pytest.raises(ValueError, match=message):
        policy_overrides([item], POLICIES)
