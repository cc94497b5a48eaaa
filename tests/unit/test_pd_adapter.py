"""The adapter on PD disaggregation workers: dynamic chunking on prefill, the SLO batch cap on decode.

No engine runs: the adapter is a `SloScheduler.__new__` skeleton, and SGLang's pass underneath is
replaced by a stand-in. On prefill the stand-in is SGLang's admission loop
(`Scheduler._get_new_batch_prefill_raw`, trimmed to what decides admission) around SGLang's real
`PrefillAdder`, so the budgets the adapter sets are judged by SGLang's own arithmetic. On decode it
is `get_new_prebuilt_batch`'s admission bound, min(pool size, max_running_requests).
"""

from __future__ import annotations

from array import array
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.managers import schedule_policy
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
from sglang.srt.sampling.sampling_params import SamplingParams

from scheduler import sglang_scheduler
from scheduler.config import SloServerConfig
from scheduler.core.analyzer.graph import PatternLibrary
from scheduler.core.analyzer.online import BoundAccuracy
from scheduler.core.clock import ManualClock
from scheduler.core.compound import CompoundDeadlines
from scheduler.core.online_perf import OnlinePerfModel
from scheduler.core.perf_model import RooflinePerfModel, RooflineTerm
from scheduler.core.policies import make_policy
from scheduler.core.programs import ProgramTracker
from scheduler.core.slo import SloClass, SloSpec
from scheduler.sglang_scheduler import SloScheduler
from server.slo_request import ARRIVAL_PARAM, SLO_PARAM

PERF = RooflinePerfModel([RooflineTerm(k_tokens=1e-3, k_spec=0.0, k_kv=0.0, b=0.01)])  # 10 ms + 1 ms/token
POOL = 1000  # req_to_token_pool slots of the stand-in engine
B = 1024


class _Req:
    """What SGLang's PrefillAdder and the adapter's request view read from a Req."""

    def __init__(self, rid: str, prompt: int, ttft_ms: float, tpot_ms: float = 100.0, cached: int = 0) -> None:
        spec = SloSpec(ttft_ms=ttft_ms, tpot_ms=tpot_ms, slo_class=SloClass.LATENCY)
        self.rid = rid
        self.sampling_params = SamplingParams(
            max_new_tokens=16, custom_params={SLO_PARAM: spec.to_dict(), ARRIVAL_PARAM: 0.0}
        )
        self.origin_input_ids = array("q", range(prompt))
        self.full_untruncated_fill_ids = self.origin_input_ids
        self.output_ids: list[int] = []
        self.prefix_indices = torch.arange(cached)
        self.customized_info = None
        self.host_hit_length = self.swa_host_hit_length = 0
        self.last_node = self.mamba_pool_idx = self.extend_range = None
        self.retracted_stain = False
        self.metadata_buffer_index = -1

    def needs_host_load_back(self) -> bool:
        return False

    def set_extend_range(self, start: int, end: int) -> None:
        self.extend_range = SimpleNamespace(start=start, end=end, length=end - start)

    def finish_chunk(self) -> None:
        """What the next pass's process_prefill_chunk does: the chunk's KV becomes the prefix."""
        self.prefix_indices = torch.arange(self.extend_range.end)


class _Cache:
    sliding_window_size = None
    disable = False

    def supports_mamba(self) -> bool:
        return False

    def evictable_size(self) -> int:
        return 0

    def inc_lock_ref(self, node: Any) -> Any:
        return SimpleNamespace(delta=0)

    def dec_lock_ref(self, node: Any, params: Any = None) -> Any:
        return SimpleNamespace(delta=0)

    def is_tree_cache(self) -> bool:
        return False


class _Allocator:
    def available_size(self) -> int:
        return 10**6


def _sglang_prefill_pass(self: SloScheduler, running_batch: Any) -> Any:
    """Admission of SGLang 0.5.17's _get_new_batch_prefill_raw, with the real PrefillAdder."""
    self.seen_passes.append((self.chunked_prefill_size, self.get_num_allocatable_reqs(0)))
    if not self.waiting_queue and self.chunked_req is None:
        return SimpleNamespace(batch_to_run=None, running_batch=running_batch)
    running_bs = len(running_batch.reqs)
    if self.get_num_allocatable_reqs(running_bs) <= 0 and self.chunked_req is None:
        return SimpleNamespace(batch_to_run=None, running_batch=running_batch)
    adder = PrefillAdder(
        self.page_size,
        _Cache(),
        _Allocator(),
        running_batch,
        1.0,
        self.max_prefill_tokens,
        self.chunked_prefill_size,
    )
    if self.chunked_req is not None:
        self.chunked_req = adder.add_chunked_req(self.chunked_req)
    for req in self.waiting_queue:
        if len(adder.can_run_list) >= self.get_num_allocatable_reqs(running_bs):
            break
        if adder.add_one_req(req, has_chunked_req=self.chunked_req is not None, truncation_align_size=None) != (
            AddReqResult.CONTINUE
        ):
            break
    admitted = adder.can_run_list
    self.waiting_queue = [r for r in self.waiting_queue if r not in admitted]
    if adder.new_chunked_req is not None:
        self.chunked_req = adder.new_chunked_req
    batch = SimpleNamespace(reqs=list(admitted)) if admitted else None
    return SimpleNamespace(batch_to_run=batch, running_batch=running_batch)


