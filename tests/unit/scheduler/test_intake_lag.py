"""The edge-to-scheduler lag the status reports: quantiles of recent requests, the run's maximum."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from scheduler.components.intake_lag import IntakeLag
from scheduler.components.request_state import injected_arrival
from wire import ARRIVAL_PARAM


def test_no_stamped_request_reports_nothing() -> None:
    lag = IntakeLag()
    lag.record(None, 10.0)
    assert lag.summary() is None


def test_quantiles_cover_the_recent_window_and_the_maximum_the_whole_run() -> None:
    lag = IntakeLag(window=4)
    lag.record(100.0, 100.9)  # 900 ms, then pushed out of the window
    for ms in (10, 20, 30, 40):
        lag.record(100.0, 100.0 + ms / 1000.0)
    s = lag.summary()
    assert s is not None
    assert s["requests"] == 5 and s["max_ms"] == 900.0
    assert s["p50_ms"] == 25.0 and s["p99_ms"] < 41.0  # the 900 ms request left the window


def test_a_clock_rounding_below_zero_counts_as_no_lag() -> None:
    lag = IntakeLag()
    lag.record(100.0, 99.9999)
    s = lag.summary()
    assert s is not None and (s["requests"], s["p50_ms"], s["max_ms"]) == (1, 0.0, 0.0)


def test_waiting_for_the_next_read_is_the_engines_missing_one_is_transit() -> None:
    lag = IntakeLag()
    lag.loop(10.0)
    lag.loop(10.2)
    lag.record(10.1, 10.2)  # stamped after the read at 10.0: waited for this one only
    lag.loop(10.4)
    lag.record(10.25, 10.4)  # stamped after the read at 10.2: waited for this one
    lag.record(10.15, 10.4)  # stamped before the read at 10.2 and missed it by 50 ms
    s = lag.summary()
    assert s is not None
    assert s["missed_loop_share"] == pytest.approx(1 / 3, abs=1e-3)
    assert s["missed_p99_ms"] == pytest.approx(50.0, abs=2.0) and s["missed_p50_ms"] == 0.0
    assert s["max_ms"] == pytest.approx(250.0)


def test_the_arrival_is_read_from_the_injected_params_only_when_a_number() -> None:
    def params(value: object) -> SimpleNamespace:
        return SimpleNamespace(custom_params={ARRIVAL_PARAM: value})

    assert injected_arrival(params(1234.5)) == 1234.5
    assert injected_arrival(params(7)) == 7.0
    assert injected_arrival(params(True)) is None
    assert injected_arrival(params("soon")) is None
    assert injected_arrival(SimpleNamespace(custom_params=None)) is None
    assert injected_arrival(SimpleNamespace()) is None
