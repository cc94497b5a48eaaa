"""GPU pass timing on a fake event clock: a fake GPU runs each stream's work in order, behind the
host's launch, so a pass's launch (host time) and its GPU time differ as on a real card.

The adapter's run_batch and process_batch_result are exercised over a stand-in engine whose
run_batch only launches (as SGLang's does on a GPU) and whose result processing waits for the
pass's copy-done, as SGLang's does."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from scheduler.components.step_timer import GpuStepTimer
from tests.unit.scheduler._stand_in_engine import StandInEngine, slo_scheduler

FORWARD = "forward-stream"


class FakeGpu:
    """Each stream's queued work ends at `tail[stream]`; new work starts once the stream is free
    and the host has launched it. The host clock moves when the host works or waits."""

    def __init__(self) -> None:
        self.host = 0.0
        self.tail: dict[str, float] = {}

    def launch(self, stream: str, gpu_s: float, host_s: float = 0.001) -> None:
        self.host += host_s  # the launch itself costs host time
        begin = max(self.tail.get(stream, 0.0), self.host)
        self.tail[stream] = begin + gpu_s

    def event(self) -> FakeEvent:
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.at: float | None = None  # GPU time the stream reaches the event

    def record(self, stream: Any = None) -> None:
        self.at = max(self.gpu.tail.get(stream, 0.0), self.gpu.host)

    def synchronize(self) -> None:
        assert self.at is not None
        self.gpu.host = max(self.gpu.host, self.at)

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at is not None and end.at is not None
        if self.gpu.host < end.at:  # torch raises on an event the GPU has not reached
            raise RuntimeError("event not completed")
        return 1000.0 * (end.at - self.at)


def _timer(gpu: FakeGpu) -> GpuStepTimer:
    return GpuStepTimer(gpu.event, lambda: FORWARD)


def test_a_pass_is_its_time_on_the_stream_not_its_launch() -> None:
    gpu = FakeGpu()
    timer = _timer(gpu)
    result = object()
    bracket = timer.start()
    gpu.launch(FORWARD, gpu_s=0.020)  # run_batch returns after 1 ms of host time
    timer.stop(bracket, result, (0, 8, 1024), 0)
    assert gpu.host == pytest.approx(0.001)
    gpu.host = 0.025  # the result is processed later (copy-done waited)
    timed = timer.read(result)
    assert timed is not None
    # the idle stream waited 1 ms for the launch: part of the pass, as on a card its host keeps waiting
    assert timed.seconds == pytest.approx(0.021)
    assert timed.shape == (0, 8, 1024)


def test_with_overlap_the_next_launch_neither_delays_nor_adds_to_a_pass() -> None:
    """SGLang's overlap loop launches pass 2 before it processes pass 1's result."""
    gpu = FakeGpu()
    timer = _timer(gpu)
    first, second = object(), object()
    b1 = timer.start()
    gpu.launch(FORWARD, gpu_s=0.020)
    timer.stop(b1, first, (0, 4, 512), 0)
    b2 = timer.start()  # recorded behind pass 1 on the same stream: starts when pass 1 ends
    gpu.launch(FORWARD, gpu_s=0.030)
    timer.stop(b2, second, (128, 4, 640), 0)
    gpu.host = 0.022  # pass 1's copy-done reached; pass 2 still running
    t1 = timer.read(first)
    assert t1 is not None and t1.seconds == pytest.approx(0.021)
    assert gpu.host == pytest.approx(0.022)  # reading pass 1 did not wait for pass 2
    gpu.host = 0.051
    t2 = timer.read(second)
    assert t2 is not None and t2.seconds == pytest.approx(0.030)


def test_results_never_processed_are_forgotten() -> None:
    gpu = FakeGpu()
    timer = GpuStepTimer(gpu.event, lambda: FORWARD, max_pending=2)
    keys = [object() for _ in range(3)]
    for key in keys:
        bracket = timer.start()
        gpu.launch(FORWARD, 0.01)
        timer.stop(bracket, key, (0, 1, 1), 0)
    gpu.host = 1.0
    assert timer.read(keys[0]) is None
    assert timer.read(keys[2]) is not None
    assert timer.status()["untimed_passes"] == 1


# ---- the adapter: run_batch launches, process_batch_result learns ---------------------------------


class _Mode:
    def is_decode(self) -> bool:
        return True

    def is_extend(self) -> bool:
        return False


def _decode_batch(n: int) -> Any:
    reqs = [SimpleNamespace(origin_input_ids=[0] * 100, output_ids=[0] * 10, finished=lambda: False) for _ in range(n)]
    return SimpleNamespace(forward_mode=_Mode(), reqs=reqs)


def _gpu_scheduler(gpu: FakeGpu, gpu_s: float, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The adapter over an engine whose run_batch launches `gpu_s` of work and whose result
    processing waits for the pass's copy-done (recorded after the forward, as SGLang does)."""

    def run_batch(self: Any, batch: Any) -> Any:
        gpu.launch(FORWARD, gpu_s)
        copy_done = gpu.event()
        copy_done.record(FORWARD)
        return SimpleNamespace(copy_done=copy_done)

    def process_batch_result(self: Any, batch: Any, result: Any) -> None:
        result.copy_done.synchronize()

    monkeypatch.setattr(StandInEngine, "run_batch", run_batch, raising=False)
    monkeypatch.setattr(StandInEngine, "process_batch_result", process_batch_result)
    s = slo_scheduler(policy="edf")
    s.slo.meter.timing_ok = False  # what _slo_bind_engine sets on a CUDA device
    s.slo.meter.gpu_timer = _timer(gpu)
    return s


def test_the_adapter_teaches_the_perf_model_the_gpu_time(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu()
    s = _gpu_scheduler(gpu, 0.040, monkeypatch)
    batch = _decode_batch(8)
    result = s.run_batch(batch)
    assert s.slo.perf.observed == 0  # nothing learned at launch: the pass is still running
    s.process_batch_result(batch, result)
    assert s.slo.perf.observed == 1
    assert s.slo.perf.samples[-1].time_s == pytest.approx(0.041)  # the pass on the GPU, not the 1 ms launch
    assert s.slo.perf.samples[-1].decode_reqs == 8
    assert s.slo.meter.perf_status()["timing"] == "cuda_events"


def test_an_emulated_card_on_a_gpu_is_paced_after_the_pass_and_learned_once(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu()
    s = _gpu_scheduler(gpu, 0.010, monkeypatch)
    meter = s.slo.meter
    meter.pacer = SimpleNamespace(wait=lambda key: None)  # the pacing itself is the pacer's (tested with it)
    paced_at: list[float] = []

    def after_step(shape: tuple[int, int, int], spec_steps: int, started: float, **pacing: Any) -> None:
        paced_at.append(gpu.host)
        meter.learn(shape, spec_steps, 0.050)  # what pacing to a 50 ms card learns

    monkeypatch.setattr(meter, "after_step", after_step)
    batch = _decode_batch(2)
    result = s.run_batch(batch)
    assert paced_at == [pytest.approx(0.011)]  # the pacer starts from the GPU's end, not the launch
    s.process_batch_result(batch, result)
    assert s.slo.perf.observed == 1  # the paced time only, not the GPU's 10 ms as well
    assert s.slo.perf.samples[-1].time_s == pytest.approx(0.050)