def _sglang_prebuilt(self: SloScheduler, running_batch: Any) -> Any:
    """get_new_prebuilt_batch's admission in SGLang 0.5.17 (disaggregation/decode.py)."""
    if not self.waiting_queue:
        return None
    room = max(min(POOL, self.max_running_requests) - len(running_batch.reqs), 0)
    admitted, self.waiting_queue = self.waiting_queue[:room], self.waiting_queue[room:]
    return SimpleNamespace(reqs=admitted) if admitted else None


@pytest.fixture(autouse=True)
def _stand_in_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    # PrefillAdder asks the (unpublished) parallel config about context parallelism: none here.
    monkeypatch.setattr(schedule_policy, "is_dsa_prefill_cp_in_seq_split", lambda: False)
    monkeypatch.setattr(schedule_policy, "is_prefill_context_parallel_enabled", lambda: False)
    base = sglang_scheduler._BaseScheduler
    monkeypatch.setattr(base, "get_new_batch_prefill", _sglang_prefill_pass)
    monkeypatch.setattr(base, "get_new_prebuilt_batch", _sglang_prebuilt)
    monkeypatch.setattr(base, "get_num_allocatable_reqs", lambda self, running_bs: POOL - running_bs)


def _scheduler(mode: DisaggregationMode, policy: str = "edf", startup_chunk: int | None = 2 * B) -> SloScheduler:
    s = SloScheduler.__new__(SloScheduler)  # no engine: only the adapter's own state
    s.slo_config = SloServerConfig(policy=policy)
    s.slo_perf = OnlinePerfModel(prior=PERF)  # a given profile: ready at once
    s.slo_policy = make_policy(policy, s.slo_perf)
    s.slo_knobs_on = policy != "fcfs"
    s.slo_oracle = False
    s.slo_clock = ManualClock()  # requests arrive at 0.0: now
    s.slo_programs = ProgramTracker()
    s.slo_compound = CompoundDeadlines(PatternLibrary())
    s.slo_lengths = s.slo_pacer = None
    s.slo_accuracy = BoundAccuracy()
    s._slo_views, s._slo_stage_deadlines, s._slo_client_caps = {}, {}, {}
    s.slo_step = s.slo_plan_errors = s.slo_dropped = s.slo_preempted = s.slo_best_effort_waiting = 0
    s.slo_dyn_passes = s.slo_dyn_whole = 0
    s.slo_batch_cap = s.slo_decode_cap = None
    s.slo_solo_pass = False
    s.slo_pending_preempt = set()
    s.draft_worker, s.slo_spec, s.slo_spec_cost_ratio = None, None, 0.0  # no speculation
    s.disaggregation_mode = mode
    s.chunked_prefill_size = startup_chunk
    s.max_running_requests = 64
    s.max_prefill_tokens = 512  # below the chunk: it must not cap a whole-finish step
    s.max_total_num_tokens = 10**6
    s.page_size = 1
    s.is_mixed_chunk = False
    s.token_to_kv_pool_allocator = _Allocator()
    s.tree_cache = _Cache()
    s.waiting_queue, s.running_batch, s.chunked_req = [], SimpleNamespace(reqs=[]), None
    s.seen_passes = []
    s._slo_init_engine_limits()
    return s


# ---- PD prefill: dynamic chunking ------------------------------------------------------------------


def test_a_prefill_worker_started_at_2b_runs_normal_passes_at_b() -> None:
    s = _scheduler(DisaggregationMode.PREFILL)
    assert (s.slo_startup_chunk, s.slo_chunk_budget, s.chunked_prefill_size) == (2 * B, B, B)
    assert s.slo_engine_view(s.running_batch).chunk_size == B


