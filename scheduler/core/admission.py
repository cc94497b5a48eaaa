"""Admission under overload: how long the work ahead of a waiting request takes to drain, and
which requests will certainly miss their SLO.

Both are predictions on the engine's perf model from one picture of the queue in the plan's
service order (listed requests first, unlisted ones in queue order, the best-effort tier last):

- a request starts once the prefill of everything ahead of it has run (with the running batch's
  decodes riding along) and, when every batch slot is taken, once enough running requests have
  finished to free one (a fluid model: the slots drain the work ahead together);
- with `on_infeasible: reject`, a waiting request is dropped as `slo_infeasible` when even the
  prefill work ahead of it plus its own prefill lands past its first-token due time (latency
  class) or its end-to-end deadline (deadline and compound classes), by more than a margin that
  absorbs the model's error. The wait for a free slot is left out of that bound on purpose: a
  preemptive policy may free one at once, so the check never rejects a request that could
  still make it. Without a trusted model only a due time already passed counts.

The predicted wait is what a shed request's Retry-After is computed from, so a client that
waits it out comes back to a drained queue, not to a guess.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.core.columns import ViewColumns
from scheduler.core.estimates import output_bound, request_deadline
from scheduler.core.queue_timeout import QUEUE_TIMEOUT_REASON
from scheduler.core.slo import SloClass
from scheduler.core.types import EngineView, PerfModel, RequestView
from wire import QUEUE_TIMEOUT, SLO_INFEASIBLE

SLO_INFEASIBLE_REASON = SLO_INFEASIBLE  # the plan's drop reason is the public one
# A predicted first token may overshoot its due time by this share of the request's budget before
# the miss counts as certain: the perf model predicts steps within ~10 % on a profiled card.
FEASIBILITY_MARGIN = 0.1
NO_CHUNK_TOKENS = 8192  # the prefill step size assumed when the engine does not chunk


def service_order(
    waiting: Sequence[RequestView], order: Sequence[str] | None, best_effort: Collection[str]
) -> list[int]:
    """Indices into `waiting` in the order the engine serves them (as the adapter orders its queue)."""
    position = {r.rid: i for i, r in enumerate(waiting)}
    if len(position) == len(waiting):
        ranked = [position.pop(rid) for rid in order or () if rid in position]
        ranked += position.values()
    else:  # a rid queued twice: each entry keeps its place, the later one right behind the first
        repeats: dict[str, list[int]] = {}
        for i, r in enumerate(waiting):
            repeats.setdefault(r.rid, []).append(i)
        ranked = [i for rid in order or () if rid in repeats for i in repeats.pop(rid)]
        ranked += [i for indices in repeats.values() for i in indices]
    if best_effort:
        ranked = [i for i in ranked if waiting[i].rid not in best_effort] + [
            i for i in ranked if waiting[i].rid in best_effort
        ]
    return ranked


@dataclass(frozen=True)
class Backlog:
    """The queue's predicted drain, in service order."""

    order: list[int]  # indices into view.waiting
    prefill_ahead_s: np.ndarray  # per position: the prefill of everything ahead of it
    start_s: np.ndarray  # per position: seconds from now until it starts
    drain_s: float  # seconds from now until a request joining at the back would start

    def start_of(self, view: EngineView) -> dict[str, float]:
        return {view.waiting[i].rid: float(self.start_s[k]) for k, i in enumerate(self.order)}


def _uncached(r: RequestView) -> int:
    return max(0, r.prompt_len + r.generated - r.prefix_cached)


def _remaining_output(r: RequestView) -> float:
    return output_bound(r.predicted_output_len, r.max_new_tokens, r.generated) - r.generated


