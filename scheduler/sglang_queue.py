"""Queue accounting on SGLang's scheduler: what is queued, the bound on it, the queue's predicted
drain, and ending a queued request the plan drops. A mixin of `SloSchedulerMixin`."""

from __future__ import annotations

import logging
import time
from typing import Any

from sglang.srt.managers.io_struct import AbortReq

from scheduler.components.assembly import SloComponents
from scheduler.components.request_state import request_slo
from scheduler.components.shedding import shed_finish_reason
from scheduler.core.admission import backlog, queue_is_full
from scheduler.core.plan_path import MIXED, PREFILL
from scheduler.sglang_engine import disagg_role
from wire import QUEUE_FULL

logger = logging.getLogger("sglang_slo.scheduler")

# A PD worker's queues before the waiting queue, and how to reach the Req in each of their entries.
_PD_QUEUES = (
    ("disagg_prefill_bootstrap_queue", lambda entry: entry),  # Reqs
    ("disagg_decode_prealloc_queue", lambda entry: entry.req),  # DecodeRequest wrappers
    ("disagg_decode_transfer_queue", lambda entry: entry.req),
)


class SloQueueMixin:
    slo: SloComponents
    waiting_queue: list[Any]

    def _abort_on_queued_limit(self, recv_req: Any) -> bool:
        """Changes: the waiting queue's bound counts requests (SGLang's --max-queued-requests)
        and prompt tokens (--slo-max-queued-tokens), on co-located and PD workers alike, under
        every policy; a full queue answers 429 `queue_full` with a Retry-After from the queue's
        predicted drain (SGLang: 503, co-located only). Only the incoming request is refused:
        nothing queued is shed for it, and a retracted request (it has output) always returns.
        The caller releases the refused request's cache state (SGLang's `_add_request_to_queue`
        on co-located workers, ours on PD workers)."""
        if recv_req.output_ids:
            return False
        limits = self.max_queued_requests, self.slo.config.max_queued_tokens  # type: ignore[attr-defined]
        if limits == (None, None):
            return False
        queued = self._slo_queued()
        tokens = sum(len(r.origin_input_ids) for r in queued) if limits[1] is not None else 0
        if not queue_is_full(len(queued), tokens, len(recv_req.origin_input_ids), *limits):
            return False
        slo, _ = request_slo(recv_req.rid, recv_req.sampling_params)
        finished = shed_finish_reason(QUEUE_FULL, self._slo_queue_drain_s(), slo)
        self.send_abort_output(AbortReq(finished_reason=finished, rid=recv_req.rid), recv_req)  # type: ignore[attr-defined]
        self.slo.counters.shed[QUEUE_FULL] += 1
        self.slo.states.forget(recv_req.rid)
        return True

    def _add_request_to_queue(self, req: Any, is_retracted: bool = False) -> Any:
        """Changes: PD workers bound their queues too (SGLang checks co-located queues only);
        a refused request's cache state is released as SGLang releases a refused one's."""
        if disagg_role(self) != MIXED and not is_retracted and self._abort_on_queued_limit(req):
            self._release_aborted_request(req)  # type: ignore[attr-defined]
            return None
        return super()._add_request_to_queue(req, is_retracted)  # type: ignore[misc]

    def _slo_queued(self) -> list[Any]:
        """Every request accepted and not yet running: the waiting queue, plus a PD worker's
        bootstrap (prefill) or pre-allocation and transfer (decode) queues."""
        queued = list(self.waiting_queue)
        for name, req_of in _PD_QUEUES:
            pending = getattr(self, name, None)
            if pending is not None:
                queued += map(req_of, getattr(pending, "queue", ()))
        return queued

    def _slo_queue_drain_s(self) -> float | None:
        """Seconds until every request queued now has started (a newcomer's wait), from the
        perf model; computed at most once per pass."""
        current = self.slo.pass_state
        if current.drain_step != current.step:
            try:
                view = self._slo_view(self.running_batch)  # type: ignore[attr-defined]
                current.drain_s = backlog(view, self.slo.perf).drain_s
            except Exception:  # an estimate must never take the engine down
                logger.exception("queue drain estimate failed at step %d", current.step)
                current.drain_s = None
            current.drain_step, current.drain_at = current.step, time.monotonic()
        return current.drain_s

    def _slo_abort_waiting(self, req: Any, reason: str, wait_s: float | None = None) -> None:
        """End a queued request with a 503, `reason` and its predicted wait, freeing what
        SGLang's own abort of a queued request frees (its cache handle, multimodal inputs and
        session; on a PD prefill worker its metadata slot, KV sender and KV)."""
        self._release_aborted_request(req)  # type: ignore[attr-defined]
        if disagg_role(self) == PREFILL:
            self.release_aborted_prefill_waiting_req(req)  # type: ignore[attr-defined]
        state = self.slo.states.get(req.rid)
        finished = shed_finish_reason(reason, wait_s, None if state is None else state.slo)
        self.send_abort_output(AbortReq(finished_reason=finished, rid=req.rid), req)  # type: ignore[attr-defined]
        self.slo.counters.dropped += 1
        self.slo.counters.shed[finished["reason"]] += 1
        self.slo.states.forget(req.rid)
        self.slo.views.forget(req.rid)
        logger.debug("dropped %s: %s", req.rid, reason)