def test_a_lowered_chunk_does_not_lower_the_next_views_limit() -> None:
    s = _scheduler(DisaggregationMode.NULL)  # mixed batching: the TPOT knob lowers the chunk
    s.is_mixed_chunk = True
    s.running_batch = SimpleNamespace(reqs=[_Req(f"r{i}", 100, ttft_ms=1_000, tpot_ms=15) for i in range(3)])
    s.waiting_queue = [_Req("w", 100, ttft_ms=60_000, tpot_ms=15)]
    s.get_new_batch_prefill(s.running_batch)
    assert s.chunked_prefill_size < 2 * B  # this pass's chunk
    assert s.slo_engine_view(s.running_batch).chunk_size == 2 * B  # the next plan may raise it again


@pytest.mark.parametrize(
    ("mode", "policy"),
    [(DisaggregationMode.PREFILL, "fcfs"), (DisaggregationMode.NULL, "edf"), (DisaggregationMode.DECODE, "edf")],
)
def test_only_slo_policies_on_prefill_workers_chunk_dynamically(mode: DisaggregationMode, policy: str) -> None:
    s = _scheduler(mode, policy)
    assert not s._slo_dynamic_chunking()
    assert s.slo_chunk_budget == s.chunked_prefill_size == 2 * B


def test_the_most_urgent_request_is_finished_whole_and_alone() -> None:
    s = _scheduler(DisaggregationMode.PREFILL)
    small, big = _Req("small", 10, ttft_ms=60_000), _Req("big", 1500, ttft_ms=1_000)
    s.waiting_queue = [small, big]  # EDF puts big (tighter TTFT) first

    plan = s.get_new_batch_prefill(s.running_batch)

    assert [r.rid for r in plan.batch_to_run.reqs] == ["big"]
    assert big.extend_range.end == 1500 and s.chunked_req is None  # all 1500 tokens, > max_prefill_tokens
    assert s.seen_passes == [(1500, 1)]  # the step's budget, and nothing else admitted
    assert [r.rid for r in s.waiting_queue] == ["small"]
    assert (s.chunked_prefill_size, s.slo_solo_pass) == (B, False)  # restored for the next pass
    assert (s.slo_dyn_passes, s.slo_dyn_whole) == (1, 1)

    plan = s.get_new_batch_prefill(s.running_batch)
    assert [r.rid for r in plan.batch_to_run.reqs] == ["small"] and s.seen_passes[-1] == (B, POOL)


def test_a_short_head_leaves_the_budget_to_others() -> None:
    s = _scheduler(DisaggregationMode.PREFILL)
    s.max_prefill_tokens = 16384  # SGLang's default (512 would stop admission after "a")
    s.waiting_queue = [_Req("a", 600, ttft_ms=1_000), _Req("b", 600, ttft_ms=2_000)]
    plan = s.get_new_batch_prefill(s.running_batch)
    assert [r.rid for r in plan.batch_to_run.reqs] == ["a", "b"]
    assert s.chunked_req is plan.batch_to_run.reqs[1] and s.chunked_req.extend_range.end == B - 600
    assert s.seen_passes == [(B, POOL)] and s.slo_dyn_passes == 0


def test_a_long_prompt_takes_one_step_fewer_than_strict_chunks() -> None:
    s = _scheduler(DisaggregationMode.PREFILL)
    long = _Req("long", 3000, ttft_ms=1_000)
    s.waiting_queue = [long, _Req("next", 10, ttft_ms=5_000)]
    chunks = []
    while s.chunked_req is not None or long in s.waiting_queue:
        plan = s.get_new_batch_prefill(s.running_batch)
        chunks.append([(r.rid, r.extend_range.length) for r in plan.batch_to_run.reqs])
        if s.chunked_req is not None:
            s.chunked_req.finish_chunk()
    # 3000 = 1024 + 1976 (the rest < 2B, whole and alone); strict chunks would need 1024+1024+952.
    assert chunks == [[("long", B)], [("long", 3000 - B)]]
    assert (s.slo_dyn_passes, s.slo_dyn_whole) == (1, 1)
    assert [r.rid for r in s.waiting_queue] == ["next"]


def test_the_chunked_request_is_judged_by_what_it_has_left() -> None:
    s = _scheduler(DisaggregationMode.PREFILL)
    chunked = _Req("chunked", 2200, ttft_ms=1_000, cached=1000)  # 1200 left: B < 1200 < 2B
    s.chunked_req, s.waiting_queue = chunked, [_Req("w", 10, ttft_ms=500)]
    plan = s.get_new_batch_prefill(s.running_batch)
    assert [r.rid for r in plan.batch_to_run.reqs] == ["chunked"]
    assert chunked.extend_range.length == 1200 and s.chunked_req is None and s.slo_dyn_whole == 1


