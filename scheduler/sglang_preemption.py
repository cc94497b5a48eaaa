"""Policy-driven preemption on SGLang: retract chosen decoding requests, resume them later.

SGLang already knows how to take a decoding request out of the running batch and bring it
back without losing its output: `ScheduleBatch.retract_decode` (used when the KV pool runs out)
frees the request's KV slots and req_to_token row (`release_req` -> `release_kv_cache(...,
checkpoint=False)`), resets its KV bookkeeping (`Req.reset_for_retract`, which also bumps
`retraction_count`, reported as meta_info `num_retractions`) but keeps `output_ids`, drops it
from the batch tensors (`filter_batch`) and the scheduler re-queues it with
`_add_request_to_queue(req, is_retracted=True)`. On resume it is prefilled again over prompt +
generated tokens (its KV is recomputed) and decoding goes on from where it stopped.

`retract_requests` does exactly that for the requests a policy names, instead of SGLang's
memory-driven choice. It must run where SGLang's own retraction runs: inside
`Scheduler.update_running_batch`, before the base class prepares the decode step. There the
prefill decision of this scheduling pass has already been made, so a retracted request cannot be
re-admitted in the same pass. That matters with overlap scheduling: the previous decode batch
may still be in flight and contain the request; its result is discarded for requests marked
`is_retracted` (the token is recomputed on resume), but re-admitting the request in the same pass
would clear that mark before the in-flight result is processed and append the token twice.

Only this module (and scheduler/sglang_scheduler.py) touches SGLang internals for preemption.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from sglang.srt.disaggregation.utils import DisaggregationMode

logger = logging.getLogger("sglang_slo.preemption")


def _in_flight_prefill(scheduler: Any) -> set[int]:
    """ids of requests whose prefill batch is still in flight (overlap scheduling): they were
    merged into the running batch before their first token was processed."""
    if not getattr(scheduler, "enable_overlap", False):
        return set()
    last = getattr(scheduler, "last_batch", None)
    if last is None or not last.forward_mode.is_extend():
        return set()
    return {id(r) for r in last.reqs}


def retraction_blocker(scheduler: Any, req: Any, in_flight_prefill: Collection[int] = ()) -> str | None:
    """Why `req` (in the running batch) cannot be retracted now, or None if it can."""
    if req.finished():
        return "finished"
    if getattr(req, "is_retracted", False):
        return "already retracted"
    if req is getattr(scheduler, "chunked_req", None):
        return "mid chunked prefill"
    if not req.output_ids:
        return "not decoding yet"
    if id(req) in in_flight_prefill:
        return "prefill in flight"
    if getattr(req, "beam_group", None) is not None:
        return "in a beam search group"  # SGLang aborts those rather than retract them
    if not req.kv.holds_kv:
        return "holds no KV"
    return None


def retract_requests(scheduler: Any, running_batch: Any, rids: Collection[str]) -> list:
    """Retract the decoding requests of `running_batch` whose rid is in `rids`; return them.

    Contract:
    - Call it from `Scheduler.update_running_batch(batch)` with that batch, before the base
      class runs (it then filters the batch and prepares the decode step for the rest).
    - Each retracted request has its KV slots and req_to_token row freed (not inserted into the
      radix tree), keeps `output_ids`, counts one more retraction, leaves `running_batch` (batch
      tensors filtered as SGLang does) and goes back to `scheduler.waiting_queue` through
      `_add_request_to_queue(req, is_retracted=True)`; the policy decides when it resumes.
    - Requests that are finished, mid chunked prefill, not yet decoding (no output token
      processed, e.g. their prefill is still in flight under overlap scheduling) or unknown rids
      are skipped; only what was really retracted is returned (in batch order).
    - Unlike SGLang's memory retraction it may empty the batch (the freed slots go to waiting
      requests on the next pass) and does not touch the new-token-ratio estimate.
    - Not supported (returns []): PD disaggregation and diffusion LLMs.
    """
    if not rids or running_batch is None or running_batch.is_empty():
        return []
    if getattr(scheduler, "disaggregation_mode", DisaggregationMode.NULL) != DisaggregationMode.NULL:
        logger.warning("policy preemption is not supported with PD disaggregation; ignored")
        return []
    if getattr(scheduler, "dllm_config", None) is not None:
        logger.warning("policy preemption is not supported for diffusion LLMs; ignored")
        return []

    wanted = set(rids)
    in_flight = _in_flight_prefill(scheduler)
    victims: list[int] = []
    keep: list[int] = []
    for i, req in enumerate(running_batch.reqs):
        if req.rid in wanted:
            blocker = retraction_blocker(scheduler, req, in_flight)
            if blocker is None:
                victims.append(i)
                continue
            logger.debug("not retracting %s: %s", req.rid, blocker)
        keep.append(i)
    if not victims:
        return []

    retracted = [running_batch.reqs[i] for i in victims]
    offload = getattr(scheduler, "decode_offload_manager", None)
    if offload is not None:  # as SGLang's retraction: pending offload copies may read the KV freed next
        offload.drain_before_retraction()
    available_before = scheduler.token_to_kv_pool_allocator.available_size()
    for i in victims:
        # SGLang's own path: free KV + req slot without radix insertion, reset_for_retract().
        # remaining count 0: we retract by policy, not for memory, so nothing extra is evicted.
        running_batch.release_req(i, 0)
    running_batch.filter_batch(keep_indices=keep)
    running_batch.batch_is_full = False

    _record_metrics(scheduler, retracted)
    for req in retracted:
        scheduler._add_request_to_queue(req, is_retracted=True)
    logger.info(
        "policy preemption: retracted %d request(s) %s, #new_tokens_gained: %d",
        len(retracted),
        [r.rid for r in retracted],
        scheduler.token_to_kv_pool_allocator.available_size() - available_before,
    )
    return retracted


def _record_metrics(scheduler: Any, retracted: list) -> None:
    reporter = getattr(scheduler, "metrics_reporter", None)
    if reporter is None:
        return
    try:
        reporter.num_retracted_reqs = len(retracted)
        if reporter.enable_metrics:
            reporter.metrics_collector.increment_retracted_reqs(
                num_retracted_reqs=len(retracted),
                num_retracted_input_tokens=sum(len(r.origin_input_ids) for r in retracted),
                num_retracted_output_tokens=sum(len(r.output_ids) for r in retracted),
            )
    except Exception:  # metrics must never break scheduling
        logger.debug("retraction metrics not recorded", exc_info=True)
