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
        """A step whose CPU work takes `s` seconds from now: returns when it began."""
        started = self.t
        self.t += s
        return started


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
    assert report.mean_overrun_share == pytest.approx(0.005 / target, rel=0.05)
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


def test_the_host_works_while_the_card_runs_and_results_wait_for_the_card() -> None:
    """SGLang's overlap loop: step 2 is built while step 1 is on the card, step 1's results are
    used while step 2 is; each step still lasts its target, back to back, none late."""
    clock = TickingClock()
    pacer = _pacer(clock)
    target = pacer.target_s(0, 16, 16_000)
    first = pacer.launch("one", clock.work(0.002), target, follows_step=False)
    card_free = clock.t - 0.002 + target
    assert pacer.launch("two", clock.work(0.002), target, follows_step=True) == pytest.approx(target)
    pacer.wait("one")
    assert clock.t == pytest.approx(card_free, abs=1e-4)  # step 1's results, as the card finished it
    pacer.wait("two")
    assert clock.t == pytest.approx(card_free + target, abs=1e-4)  # step 2 ran right after it
    report = pacer.report()
    assert first == pytest.approx(target) and report.late_steps == 0 and report.host_gap_share == 0.0


def test_host_time_the_card_could_not_hide_is_reported_outside_the_steps() -> None:
    clock = TickingClock()
    pacer = _pacer(clock)
    target = pacer.target_s(0, 16, 16_000)
    pacer.finish(clock.work(0.001), target)
    clock.sleep(target)  # the host took a whole step's time before launching the next
    pacer.finish(clock.work(0.001), target, follows_step=True)
    report = pacer.report()
    assert report.late_steps == 0  # the step itself kept its time
    assert report.host_gap_share == pytest.approx(0.5, abs=0.01)
    clock.sleep(10.0)
    pacer.launch("after idle", clock.work(0.001), target, follows_step=False)  # idle time is no gap
    assert pacer.report().host_gap_share == pytest.approx(0.5, abs=0.01)


def test_the_card_runs_at_most_one_step_ahead_of_its_results() -> None:
    clock = TickingClock()
    pacer = _pacer(clock)
    target = pacer.target_s(0, 1, 500)
    began = clock.t
    for key in range(3):  # a loop that never waits: the third launch waits for the first step
        pacer.launch(key, clock.work(0.0), target, follows_step=True)
    assert clock.t == pytest.approx(began + target, abs=1e-4)
    pacer.wait(2)
    assert clock.t == pytest.approx(began + 3 * target, abs=1e-4)
