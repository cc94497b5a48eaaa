"""The edge-to-scheduler lag the status reports: quantiles of recent requests, the run's maximum."""

from __future__ import annotations

from types import SimpleNamespace

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
    assert lag.summary() == {"requests": 1, "p50_ms": 0.0, "p90_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}


def test_the_arrival_is_read_from_the_injected_params_only_when_a_number() -> None:
    def params(value: object) -> SimpleNamespace:
        return SimpleNamespace(custom_params={ARRIVAL_PARAM: value})

    assert injected_arrival(params(1234.5)) == 1234.5
    assert injected_arrival(params(7)) == 7.0
    assert injected_arrival(params(True)) is None
    assert injected_arrival(params("soon")) is None
    assert injected_arrival(SimpleNamespace(custom_params=None)) is None
    assert injected_arrival(SimpleNamespace()) is None