def test_a_failing_rule_falls_back_to_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("policy bug")

    monkeypatch.setattr(sglang_scheduler, "dynamic_chunk", broken)
    s = _scheduler(DisaggregationMode.PREFILL)
    s.waiting_queue = [_Req("big", 1500, ttft_ms=1_000)]
    plan = s.get_new_batch_prefill(s.running_batch)
    assert plan.batch_to_run.reqs[0].extend_range.length == B
    assert s.slo_plan_errors == 1 and s.chunked_prefill_size == B


def test_a_queue_timeout_on_a_prefill_worker_frees_the_metadata_buffer() -> None:
    s = _scheduler(DisaggregationMode.PREFILL)
    freed, sent = [], []
    s.req_to_metadata_buffer_idx_allocator = SimpleNamespace(free=freed.append)
    s.ipc_channels = SimpleNamespace(send_to_tokenizer=SimpleNamespace(send_output=lambda out, req: sent.append(out)))
    s.enable_hicache_storage = False
    req = _Req("late", 100, ttft_ms=1_000)
    req.metadata_buffer_index, req.pending_bootstrap = 7, False
    s.waiting_queue = [req]
    s._drop_waiting({"late": "slo_queue_timeout"})
    assert freed == [7] and req.metadata_buffer_index == -1 and len(sent) == 1 and not s.waiting_queue


# ---- PD decode: the SLO running-batch cap ----------------------------------------------------------


def _decoding(rid: str, tpot_ms: float, ttft_ms: float = 1_000) -> _Req:
    req = _Req(rid, 100, ttft_ms=ttft_ms, tpot_ms=tpot_ms)
    req.output_ids = [1]  # the first token came from the prefill worker
    return req


def _decode_worker(policy: str = "edf") -> SloScheduler:
    s = _scheduler(DisaggregationMode.DECODE, policy)
    s.running_batch = SimpleNamespace(reqs=[_decoding(f"r{i}", tpot_ms=1_000) for i in range(4)])
    return s


def test_a_tight_tpot_caps_admission_on_a_decode_worker() -> None:
    s = _decode_worker()
    # One waiting request needs 20 ms per token: 10 ms + 1 ms/request allows 10 running.
    s.waiting_queue = [_decoding(f"w{i}", tpot_ms=1_000, ttft_ms=1_000 * (10 - i)) for i in range(9)]
    s.waiting_queue.append(_decoding("tight", tpot_ms=20, ttft_ms=50_000))
    batch = s.get_new_prebuilt_batch(s.running_batch)
    # 6 admitted (4 running): the plan's EDF order, most urgent first.
    assert [r.rid for r in batch.reqs] == ["w8", "w7", "w6", "w5", "w4", "w3"]
    assert s.slo_decode_cap == 10 and s.max_running_requests == 64  # lowered for the pass only
    assert len(s.waiting_queue) == 4


def test_loose_tpots_leave_decode_admission_to_sglang() -> None:
    s = _decode_worker()
    s.waiting_queue = [_decoding(f"w{i}", tpot_ms=1_000) for i in range(10)]
    batch = s.get_new_prebuilt_batch(s.running_batch)
    assert len(batch.reqs) == 10 and not s.waiting_queue and s.slo_decode_cap == 64


def test_fcfs_decode_workers_stay_stock() -> None:
    s = _decode_worker("fcfs")
    s.waiting_queue = [_decoding(f"w{i}", tpot_ms=20) for i in range(10)]
    assert len(s.get_new_prebuilt_batch(s.running_batch).reqs) == 10


def test_a_failing_policy_on_a_decode_worker_falls_back_to_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _decode_worker()
    monkeypatch.setattr(s.slo_policy, "plan", lambda view: 1 / 0)
    s.waiting_queue = [_decoding(f"w{i}", tpot_ms=20) for i in range(10)]
    assert len(s.get_new_prebuilt_batch(s.running_batch).reqs) == 10
    assert s.slo_plan_errors == 1 and s.slo_decode_cap is None


def test_the_configured_limit_is_restored_when_sglang_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self: Any, running_batch: Any) -> Any:
        assert self.max_running_requests == 10
        raise RuntimeError("engine error")

    monkeypatch.setattr(sglang_scheduler._BaseScheduler, "get_new_prebuilt_batch", boom)
    s = _decode_worker()
    s.waiting_queue = [_decoding("tight", tpot_ms=20)]
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
    d.waiting_queue = [_decoding("tight", tpot_ms=20)]
    d.get_new_prebuilt_batch(d.running_batch)
    snap = d.slo_status_snapshot()
    assert snap["disaggregation_mode"] == "decode" and snap["decode_cap"] == 10
    assert snap["max_running_requests"] == 64 and snap["dynamic_chunking"] is None
