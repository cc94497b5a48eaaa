"""The adapter on PD disaggregation workers: dynamic chunking on prefill, the SLO batch cap on decode.

No engine runs: the adapter's overrides sit on a stand-in engine (_stand_in_engine.py) whose
prefill admission is SGLang's own loop around SGLang's real `PrefillAdder`, so the budgets the
adapter sets are judged by SGLang's own arithmetic. On decode it is `get_new_prebuilt_batch`'s
admission bound, min(pool size, max_running_requests).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from sglang.srt.disaggregation.utils import DisaggregationMode

from scheduler.components import pd_chunking
from scheduler.core.perf_model import RooflinePerfModel, RooflineTerm
from tests.unit.scheduler._stand_in_engine import StandInEngine, StandInReq, StandInSloScheduler, slo_scheduler

PERF = RooflinePerfModel([RooflineTerm(k_tokens=1e-3, k_spec=0.0, k_kv=0.0, b=0.01)])  # 10 ms + 1 ms/token
B = 1024


def _Req(rid: str, prompt: int, ttft_ms: float, tpot_ms: float = 100.0, cached: int = 0) -> StandInReq:
    return StandInReq(rid, prompt, ttft_ms=ttft_ms, tpot_ms=tpot_ms, cached=cached)


def _scheduler(mode: DisaggregationMode, policy: str = "edf", startup_chunk: int | None = 2 * B) -> StandInSloScheduler:
    return slo_scheduler(mode, policy, startup_chunk, perf=PERF)


# ---- PD prefill: dynamic chunking ------------------------------------------------------------------


def test_a_prefill_worker_started_at_2b_runs_normal_passes_at_b() -> None:
    s = _scheduler(DisaggregationMode.PREFILL)
    assert (s.slo.started.startup_chunk, s.slo.started.chunk_budget, s.chunked_prefill_size) == (2 * B, B, B)
    assert s._slo_view(s.running_batch).chunk_size == B


def test_a_lowered_chunk_does_not_lower_the_next_views_limit() -> None:
    # mixed batching: the TPOT lever lowers the chunk
    s = slo_scheduler(DisaggregationMode.NULL, startup_chunk=2 * B, mixed=True, perf=PERF)
    s.running_batch = SimpleNamespace(reqs=[_decoding(f"r{i}", tpot_ms=15) for i in range(3)])
    s.slo.clock.set(1.0)  # their next token is due 15 ms from now (TTFT 1 s, token 0 on time)
    s.waiting_queue = [_Req("w", 100, ttft_ms=60_000, tpot_ms=15)]
    s.get_new_batch_prefill(s.running_batch)
    assert s.chunked_prefill_size < 2 * B  # this pass's chunk
    assert s._slo_view(s.running_batch).chunk_size == 2 * B  # the next plan may raise it again


@pytest.mark.parametrize(
    ("mode", "policy"),
    [(DisaggregationMode.PREFILL, "fcfs"), (DisaggregationMode.NULL, "edf"), (DisaggregationMode.DECODE, "edf")],
)
def test_only_slo_policies_on_prefill_workers_chunk_dynamically(mode: DisaggregationMode, policy: str) -> None:
    s = _scheduler(mode, policy)
    assert s.slo.chunker is None
    assert s.slo.started.chunk_budget == s.chunked_prefill_size == 2 * B


def test_the_most_urgent_request_is_finished_whole_and_alone() -> None:
    s = _scheduler(DisaggregationMode.PREFILL)
    small, big = _Req("small", 10, ttft_ms=60_000), _Req("big", 1500, ttft_ms=1_000)
    s.waiting_queue = [small, big]  # EDF puts big (tighter TTFT) first

    plan = s.get_new_batch_prefill(s.running_batch)

    assert [r.rid for r in plan.batch_to_run.reqs] == ["big"]
    assert big.extend_end == 1500 and s.chunked_req is None  # all 1500 tokens, > max_prefill_tokens
    assert s.seen_passes == [(1500, 1)]  # the step's budget, and nothing else admitted
    assert [r.rid for r in s.waiting_queue] == ["small"]
    assert (s.chunked_prefill_size, s.slo.pass_state.applied.solo_pass) == (B, False)  # restored for the next pass
    assert (s.slo.chunker.whole_finish_passes, s.slo.chunker.finished_whole) == (1, 1)

    plan = s.get_new_batch_prefill(s.running_batch)
    assert [r.rid for r in plan.batch_to_run.reqs] == ["small"] and s.seen_passes[-1] == (B, None)


def test_a_short_head_leaves_the_budget_to_others() -> None:
    s = _scheduler(DisaggregationMode.PREFILL)
    s.max_prefill_tokens = 16384  # SGLang's default (512 would stop admission after "a")
    s.waiting_queue = [_Req("a", 600, ttft_ms=1_000), _Req("b", 600, ttft_ms=2_000)]
    plan = s.get_new_batch_prefill(s.running_batch)
    assert [r.rid for r in plan.batch_to_run.reqs] == ["a", "b"]
    assert s.chunked_req is plan.batch_to_run.reqs[1] and s.chunked_req.extend_end == B - 600
    assert s.seen_passes == [(B, None)] and s.slo.chunker.whole_finish_passes == 0


def test_a_long_prompt_takes_one_step_fewer_than_strict_chunks() -> None:
    s = _scheduler(DisaggregationMode.PREFILL)
    long = _Req("long", 3000, ttft_ms=1_000)
    s.waiting_queue = [long, _Req("next", 10, ttft_ms=5_000)]
    chunks = []
    while s.chunked_req is not None or long in s.waiting_queue:
        plan = s.get_new_batch_prefill(s.running_batch)
        chunks.append([(r.rid, r.extend_len) for r in plan.batch_to_run.reqs])
        if s.chunked_req is not None:
            s.chunked_req.finish_chunk()
    # 3000 = 1024 + 1976 (the rest < 2B, whole and alone); strict chunks would need 1024+1024+952.
    assert chunks == [[("long", B)], [("long", 3000 - B)]]
    assert (s.slo.chunker.whole_finish_passes, s.slo.chunker.finished_whole) == (1, 1)
    assert [r.rid for r in s.waiting_queue] == ["next"]


def test_the_chunked_request_is_judged_by_what_it_has_left() -> None:
    s = _scheduler(DisaggregationMode.PREFILL)
    chunked = _Req("chunked", 2200, ttft_ms=1_000, cached=1000)  # 1200 left: B < 1200 < 2B
    s.chunked_req, s.waiting_queue = chunked, [_Req("w", 10, ttft_ms=500)]
    plan = s.get_new_batch_prefill(s.running_batch)
    assert [r.rid for r in plan.batch_to_run.reqs] == ["chunked"]
    assert chunked.extend_len == 1200 and s.chunked_req is None and s.slo.chunker.finished_whole == 1


def test_a_failing_rule_falls_back_to_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("policy bug")

    monkeypatch.setattr(pd_chunking, "dynamic_chunk", broken)
    s = _scheduler(DisaggregationMode.PREFILL)
    s.waiting_queue = [_Req("big", 1500, ttft_ms=1_000)]
    plan = s.get_new_batch_prefill(s.running_batch)
    assert plan.batch_to_run.reqs[0].extend_len == B
    assert s.slo.planner.errors == 1 and s.chunked_prefill_size == B


def test_a_queue_timeout_on_a_prefill_worker_frees_the_metadata_buffer() -> None:
    s = _scheduler(DisaggregationMode.PREFILL)
    freed: list[int] = []
    s.req_to_metadata_buffer_idx_allocator = SimpleNamespace(free=freed.append)
    req = _Req("late", 100, ttft_ms=1_000)
    req.metadata_buffer_index, req.pending_bootstrap = 7, False
    req.sampling_params.custom_params["slo"]["max_queue_ms"] = 500.0
    s.slo.clock.set(1.0)  # it arrived at 0.0: past its max_queue_ms
    s.waiting_queue = [req]
    s.get_new_batch_prefill(s.running_batch)
    assert freed == [7] and req.metadata_buffer_index == -1 and not s.waiting_queue
    assert s.released == ["late"]  # its cache handle too, as SGLang's abort of a queued request
    assert [out.finished_reason["message"] for out in s.sent] == ["slo_queue_timeout"]


# ---- PD decode: the SLO running-batch cap ----------------------------------------------------------


def _decoding(rid: str, tpot_ms: float, ttft_ms: float = 1_000) -> _Req:
    req = _Req(rid, 100, ttft_ms=ttft_ms, tpot_ms=tpot_ms)
    req.output_ids = [1]  # the first token came from the prefill worker
    return req


def _on_pace(rid: str, tpot_ms: float) -> StandInReq:
    """A transferred request with no slack banked: its first token was due at the clock's 0.0, so
    the next is due one TPOT from now (deadline-based admission lends only banked slack)."""
    req = StandInReq(rid, 100, ttft_ms=50_000, tpot_ms=tpot_ms, arrival=-50.0)
    req.output_ids = [1]
    return req


def _decode_worker(policy: str = "edf") -> StandInSloScheduler:
    s = _scheduler(DisaggregationMode.DECODE, policy)
    s.running_batch = SimpleNamespace(reqs=[_decoding(f"r{i}", tpot_ms=1_000) for i in range(4)])
    return s


def test_a_tight_tpot_caps_admission_on_a_decode_worker() -> None:
    s = _decode_worker()
    # One waiting request needs 20 ms per token: 10 ms + 1 ms/request allows 10 running.
    s.waiting_queue = [_decoding(f"w{i}", tpot_ms=1_000, ttft_ms=1_000 * (10 - i)) for i in range(9)]
    s.waiting_queue.append(_on_pace("tight", tpot_ms=20))
    batch = s.get_new_prebuilt_batch(s.running_batch)
    # 6 admitted (4 running): the plan's EDF order, most urgent first.
    assert [r.rid for r in batch.reqs] == ["tight", "w8", "w7", "w6", "w5", "w4"]
    assert s.slo.pass_state.applied.decode_cap == 10 and s.max_running_requests == 64  # lowered for the pass only
    assert len(s.waiting_queue) == 4


def test_banked_slack_pays_for_a_longer_step_on_a_decode_worker() -> None:
    s = _decode_worker()
    # The same tight TPOT, but its next token is due in 50 s: every request stays on its
    # deadline-based schedule through a longer step, so all of them join.
    s.waiting_queue = [_decoding(f"w{i}", tpot_ms=1_000, ttft_ms=1_000 * (10 - i)) for i in range(9)]
    s.waiting_queue.append(_decoding("tight", tpot_ms=20, ttft_ms=50_000))
    batch = s.get_new_prebuilt_batch(s.running_batch)
    assert len(batch.reqs) == 10 and not s.waiting_queue
    assert s.slo.pass_state.applied.decode_cap > 10


def test_loose_tpots_leave_decode_admission_to_sglang() -> None:
    s = _decode_worker()
    s.waiting_queue = [_decoding(f"w{i}", tpot_ms=1_000) for i in range(10)]
    batch = s.get_new_prebuilt_batch(s.running_batch)
    assert len(batch.reqs) == 10 and not s.waiting_queue and s.slo.pass_state.applied.decode_cap == 64


def test_fcfs_decode_workers_stay_stock() -> None:
    s = _decode_worker("fcfs")
    s.waiting_queue = [_decoding(f"w{i}", tpot_ms=20) for i in range(10)]
    assert len(s.get_new_prebuilt_batch(s.running_batch).reqs) == 10


def test_a_failing_policy_on_a_decode_worker_falls_back_to_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _decode_worker()
    monkeypatch.setattr(s.slo.planner.policy, "plan", lambda view: 1 / 0)
    s.waiting_queue = [_decoding(f"w{i}", tpot_ms=20) for i in range(10)]
    assert len(s.get_new_prebuilt_batch(s.running_batch).reqs) == 10
    assert s.slo.planner.errors == 1 and s.slo.pass_state.applied.decode_cap is None


def test_the_configured_limit_is_restored_when_sglang_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self: Any, running_batch: Any) -> Any:
        assert self.max_running_requests == 10
        raise RuntimeError("engine error")

    monkeypatch.setattr(StandInEngine, "get_new_prebuilt_batch", boom)
    s = _decode_worker()
    s.waiting_queue = [_on_pace("tight", tpot_ms=20)]
    with pytest.raises(RuntimeError):
        s.get_new_prebuilt_batch(s.running_batch)
    assert s.max_running_requests == 64


# ---- status ----------------------------------------------------------------------------------------


def test_status_reports_the_pd_role_and_its_mechanism() -> None:
    p = _scheduler(DisaggregationMode.PREFILL)
    p.waiting_queue = [_Req("big", 1500, ttft_ms=1_000)]
    p.get_new_batch_prefill(p.running_batch)
    snap = p.slo_status_snapshot()
    assert snap["disaggregation_mode"] == "prefill" and snap["chunk_budget"] == B
    assert snap["dynamic_chunking"] == {"whole_finish_passes": 1, "finished_whole": 1}
    assert snap["decode_cap"] is None

    d = _decode_worker()
    d.waiting_queue = [_on_pace("tight", tpot_ms=20)]
    d.get_new_prebuilt_batch(d.running_batch)
    snap = d.slo_status_snapshot()
    assert snap["disaggregation_mode"] == "decode" and snap["decode_cap"] == 10
    assert snap["max_running_requests"] == 64 and snap["dynamic_chunking"] is None


# ---- the prefill gate ------------------------------------------------------------------------------


def test_a_pass_with_no_room_for_prefill_decodes_and_prefill_resumes_with_slack() -> None:
    s = slo_scheduler(DisaggregationMode.NULL, startup_chunk=2 * B, perf=PERF)  # separate batching
    s.running_batch = SimpleNamespace(reqs=[_decoding(f"r{i}", tpot_ms=30) for i in range(4)], batch_is_full=False)
    s.waiting_queue = [_Req("w", 500, ttft_ms=60_000, tpot_ms=30)]
    s.slo.clock.set(1.02)  # token 1 is due at 1.03: 10 ms left, less than the 14 ms decode step
    plan = s.get_new_batch_prefill(s.running_batch)
    assert plan.batch_to_run is None and s.seen_passes == []  # SGLang's admission never ran
    assert s.slo_status_snapshot()["prefill_deferred"] == 1
    for r in s.running_batch.reqs:
        r.output_ids = [1] * 6  # five more tokens out early: 150 ms banked, prefill fits again
    plan = s.get_new_batch_prefill(s.running_batch)
    assert [r.rid for r in plan.batch_to_run.reqs] == ["w"]


def test_a_chunked_prefill_in_progress_is_gated_like_a_new_one() -> None:
    # Nothing waits while a long prompt is prefilled chunk by chunk (SGLang keeps it as
    # chunked_req, out of the queue): each next chunk is still sized to, or deferred for, the
    # running requests' slack. (Unplanned, a burst's chunks ran back to back.)
    s = slo_scheduler(DisaggregationMode.NULL, startup_chunk=2 * B, perf=PERF)  # separate batching
    s.running_batch = SimpleNamespace(reqs=[_decoding(f"r{i}", tpot_ms=30) for i in range(4)], batch_is_full=False)
    for r in s.running_batch.reqs:
        r.output_ids = [1] * 11  # ten tokens ahead of schedule: 300 ms banked
    s.waiting_queue = [_Req("w", 1500, ttft_ms=60_000, tpot_ms=30)]
    s.slo.clock.set(1.02)
    first = s.get_new_batch_prefill(s.running_batch)
    assert [r.rid for r in first.batch_to_run.reqs] == ["w"] and s.chunked_req is not None  # a first chunk
    assert s.waiting_queue == []
    for r in s.running_batch.reqs:
        r.output_ids = [1]  # the slack is spent: the next token is due in 10 ms
    passes = len(s.seen_passes)
    second = s.get_new_batch_prefill(s.running_batch)
    assert second.batch_to_run is None and len(s.seen_passes) == passes  # a decode pass, chunk kept
    assert s.slo_status_snapshot()["prefill_deferred"] == 1 and s.chunked_req is not None


def test_a_plan_sees_the_time_the_card_starts_the_pass() -> None:
    # With the overlap loop a pass is planned while the card still runs the last one: the view's
    # clock is the card's, so slack is not counted twice.
    s = slo_scheduler(DisaggregationMode.NULL, startup_chunk=2 * B, perf=PERF)
    s.running_batch = SimpleNamespace(reqs=[], batch_is_full=False)
    s.slo.clock.set(5.0)
    s.slo.meter.card_busy_s = lambda: 0.25  # type: ignore[method-assign]
    assert s._slo_view(s.running_batch).now == pytest.approx(5.25)


def test_a_mixed_steps_chunk_covers_the_decodes_sglang_charges_to_it() -> None:
    # SGLang's PrefillAdder budgets chunked_prefill_size minus the running decodes in a mixed
    # step: a small prefill budget must not leave it a negative chunk.
    s = slo_scheduler(DisaggregationMode.NULL, startup_chunk=2 * B, mixed=True, perf=PERF)
    s.running_batch = SimpleNamespace(reqs=[_decoding(f"r{i}", tpot_ms=15) for i in range(40)], batch_is_full=False)
    s.slo.clock.set(1.0)
    s.waiting_queue = [_Req("w", 100, ttft_ms=600, tpot_ms=15)]
    s.get_new_batch_prefill(s.running_batch)
    assert s.chunked_prefill_size - len(s.running_batch.reqs) >= 1  # was 16 - 40: negative
    assert s.chunked_prefill_size <= 2 * B
