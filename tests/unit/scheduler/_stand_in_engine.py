"""A stand-in for SGLang's Scheduler under the adapter's overrides: the engine attributes the
overrides read, and SGLang 0.5.17's admission around SGLang's real `PrefillAdder`, so the
budgets the adapter sets are judged by SGLang's own arithmetic. No model, no processes.

`slo_scheduler(...)` builds `SloSchedulerMixin` over it through the mixin's normal __init__.
"""

from __future__ import annotations

from array import array
from types import SimpleNamespace
from typing import Any

import torch
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
from sglang.srt.sampling.sampling_params import SamplingParams

from scheduler.components.assembly import build_components
from scheduler.config import SloServerConfig
from scheduler.core.clock import ManualClock
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import PerfModel
from scheduler.sglang_scheduler import SloSchedulerMixin
from wire import ARRIVAL_PARAM, SLO_PARAM

POOL = 1000  # req_to_token_pool slots of the stand-in engine


class StandInReq:
    """What SGLang's PrefillAdder and the adapter read from a Req."""

    def __init__(
        self,
        rid: str,
        prompt: int,
        ttft_ms: float | None = None,
        tpot_ms: float | None = 100.0,
        cached: int = 0,
        spec: SloSpec | None = None,
        arrival: float = 0.0,
        max_new_tokens: int = 16,
        custom: dict[str, Any] | None = None,
    ) -> None:
        if spec is None:
            spec = SloSpec(ttft_ms=ttft_ms, tpot_ms=tpot_ms, slo_class=SloClass.LATENCY)
        self.rid = rid
        self.sampling_params = SamplingParams(
            max_new_tokens=max_new_tokens,
            custom_params={SLO_PARAM: spec.to_dict(), ARRIVAL_PARAM: arrival, **(custom or {})},
        )
        self.origin_input_ids = array("q", range(prompt))
        self.full_untruncated_fill_ids = self.origin_input_ids
        self.output_ids: list[int] = []
        self.prefix_indices = torch.arange(cached)
        self.customized_info: dict[str, Any] | None = None
        self.host_hit_length = self.swa_host_hit_length = 0
        self.last_node = self.mamba_pool_idx = self.extend_range = None
        self.retracted_stain = False
        self.metadata_buffer_index = -1
        self.done = False

    def needs_host_load_back(self) -> bool:
        return False

    def set_extend_range(self, start: int, end: int) -> None:
        self.extend_range = SimpleNamespace(start=start, end=end, length=end - start)

    def finish_chunk(self) -> None:
        """What the next pass's process_prefill_chunk does: the chunk's KV becomes the prefix."""
        self.prefix_indices = torch.arange(self.extend_range.end)

    def finished(self) -> bool:
        return self.done


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


class StandInEngine:
    """The SGLang side of a scheduler: state the overrides read, and the base behaviours they
    call through super()."""

    def __init__(self, mode: DisaggregationMode, startup_chunk: int | None, mixed: bool = False) -> None:
        self.disaggregation_mode = mode
        self.chunked_prefill_size = startup_chunk
        self.max_running_requests = 64
        self.max_queued_requests: int | None = None
        self.disagg_prefill_bootstrap_queue = SimpleNamespace(queue=[]) if mode == DisaggregationMode.PREFILL else None
        self.disagg_decode_prealloc_queue = SimpleNamespace(queue=[]) if mode == DisaggregationMode.DECODE else None
        self.max_prefill_tokens = 512  # below the chunk: it must not cap a whole-finish step
        self.max_total_num_tokens = 10**6
        self.page_size = 1
        self.is_mixed_chunk = mixed
        self.enable_overlap = False
        self.device = "cpu"
        self.draft_worker = None
        self.enable_hicache_storage = False
        self.token_to_kv_pool_allocator = _Allocator()
        self.tree_cache = _Cache()
        self.waiting_queue: list[Any] = []
        self.running_batch = SimpleNamespace(reqs=[], batch_is_full=False)
        self.chunked_req: Any = None
        self.last_batch: Any = None
        self.seen_passes: list[tuple[int | None, int]] = []
        self.handled: list[Any] = []
        self.sent: list[Any] = []
        self.ipc_channels = SimpleNamespace(send_to_tokenizer=SimpleNamespace(send_output=self._send))

    def _send(self, out: Any, req: Any) -> None:
        self.sent.append(out)

    def handle_generate_request(self, recv_req: Any) -> None:
        self.handled.append(recv_req)

    def _abort_on_queued_limit(self, recv_req: Any) -> bool:
        """SGLang 0.5.17: 503 once the waiting queue holds max_queued_requests."""
        if self.max_queued_requests is None or len(self.waiting_queue) + 1 <= self.max_queued_requests:
            return False
        self.sent.append(SimpleNamespace(rid=recv_req.rid, finished_reason={"type": "abort", "status_code": 503}))
        return True

    def _add_request_to_queue(self, req: Any, is_retracted: bool = False) -> None:
        """SGLang 0.5.17: the queue bound on co-located workers only; PD workers queue elsewhere first."""
        if self.disaggregation_mode == DisaggregationMode.NULL:
            if self._abort_on_queued_limit(req):
                return
            self.waiting_queue.append(req)
        elif self.disaggregation_mode == DisaggregationMode.PREFILL:
            self.disagg_prefill_bootstrap_queue.queue.append(req)
        else:
            self.disagg_decode_prealloc_queue.queue.append(req)

    def get_num_allocatable_reqs(self, running_bs: int) -> int:
        return POOL - running_bs

    def get_new_batch_prefill(self, running_batch: Any) -> Any:
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
            result = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None, truncation_align_size=None)
            if result != AddReqResult.CONTINUE:
                break
        admitted = adder.can_run_list
        self.waiting_queue = [r for r in self.waiting_queue if r not in admitted]
        if adder.new_chunked_req is not None:
            self.chunked_req = adder.new_chunked_req
        batch = SimpleNamespace(reqs=list(admitted)) if admitted else None
        return SimpleNamespace(batch_to_run=batch, running_batch=running_batch)

    def get_new_prebuilt_batch(self, running_batch: Any) -> Any:
        """get_new_prebuilt_batch's admission in SGLang 0.5.17 (disaggregation/decode.py)."""
        if not self.waiting_queue:
            return None
        room = max(min(POOL, self.max_running_requests) - len(running_batch.reqs), 0)
        admitted, self.waiting_queue = self.waiting_queue[:room], self.waiting_queue[room:]
        return SimpleNamespace(reqs=admitted) if admitted else None

    def process_batch_result(self, batch: Any, result: Any) -> None:
        return None


class StandInSloScheduler(SloSchedulerMixin, StandInEngine):
    """The adapter's overrides over the stand-in engine."""


def slo_scheduler(
    mode: DisaggregationMode = DisaggregationMode.NULL,
    policy: str = "edf",
    startup_chunk: int | None = 2048,
    mixed: bool = False,
    perf: PerfModel | None = None,
    config: SloServerConfig | None = None,
) -> StandInSloScheduler:
    """Requests arrive at 0.0 on a manual clock standing at 0.0; `perf` is trusted as given."""
    params = {"slo_levers": True} if policy == "edf" else {}  # edf with the engine's SLO levers
    config = config if config is not None else SloServerConfig(policy=policy, policy_params=params)
    components = build_components(config, prior=perf, clock=ManualClock())
    return StandInSloScheduler(mode, startup_chunk, mixed, slo_components=components)
