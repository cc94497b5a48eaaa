"""SLOs-Serve's batches bounded for arrivals: under a loose TPOT, Alg. 2 alone makes every batch
as long as that TPOT, which spends a short prompt's TTFT (the overlap schedule plans an arrival
one pass late) and makes the DP decline a prompt whose TTFT is shorter than one batch."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scheduler.core.perf_model import linear_model
from scheduler.core.policies import make_policy
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.slos_serve.arrival_bound import MIN_CHUNK_TOKENS, ArrivalBoundBudget, arrival_chunk
from scheduler.core.slos_serve.dp import TierBudget
from scheduler.core.types import EngineView, RequestView

PERF = linear_model(base_s=0.01, per_token_s=1e-4)
LOOSE = SloSpec(ttft_ms=2000, tpot_ms=150, slo_class=SloClass.LATENCY)
SHORT = SloSpec(ttft_ms=120, tpot_ms=150, slo_class=SloClass.LATENCY)


def _view() -> EngineView:
    running = [RequestView(f"c{i}", LOOSE, 0.0, 100, generated=5, first_token_time=0.2) for i in range(10)]
    return EngineView(1.0, [RequestView("short", SHORT, 1.0, 300)], running, 256, 8192, 10**6, 10**6)


def test_a_prompt_whose_ttft_is_shorter_than_one_tpot_batch_is_admitted():
    # the decoders are far ahead of their schedule: banked slack (its own test) is left out here
    bounded = make_policy("slos", perf_model=PERF, arrival_batch_share=0.5, banked_slack=False).plan(_view())
    unbounded = make_policy("slos", perf_model=PERF, arrival_batch_share=None, banked_slack=False).plan(_view())
    # one 150 ms batch does not fit in 120 ms: Alg. 2's budget alone declines the prompt
    assert unbounded.best_effort == {"short"}
    assert unbounded.chunk_size is not None and unbounded.chunk_size > 1000
    # 500 tokens alone fill 60 ms: two such batches fit, and this pass carries no more
    assert bounded.best_effort == set() and bounded.order == ["short"]
    assert bounded.chunk_size == 500
    assert bounded.batch_cap == unbounded.batch_cap  # the decoders' cap is still the TPOT's


def test_a_bounded_batch_is_shorter_and_keeps_the_tpot_stability():
    plain = TierBudget(PERF, [0.15], chunk_cap=8192)
    bound = ArrivalBoundBudget(PERF, [0.15], 500.0, chunk_cap=8192)
    for decoders in (0, 10, 200):
        a, b = plain((decoders, 0)), bound((decoders, 0))
        assert b.stable == a.stable
        if a.stable:
            assert b.prefill_budget == min(a.prefill_budget, 500.0)
            assert b.batch_time <= a.batch_time
    assert not bound((2000, 0)).stable  # decoders alone overrun the TPOT: unchanged


def test_the_chunk_follows_the_tightest_ttft_in_view():
    ttft = np.array([math.nan, 300.0, 120.0])
    assert arrival_chunk(PERF, ttft, 0.5) == 500.0
    assert arrival_chunk(PERF, ttft, None) == math.inf
    assert arrival_chunk(PERF, np.array([math.nan]), 0.5) == math.inf
    assert arrival_chunk(PERF, np.array([1.0]), 0.5) == MIN_CHUNK_TOKENS


def test_the_share_is_checked():
    with pytest.raises(ValueError, match="arrival_batch_share"):
        make_policy("slos", arrival_batch_share=0.0)
