"""A stand-in for SGLang's Scheduler under the adapter's overrides: the engine attributes the
overrides read, and SGLang 0.5.23's admission around SGLang's real `PrefillAdder` (through the
scheduler's `get_prefill_adder_class` hook) and real `Req`s, so the budgets the adapter sets are
judged by SGLang's own arithmetic. No model, no processes.

`slo_scheduler(...)` builds `SloSchedulerMixin` over it through the mixin's normal __init__.
"""

from __future__ import annotations

from array import array
from types import SimpleNamespace
from typing import Any

from sglang.srt.disaggregation.prefill import maybe_release_metadata_buffer
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache
from sglang.srt.runtime_context import publish
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

from scheduler.components.assembly import build_components
from scheduler.config import SloServerConfig
from scheduler.core.clock import ManualClock
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import PerfModel
from scheduler.sglang_scheduler import SloSchedulerMixin
from wire import ARRIVAL_PARAM, SLO_PARAM

POOL = 1000  # req_to_token_pool slots of the stand-in engine

# SGLang 0.5.23's admission reads its configuration from the process's runtime context.
publish(ServerArgs(model_path="dummy"), role="scheduler")  # no model is loaded


class StandInReq(Req):
    """SGLang's own Req, built from a prompt length and an SLO; `cached` prompt tokens matched."""

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
        params = SamplingParams(
            max_new_tokens=max_new_tokens,
            custom_params={SLO_PARAM: spec.to_dict(), ARRIVAL_PARAM: arrival, **(custom or {})},
        )
        super().__init__(rid, "", array("q", range(prompt)), params)
        self.prefix_len = cached
        self.refresh_fill_ids()

    def finish_chunk(self) -> None:
        """What the next pass's result processing does: the chunk's KV becomes the prefix."""
        self.prefix_len = self.extend_end


class _Cache(BasePrefixCache):
    """A cache without prefix sharing, whose requests hold their matches as given."""

    sliding_window_size = None
    disable = False
    buffer_pipeline = None

    def __init__(self) -> None:
        pass

    def reset(self) -> None:
        pass

    def match_prefix(self, params: Any) -> Any:
        raise NotImplementedError

    def checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
        pass

    def evict(self, params: Any) -> Any:
        raise NotImplementedError

    def inc_lock_ref(self, node: Any) -> Any:
        return SimpleNamespace(delta=0)

    def dec_lock_ref(self, node: Any, params: Any = None) -> Any:
        return SimpleNamespace(delta=0)

    def supports_mamba(self) -> bool:
        return False

    def supports_prefix_sharing(self) -> bool:
        return False

    def evictable_size(self) -> int:
        return 0

    def full_evictable_size(self) -> int:
        return 0

    def lock(self, node: Any) -> None:
        return None

    def unlock(self, lock: Any) -> None:
        pass


