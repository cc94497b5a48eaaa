"""Suite-wide settings, and the lanes the server tests run in.

Hypothesis's per-example deadline is a wall-clock bound: on a loaded 2-core host one example
can take 500 ms for reasons that have nothing to do with the code (a CI run failed that way),
so no property test here asserts speed. Tests that want their own deadline still set it.

Lanes: `./slo test` runs the server tests (tests/contract, tests/integration) as two pytest
processes at once (lanes a and b: much of a server test is a server's start-up or a wait on a
timer), then the `paced` ones alone: those that assert the engine's pace (an emulated card's
step times, a fixed profile's margin over the real engine) and would measure the other lane's
load instead. A module sits in lane b when listed in LANE_B, else in lane a; the users of one
shared server (tests/integration/conftest.py) keep to one lane, so that it starts once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("sglang-slo", deadline=None)
settings.load_profile("sglang-slo")

LANES = ("a", "b", "paced")
LANE_B = {  # the default_server's and keyed_worker's users, and modules to even out the lanes
    "test_doc_examples", "test_length_predictor", "test_smollm2",
    "test_adversarial_worker", "test_tenancy_live", "test_worker_access",
    "test_router", "test_policies_on_engine", "test_goodput_smoke", "test_scheduling_order", "test_preemption",
}  # fmt: skip


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--lane", choices=LANES, help="run only this lane's tests (see tests/conftest.py)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "paced: asserts the engine's pace; runs alone (the paced lane)")


def lane_of(item: pytest.Item) -> str:
    if item.get_closest_marker("paced") is not None:
        return "paced"
    return "b" if Path(str(item.fspath)).stem in LANE_B else "a"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lane = config.getoption("lane")
    if lane is None:
        return
    chosen = [item for item in items if lane_of(item) == lane]
    if len(chosen) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if lane_of(item) != lane])
        items[:] = chosen
