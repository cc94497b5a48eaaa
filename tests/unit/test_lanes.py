"""The lanes `./slo test` runs the server tests in (tests/conftest.py): together they run every
server test once, and each shared server's users keep to one lane, so that it starts once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COLLECT = """
import json, sys
import pytest
from tests.conftest import lane_of
from tests.integration.conftest import SHARED

class Report:
    def pytest_collection_modifyitems(self, items):
        self.items = [(i.nodeid, lane_of(i), sorted(set(i.fixturenames) & set(SHARED))) for i in items]

report = Report()
args = ["-q", "--collect-only", "-p", "no:cacheprovider", "tests/contract", "tests/integration"]
code = pytest.main(args, plugins=[report])
print("LANES" + json.dumps({"code": int(code), "items": report.items}))
"""


def test_every_server_test_runs_in_one_lane_and_a_shared_server_in_one() -> None:
    out = subprocess.run([sys.executable, "-c", COLLECT], cwd=ROOT, capture_output=True, text=True, timeout=300)
    line = next(line for line in out.stdout.splitlines() if line.startswith("LANES"))
    report = json.loads(line.removeprefix("LANES"))
    assert report["code"] == 0, out.stdout[-3000:]
    items = report["items"]
    lanes = {lane for _, lane, _ in items}
    assert lanes == {"a", "b", "paced"}, lanes  # one lane left empty would be a mistyped module name
    shared_lanes: dict[str, set[str]] = {}
    for _, lane, shared in items:
        for name in shared:
            shared_lanes.setdefault(name, set()).add(lane)
    assert shared_lanes and all(len(used) == 1 for used in shared_lanes.values()), shared_lanes