def backlog(
    view: EngineView,
    perf: PerfModel,
    order: Sequence[str] | None = None,
    best_effort: Collection[str] = frozenset(),
) -> Backlog:
    """The work ahead of every waiting request, and of one joining now."""
    ranked = service_order(view.waiting, order, best_effort)
    queue = [view.waiting[i] for i in ranked]
    running = view.running
    chunk = view.chunk_size if view.chunk_size > 0 else NO_CHUNK_TOKENS
    decodes = len(running)
    kv_running = sum(r.prompt_len + r.generated for r in running)
    per_token_s = perf.step_time(chunk, decodes, kv_running) / chunk

    uncached = np.array([_uncached(r) for r in queue], dtype=float)
    tokens_ahead = np.concatenate(([0.0], np.cumsum(uncached)))
    prefill_ahead = tokens_ahead * per_token_s  # n + 1 entries: the last is a newcomer's

    # Slots: the configured batch, or fewer when the KV cache holds fewer such requests.
    work_out = np.array([_remaining_output(r) for r in queue], dtype=float)
    run_out = np.array([_remaining_output(r) for r in running], dtype=float)
    contexts = [r.prompt_len + r.generated + o for r, o in zip([*running, *queue], [*run_out, *work_out])]
    footprint = max(1.0, float(np.mean(contexts))) if contexts else 1.0
    slots = max(1, min(view.max_running_requests, int(view.total_kv_tokens // footprint) or 1))
    batch = max(1, min(slots, decodes + len(queue)))
    decode_step_s = perf.step_time(0, batch, int(batch * footprint))
    # A request holds its slot for its remaining output's decode steps; the slots drain the work
    # ahead together, and the one it takes is the one that frees first.
    work_ahead = (float(run_out.sum()) + np.concatenate(([0.0], np.cumsum(work_out)))) * decode_step_s
    mean_work = float(np.mean(np.concatenate((run_out, work_out)))) * decode_step_s if contexts else 0.0
    slot_wait = np.maximum(0.0, (work_ahead - (slots - 1) * mean_work) / slots)
    # The first releases are the running requests' own ends, in order (the fluid picture
    # spreads them evenly and would promise the first free slot too early).
    free_now = max(0, slots - decodes)
    releases = np.sort(run_out) * decode_step_s
    needed = np.arange(len(slot_wait)) - free_now  # releases a position waits for, minus one
    exact = (needed >= 0) & (needed < len(releases))
    slot_wait[exact] = np.maximum(slot_wait[exact], releases[needed[exact]])
    slot_wait[needed < 0] = 0.0
    start = np.maximum(prefill_ahead, slot_wait)
    return Backlog(
        order=ranked,
        prefill_ahead_s=prefill_ahead[:-1],
        start_s=start[:-1],
        drain_s=float(start[-1]),
    )


def _due(r: RequestView) -> float | None:
    """The due time the first token decides: the TTFT's for latency requests, the end-to-end
    deadline for deadline and compound requests (None: nothing to miss)."""
    cls = r.slo.slo_class
    if cls is SloClass.LATENCY and r.slo.ttft_ms is not None:
        return r.arrival + r.slo.ttft_ms / 1000.0
    if cls is SloClass.DEADLINE or cls is SloClass.COMPOUND:
        return request_deadline(r)
    return None


def certainly_late(
    view: EngineView,
    perf: PerfModel | None,
    order: Sequence[str] | None = None,
    best_effort: Collection[str] = frozenset(),
    margin: float = FEASIBILITY_MARGIN,
    columns: ViewColumns | None = None,
) -> list[str]:
    """Waiting requests with `on_infeasible: reject` that cannot make their SLO any more.

    `perf` None (no trusted model yet): only those whose due time has already passed. The
    candidates are found on `columns` when given, else on the views."""
    if columns is None:
        candidates = [i for i, r in enumerate(view.waiting) if r.slo.rejects_when_infeasible and not r.started]
    elif (rejects := columns.rejects[: columns.n_waiting]).any():
        candidates = (rejects & ~columns.started[: columns.n_waiting]).nonzero()[0].tolist()
    else:
        candidates = []
    if not candidates:
        return []
    now = view.now
    if perf is None:
        return [view.waiting[i].rid for i in candidates if (due := _due(view.waiting[i])) is not None and now > due]
    plan = backlog(view, perf, order, best_effort)
    position = {i: k for k, i in enumerate(plan.order)}
    chunk = view.chunk_size if view.chunk_size > 0 else NO_CHUNK_TOKENS
    decodes, kv_running = len(view.running), sum(r.prompt_len + r.generated for r in view.running)
    per_token_s = perf.step_time(chunk, decodes, kv_running) / chunk
    late = []
    for i in candidates:
        r = view.waiting[i]
        due = _due(r)
        if due is None:
            continue
        tokens = _uncached(r)  # its own prefill: at least one step
        own = max(tokens * per_token_s, perf.step_time(min(tokens, chunk), decodes, kv_running))
        earliest = now + float(plan.prefill_ahead_s[position[i]]) + own
        if earliest > due + margin * max(0.0, due - r.arrival):
            late.append(r.rid)
    return late


def retry_after_s(wait_s: float | None) -> int:
    """The Retry-After header's whole seconds for a predicted wait (at least 1: a client that
    retries at once only adds load)."""
    if wait_s is None or not math.isfinite(wait_s):
        return 1
    return max(1, math.ceil(wait_s))


def queue_is_full(
    queued: int, queued_tokens: int, new_tokens: int, max_requests: int | None, max_tokens: int | None
) -> bool:
    """Whether a new request of `new_tokens` prompt tokens overflows the waiting queue's bounds.
    A request larger than the token bound alone is still taken into an empty queue (it could
    never run otherwise)."""
    if max_requests is not None and queued + 1 > max_requests:
        return True
    return max_tokens is not None and queued > 0 and queued_tokens + new_tokens > max_tokens


def shed_reason(drop_reason: str) -> str:
    """The public `reason` (wire.SHED_REASONS) of a plan's drop reason."""
    return QUEUE_TIMEOUT if drop_reason == QUEUE_TIMEOUT_REASON else drop_reason
