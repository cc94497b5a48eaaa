import argparse
import json
import os
from pathlib import Path

import pytest

from benchmarks.cli import policy_overrides, run_header
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


def test_a_run_header_is_json_and_names_the_flags_and_the_cores_when_asked():
    args = argparse.Namespace(json=Path("out/run.json"), seed=3)
    plain, with_cores = run_header(args), run_header(args, cores=True)
    assert json.loads(json.dumps(plain))["args"] == {"json": "out/run.json", "seed": 3}
    assert "cores" not in plain["machine"] and with_cores["machine"].endswith(f" {os.cpu_count()} cores")
