"""A policy's own per-step token budget (GMAX's `chunk_cap`) over the perf model's chunk."""

from __future__ import annotations

import pytest

from scheduler.core.plan_path import PREFILL, LeverModel, PlanSettings, finalize_plan, settings_for
from scheduler.core.policies import make_policy
from scheduler.core.registry import ParamError
from scheduler.core.types import StepPlan
from tests.unit.core.test_batch_levers import PERF, _req, _view

STARTUP = 2048


def test_the_policies_on_vllms_chunked_prefill_and_their_oracles_carry_its_budget() -> None:
    for name in ("gmax", "gmax_oracle", "tempo", "tempo_oracle"):
        settings = settings_for(make_policy(name))
        assert settings.chunk_step_ratio == pytest.approx(2.75) and settings.chunk_cap is None, name
    assert settings_for(make_policy("gmax", chunk_cap=1024)).chunk_cap == 1024
    for name in ("gmax", "tempo"):
        assert settings_for(make_policy(name, chunk_step_ratio=0)).chunk_step_ratio is None, name  # 0: off
    # slos sizes its own prefill budget (its DP); the baselines reorder a stock engine
    for name in ("fcfs", "edf", "sjf", "slos"):
        settings = settings_for(make_policy(name))
        assert settings.chunk_cap is None and settings.chunk_step_ratio is None, name


def _streams(n: int) -> list:
    return [_req(f"r{i}", generated=5, first_token_time=0.5, prompt=100) for i in range(n)]


@pytest.mark.parametrize("running", [0, 4, 32])
def test_a_step_ratio_budget_is_the_largest_chunk_within_that_many_decode_steps(running: int) -> None:
    # 10 ms + 1 ms a token: best-effort streams, so no lever of the perf model's sizes a chunk
    view = _view(running=_streams(running), waiting=[_req("w", prompt=6000, ttft_ms=None)], chunk=STARTUP)
    kv = 105 * running
    budget = 3.0 * PERF.step_time(0, max(running, 1), kv)  # one decode's step when none runs
    chunk = finalize_plan(view, StepPlan(), PlanSettings(chunk_step_ratio=3.0), LeverModel(PERF)).chunk_size
    assert chunk is not None and chunk < STARTUP
    assert PERF.step_time(chunk, running, kv + chunk) <= budget < PERF.step_time(chunk + 1, running, kv + chunk + 1)
    wider = finalize_plan(view, StepPlan(), PlanSettings(chunk_step_ratio=6.0), LeverModel(PERF)).chunk_size
    assert wider > chunk


def test_tempos_finished_plan_prefills_within_vllms_budget_unless_turned_off() -> None:
    # best-effort streams and a best-effort prompt: nothing but the step budget sizes the chunk
    view = _view(running=_streams(4), waiting=[_req("w", prompt=6000, ttft_ms=None)], chunk=STARTUP)
    tempo = make_policy("tempo", perf_model=PERF)
    chunk = finalize_plan(view, tempo.plan(view), settings_for(tempo), LeverModel(PERF)).chunk_size
    assert chunk is not None and chunk < STARTUP
    kv = 105 * 4
    assert PERF.step_time(chunk, 4, kv + chunk) <= 2.75 * PERF.step_time(0, 4, kv)
    off = make_policy("tempo", perf_model=PERF, chunk_step_ratio=0)
    assert finalize_plan(view, off.plan(view), settings_for(off), LeverModel(PERF)).chunk_size is None


def test_a_step_ratio_budget_waits_for_a_trusted_perf_model() -> None:
    view = _view(running=_streams(4), waiting=[_req("w", prompt=6000, ttft_ms=None)], chunk=STARTUP)
    assert finalize_plan(view, StepPlan(), PlanSettings(chunk_step_ratio=3.0), None).chunk_size is None


@pytest.mark.parametrize("name", ["gmax", "tempo"])
def test_a_negative_step_ratio_is_refused_by_name(name: str) -> None:
    with pytest.raises(ParamError, match="chunk_step_ratio"):
        make_policy(name, chunk_step_ratio=-1.0)


def test_a_budget_below_the_smallest_useful_chunk_is_refused_by_name() -> None:
    with pytest.raises(ParamError, match="chunk_cap"):
        make_policy("gmax", chunk_cap=8)


def test_the_budget_caps_the_chunk_when_nothing_running_sizes_one() -> None:
    view = _view(running=[], waiting=[_req("w", prompt=6000)], chunk=STARTUP)
    capped = PlanSettings(chunk_cap=512)
    assert finalize_plan(view, StepPlan(), capped, LeverModel(PERF)).chunk_size == 512
    assert finalize_plan(view, StepPlan(), PlanSettings(), LeverModel(PERF)).chunk_size is None  # SGLang's own
    # a plan's own chunk is capped too
    assert finalize_plan(view, StepPlan(chunk_size=1500), capped, LeverModel(PERF)).chunk_size == 512


def test_a_smaller_chunk_the_running_requests_need_is_kept() -> None:
    # 10 ms + 1 ms/token: the stream's next token is due in 50 ms, so about 30 tokens of prefill fit
    running = [_req("r", tpot_ms=100.0, ttft_ms=1_000.0, generated=5, first_token_time=0.5, prompt=100)]
    loose = _req("w", prompt=6000, ttft_ms=600_000.0)  # needs only a few tokens a step for its TTFT
    view = _view(running=running, waiting=[loose], chunk=STARTUP, now=1.45)
    derived = finalize_plan(view, StepPlan(), PlanSettings(), LeverModel(PERF)).chunk_size
    assert derived is not None and derived < 512
    assert finalize_plan(view, StepPlan(), PlanSettings(chunk_cap=512), LeverModel(PERF)).chunk_size == derived


def test_no_budget_where_chunking_is_off_or_on_a_prefill_worker() -> None:
    waiting = [_req("w", prompt=6000)]
    off = _view(running=[], waiting=waiting, chunk=0)
    assert finalize_plan(off, StepPlan(), PlanSettings(chunk_cap=512), LeverModel(PERF)).chunk_size is None
    pd = _view(running=[], waiting=waiting, chunk=STARTUP)
    prefill_worker = PlanSettings(chunk_cap=512, role=PREFILL)  # its budget is dynamic chunking's
    assert finalize_plan(pd, StepPlan(), prefill_worker, LeverModel(PERF)).chunk_size is None


def test_the_budget_never_raises_a_startup_chunk_below_it() -> None:
    view = _view(running=[], waiting=[_req("w", prompt=6000)], chunk=256)
    assert finalize_plan(view, StepPlan(), PlanSettings(chunk_cap=512), LeverModel(PERF)).chunk_size == 256
