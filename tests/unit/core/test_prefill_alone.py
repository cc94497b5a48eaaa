"""Prefill alone: a step whose prefill starts a first token runs without the decodes where their
slack allows (batch_limits.prefill_alone), on the plan path and in the simulated engine."""

from __future__ import annotations

import pytest

from scheduler.core.batch_limits import ALONE_URGENT_PASSES, STEP_MARGIN
from scheduler.core.perf_model import linear_model
from scheduler.core.plan_path import LeverModel, finalize_plan, settings_for
from scheduler.core.policies import make_policy
from scheduler.core.sim_engine import SimEngine
from scheduler.core.sim_requests import EngineConfig, SimRequest
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import RequestView, StepPlan
from tests.unit.core.test_batch_levers import PERF, _decoding, _due, _view

SLOS = settings_for(make_policy("slos"))


def _alone(view, settings=SLOS) -> bool:
    return finalize_plan(view, StepPlan(), settings, LeverModel(PERF)).prefill_alone


NOW = _due(400.0, 9) + 0.1  # four streams at 400 ms per token are then 300 ms ahead of their next one


def _newcomer(ttft_ms: float | None = 150.0, prompt: int = 50, arrival: float = NOW) -> RequestView:
    """A request that arrived now and waits for its first token (`ttft_ms` None: best effort)."""
    slo = SloSpec(ttft_ms=ttft_ms, tpot_ms=100.0, slo_class=SloClass.LATENCY) if ttft_ms is not None else SloSpec()
    return RequestView(rid="w", slo=slo, arrival=arrival, prompt_len=prompt)


def test_decodes_with_slack_let_a_first_token_at_risk_prefill_alone() -> None:
    running = [_decoding(f"r{i}", 400.0, 10) for i in range(4)]
    assert _alone(_view(running, [_newcomer()], now=NOW))
    # a first token already past its due time needs nothing of the step
    assert not _alone(_view(running, [_newcomer(arrival=NOW - 0.5)], now=NOW))
    # nor one that the mixed steps make anyway: its TTFT is more than ALONE_URGENT_PASSES of them away
    mixed_s = PERF.step_time(50, 4, 0)
    assert not _alone(_view(running, [_newcomer(ttft_ms=1000 * ALONE_URGENT_PASSES * mixed_s * 1.1)], now=NOW))
    assert _alone(_view(running, [_newcomer(ttft_ms=1000 * ALONE_URGENT_PASSES * mixed_s * 0.9)], now=NOW))


def test_a_decode_whose_next_token_the_wait_would_make_late_keeps_the_step_mixed() -> None:
    # The prefill-only step (10 ms + 50 tokens) and then the decode step (10 ms + 4) take 74 ms;
    # with the step margin a stream needs 81.4 ms to its next token.
    prefill_then_decode = PERF.step_time(50, 0, 0) + PERF.step_time(0, 4, 0)
    for slack, alone in ((prefill_then_decode * (1 + STEP_MARGIN) * 1.05, True), (prefill_then_decode, False)):
        running = [_decoding(f"r{i}", 400.0, 10) for i in range(4)]
        now = _due(400.0, 10) - slack
        view = _view(running, [_newcomer(arrival=now)], now=now)
        assert _alone(view) is alone, slack


def test_a_late_stream_constrains_nothing() -> None:
    running = [_decoding("r0", 400.0, 10), _decoding("late", 20.0, 10)]  # late's next token is past due
    assert _alone(_view(running, [_newcomer()], now=NOW))


def test_no_first_token_waiting_keeps_the_decodes_in_the_step() -> None:
    running = [_decoding(f"r{i}", 400.0, 10) for i in range(4)]
    assert not _alone(_view(running, [_newcomer(ttft_ms=None)], now=NOW))  # best effort only
    assert not _alone(_view(running, [], now=NOW))  # nothing to prefill
    assert not _alone(_view([], [_newcomer()], now=NOW))  # nothing decodes


def test_slos_prefills_alone_unless_told_not_to_and_only_under_mixed_batching() -> None:
    running = [_decoding(f"r{i}", 400.0, 10) for i in range(4)]
    view = _view(running, [_newcomer()], now=NOW)
    assert _alone(view)
    assert not _alone(view, settings_for(make_policy("slos", prefill_alone=False)))
    assert not _alone(view, settings_for(make_policy("gmax", prefill_alone=False)))  # a policy that does not ask
    assert settings_for(make_policy("gmax")).prefill_alone
    assert settings_for(make_policy("slos_oracle")).prefill_alone  # the oracle plans as its policy
    assert settings_for(make_policy("tempo")).prefill_alone
    assert not _alone(view, settings_for(make_policy("edf")))  # an ordering baseline: stock batching
    assert not _alone(view, settings_for(make_policy("slos"), mixed_batching=False))


def _first_token_and_stream_tokens(prefill_alone: bool) -> tuple[float, list[float]]:
    """Three loose streams decoding when a short latency prompt arrives, on an engine whose
    step costs 5 ms, 0.1 ms a prompt token and 4 ms a decode: (the newcomer's first token time,
    the stream's token times)."""
    perf = linear_model(base_s=0.005, per_token_s=1e-4, per_seq_s=0.004)
    policy = make_policy("slos", prefill_alone=prefill_alone)
    settings = settings_for(policy)
    engine = SimEngine(policy, perf, EngineConfig(max_running_requests=8, chunk_size=512), settings)
    loose = SloSpec(ttft_ms=500.0, tpot_ms=200.0, slo_class=SloClass.LATENCY)
    for i in range(3):
        engine.add(SimRequest(f"s{i}", loose, 0.0, prompt_len=20, output_len=40))
    tight = SloSpec(ttft_ms=60.0, tpot_ms=200.0, slo_class=SloClass.LATENCY)
    t, added, finished = 0.0, False, {}
    while True:
        if not added and t >= 0.1:
            engine.add(SimRequest("new", tight, t, prompt_len=200, output_len=2))
            added = True
        end = engine.begin_step(t)
        if end is None:
            break
        for f in engine.end_step().finished:
            finished[f.req.rid] = f.token_times
        t = end
    return finished["new"][0], finished["s0"]


def test_the_first_token_comes_sooner_and_the_streams_keep_their_tpot() -> None:
    mixed_first, _ = _first_token_and_stream_tokens(prefill_alone=False)
    alone_first, stream = _first_token_and_stream_tokens(prefill_alone=True)
    # the prefill step without the three decodes is shorter by their 4 ms each and their tokens
    assert alone_first == pytest.approx(mixed_first - 3 * (0.004 + 1e-4), abs=1e-6)
    due = [0.5 + i * 0.2 for i in range(len(stream))]  # deadline-based TPOT: token i by ttft + i tpot
    assert all(t <= d for t, d in zip(stream, due, strict=True))
