"""The pacer waits out each step's target and counts, never hides, the steps the CPU overran."""

from __future__ import annotations

import pytest

from scheduler.core.pacing import Pacer, SlowedPerfModel
from scheduler.core.perf_model import load_perf_model, profile_path


class TickingClock:
    """Virtual time: every read advances 10 µs (so the pacer's final spin ends); sleep jumps."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        self.t += 1e-5
        return self.t

    def sleep(self, s: float) -> None:
        assert s >= 0
        self.t += s

    def work(self, s: float) -> float:
        """A step that began `s` seconds ago."""
        return self.t - s


def _pacer(clock: TickingClock) -> Pacer:
    return Pacer(load_perf_model(profile_path("h100"), kind="table"), clock=clock, sleep=clock.sleep)


def test_a_fast_step_is_stretched_to_the_profiles_time() -> None:
    clock = TickingClock()
    pacer = _pacer(clock)
    target = pacer.target_s(0, 32, 32 * 1000)
    assert 0.005 < target < 0.05  # an H100 decode step of an 8B model at batch 32
    observed = pacer.finish(clock.work(0.002), target)
    assert observed == pytest.approx(target, abs=1e-4)
    report = pacer.report()
    assert report.late_steps == 0 and report.late_share == 0.0
    assert report.median_abs_error is not None and report.median_abs_error < 0.01


def test_a_step_the_cpu_overran_is_reported_not_hidden() -> None:
    clock = TickingClock()
    pacer = _pacer(clock)
    target = pacer.target_s(0, 1, 500)
    for _ in range(3):
        pacer.finish(clock.work(target / 2), target)
    observed = pacer.finish(clock.work(target + 0.005), target)
    assert observed == pytest.approx(target + 0.005, abs=1e-4)
    report = pacer.report()
    assert report.steps == 4 and report.late_steps == 1 and report.late_share == 0.25
    assert report.mean_overrun_ms == pytest.approx(5.0, abs=0.1)
    assert report.p95_abs_error == pytest.approx(0.005 / target, rel=0.05)


def test_bigger_batches_and_slower_gpus_get_longer_targets() -> None:
    clock = TickingClock()
    h100 = _pacer(clock)
    a40 = Pacer(load_perf_model(profile_path("a40"), kind="table"), clock=clock, sleep=clock.sleep)
    assert h100.target_s(0, 64, 64 * 1000) > h100.target_s(0, 1, 1000)
    assert h100.target_s(2048, 0, 2048) > h100.target_s(128, 0, 128)
    assert a40.target_s(0, 32, 32000) > h100.target_s(0, 32, 32000)


def test_a_slowed_card_keeps_its_shape_in_dilated_time() -> None:
    base = load_perf_model(profile_path("h100"), kind="table")
    slowed = SlowedPerfModel(base, 3.0)
    assert slowed.step_time(0, 16, 16_000) == pytest.approx(3.0 * base.step_time(0, 16, 16_000))
    budget = 3.0 * base.step_time(0, 40, 40 * 1000)
    assert slowed.max_batch_within(budget, 1000) == base.max_batch_within(budget / 3.0, 1000) >= 40
    with pytest.raises(ValueError):
        SlowedPerfModel(base, 0.5)


def test_a_step_without_a_target_is_counted_as_unpaced() -> None:
    clock = TickingClock()
    pacer = _pacer(clock)
    pacer.finish(clock.work(0.003), 0.0)
    report = pacer.report()
    assert report.steps == 0 and report.unpaced_steps == 1 and report.late_steps == 0
