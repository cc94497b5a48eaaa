"""The adapter's admission: the queue bound (requests and prompt tokens) answering 429 with a
Retry-After from the queue's predicted drain, in every disaggregation mode and under every
policy, and the plan path's drops reaching the HTTP edge with their reason and wait."""

from __future__ import annotations

import pytest
from sglang.srt.disaggregation.utils import DisaggregationMode

from scheduler.config import SloServerConfig
from scheduler.core.perf_model import constant_model
from scheduler.core.slo import SloClass, SloSpec
from tests.unit.scheduler._stand_in_engine import StandInReq, StandInSloScheduler, slo_scheduler
from wire import PREDICTED_WAIT_KEY, QUEUE_FULL, RETRY_AFTER_KEY, SHED_CLASS_KEY, SHED_REASON_KEY, SLO_INFEASIBLE

STEP_S = 0.5


def _scheduler(mode=DisaggregationMode.NULL, policy="edf", max_requests=None, max_tokens=None) -> StandInSloScheduler:
    config = SloServerConfig(policy=policy, max_queued_tokens=max_tokens)
    s = slo_scheduler(mode, policy, startup_chunk=100, perf=constant_model(STEP_S), config=config)
    s.max_queued_requests = max_requests
    return s


def _queued(s: StandInSloScheduler) -> list[str]:
    return [r.rid for r in s._slo_queued()]


def _shed(s: StandInSloScheduler) -> dict[str, dict]:
    return {out.rid: out.finished_reason for out in s.sent}


@pytest.mark.parametrize("mode", [DisaggregationMode.NULL, DisaggregationMode.PREFILL, DisaggregationMode.DECODE])
@pytest.mark.parametrize("policy", ["fcfs", "edf", "slos"])
def test_a_full_queue_answers_429_with_a_computed_retry_after(mode, policy) -> None:
    s = _scheduler(mode, policy, max_requests=3)
    for i in range(5):
        s._add_request_to_queue(StandInReq(f"r{i}", prompt=100, ttft_ms=60_000))
    assert _queued(s) == ["r0", "r1", "r2"]
    shed = _shed(s)
    assert set(shed) == {"r3", "r4"}
    reason = shed["r3"]
    assert reason["status_code"] == 429 and reason[SHED_REASON_KEY] == QUEUE_FULL
    assert reason[SHED_CLASS_KEY] == "latency"
    if mode == DisaggregationMode.NULL:  # the waiting queue's drain: 3 prefill steps of 0.5 s ahead
        assert reason[PREDICTED_WAIT_KEY] == pytest.approx(1500.0)
        assert reason[RETRY_AFTER_KEY] == 2
    assert s.slo.counters.shed[QUEUE_FULL] == 2
    assert s.released == ["r3", "r4"]  # their cache state too, as SGLang releases a refused request's


def test_the_token_bound_counts_prompt_tokens_but_takes_one_big_request_alone() -> None:
    s = _scheduler(max_tokens=250)
    s._add_request_to_queue(StandInReq("big", prompt=1000, ttft_ms=60_000))  # alone: it could never run otherwise
    s._add_request_to_queue(StandInReq("small", prompt=10, ttft_ms=60_000))
    assert _queued(s) == ["big"] and set(_shed(s)) == {"small"}
    t = _scheduler(max_tokens=250)
    for i in range(3):
        t._add_request_to_queue(StandInReq(f"r{i}", prompt=100, ttft_ms=60_000))
    assert _queued(t) == ["r0", "r1"]


def test_a_retracted_request_is_never_refused() -> None:
    s = _scheduler(max_requests=1)
    s._add_request_to_queue(StandInReq("a", prompt=10, ttft_ms=60_000))
    back = StandInReq("back", prompt=10, ttft_ms=60_000)
    back.output_ids = [1, 2]
    s._add_request_to_queue(back, is_retracted=True)
    assert _queued(s) == ["a", "back"] and not s.sent


def test_no_bound_no_refusal() -> None:
    s = _scheduler()
    for i in range(50):
        s._add_request_to_queue(StandInReq(f"r{i}", prompt=100, ttft_ms=60_000))
    assert len(_queued(s)) == 50 and not s.sent


def test_an_infeasible_request_is_dropped_with_its_wait_and_class() -> None:
    s = _scheduler(policy="fcfs")
    hog = StandInReq("hog", prompt=1000, spec=SloSpec())
    doomed = StandInReq(
        "doomed", prompt=10, spec=SloSpec(ttft_ms=100.0, slo_class=SloClass.LATENCY, on_infeasible="reject")
    )
    s.waiting_queue = [hog, doomed]
    s.get_new_batch_prefill(s.running_batch)
    reason = _shed(s)["doomed"]
    assert reason["status_code"] == 503 and reason[SHED_REASON_KEY] == SLO_INFEASIBLE
    assert reason[PREDICTED_WAIT_KEY] == pytest.approx(10 * STEP_S * 1000)  # 1000 tokens ahead, 100 per step
    assert reason[RETRY_AFTER_KEY] == 5
    status = s.slo_status_snapshot()
    assert status["shed"] == {SLO_INFEASIBLE: 1}


@pytest.mark.parametrize(
    ("policy", "params", "chunk"),
    [("gmax", {"chunk_cap": 512}, 512), ("gmax", {}, 2048), ("fcfs", {}, 2048)],
)
def test_a_policys_token_budget_is_the_chunk_sglang_prefills(policy, params, chunk) -> None:
    # GMAX's per-step budget reaches SGLang's PrefillAdder; stock fcfs keeps the start-up chunk.
    # By default the budget is a step time, which a constant step time never binds.
    config = SloServerConfig(policy=policy, policy_params=params)
    s = slo_scheduler(DisaggregationMode.NULL, policy, startup_chunk=2048, perf=constant_model(STEP_S), config=config)
    s.waiting_queue = [StandInReq("long", prompt=4000, ttft_ms=600_000)]
    batch = s.get_new_batch_prefill(s.running_batch).batch_to_run
    assert [r.rid for r in batch.reqs] == ["long"] and s.chunked_req is not None
    assert s.chunked_req.extend_len == chunk