class _Allocator(BaseTokenToKVPoolAllocator):
    def __init__(self) -> None:
        self.page_size, self.size = 1, 10**6

    def available_size(self) -> int:
        return 10**6

    def alloc(self, need_size: int) -> Any:
        raise NotImplementedError

    def free(self, free_index: Any) -> None:
        raise NotImplementedError

    def clear(self) -> None:
        pass

    def get_cpu_copy(self, *args: Any) -> Any:
        return None

    def load_cpu_copy(self, *args: Any) -> None:
        pass

    def debug_print(self) -> str:
        return ""


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
        self.released: list[str] = []  # rids whose cache state _release_aborted_request freed
        self.token_to_kv_pool_allocator = _Allocator()
        self.tree_cache = _Cache()
        self.waiting_queue: list[Any] = []
        self.running_batch = SimpleNamespace(reqs=[], batch_is_full=False)
        self.chunked_req: Any = None
        self.last_batch: Any = None
        self.seen_passes: list[tuple[int | None, int]] = []
        self.mixed_seen: list[bool] = []  # is_mixed_chunk as each admission read it
        self.handled: list[Any] = []
        self.sent: list[Any] = []
        self.ipc_channels = SimpleNamespace(send_to_tokenizer=SimpleNamespace(send_output=self._send))

    def _send(self, out: Any, req: Any) -> None:
        self.sent.append(out)

    def send_abort_output(self, abort_req: Any, req: Any) -> None:
        self.sent.append(abort_req)

    def _release_aborted_request(self, req: Any) -> None:
        self.released.append(req.rid)

    def release_aborted_prefill_waiting_req(self, req: Any) -> None:
        """SGLang 0.5.23's (disaggregation/prefill.py), for a request that holds no KV yet."""
        sender = getattr(req, "disagg_kv_sender", None)
        if sender is not None and hasattr(sender, "abort"):
            sender.abort()
        maybe_release_metadata_buffer(req, self.req_to_metadata_buffer_idx_allocator)
        req.pending_bootstrap = False

    def get_prefill_adder_class(self) -> type:
        return PrefillAdder

    def handle_generate_request(self, recv_req: Any, **kwargs: Any) -> None:
        self.handled.append(recv_req)

    def _abort_on_queued_limit(self, recv_req: Any) -> bool:
        """SGLang 0.5.23: 503 once the waiting queue holds max_queued_requests."""
        if self.max_queued_requests is None or len(self.waiting_queue) + 1 <= self.max_queued_requests:
            return False
        self.sent.append(SimpleNamespace(rid=recv_req.rid, finished_reason={"type": "abort", "status_code": 503}))
        return True

    def _add_request_to_queue(self, req: Any, is_retracted: bool = False) -> None:
        """SGLang 0.5.23: the queue bound on co-located workers only; PD workers queue elsewhere first."""
        if self.disaggregation_mode == DisaggregationMode.NULL:
            if self._abort_on_queued_limit(req):
                self._release_aborted_request(req)
                return
            self.waiting_queue.append(req)
        elif self.disaggregation_mode == DisaggregationMode.PREFILL:
            self.disagg_prefill_bootstrap_queue.queue.append(req)
        else:  # SGLang wraps each in a DecodeRequest there
            self.disagg_decode_prealloc_queue.queue.append(SimpleNamespace(req=req))

    def get_num_allocatable_reqs(self, running_bs: int, *args: Any, **kwargs: Any) -> int:
        return POOL - running_bs

    def get_new_batch_prefill(self, running_batch: Any) -> Any:
        """Admission of SGLang 0.5.23's _get_new_batch_prefill_raw, with the real PrefillAdder
        of the scheduler's adder class."""
        if not self.waiting_queue and self.chunked_req is None:
            return SimpleNamespace(batch_to_run=None, running_batch=running_batch)
        running_bs = len(running_batch.reqs)
        if self.get_num_allocatable_reqs(running_bs) <= 0 and self.chunked_req is None:
            return SimpleNamespace(batch_to_run=None, running_batch=running_batch)
        adder = self.get_prefill_adder_class()(
            self.page_size,
            _Cache(),
            _Allocator(),
            running_batch,
            1.0,
            self.max_prefill_tokens,
            self.chunked_prefill_size,
            running_bs if self.is_mixed_chunk else 0,
            max_running_requests=self.max_running_requests,
        )
        self.seen_passes.append((self.chunked_prefill_size, adder.prefill_max_requests))
        self.mixed_seen.append(self.is_mixed_chunk)
        if self.chunked_req is not None:
            self.chunked_req.refresh_fill_ids()
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        for req in self.waiting_queue:
            if len(adder.can_run_list) >= self.get_num_allocatable_reqs(running_bs):
                break
            req.refresh_fill_ids()  # SGLang's init_next_round_input, without re-matching the prefix
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
        """get_new_prebuilt_batch's admission in SGLang 0.5.23 (disaggregation/decode.py)."""
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
