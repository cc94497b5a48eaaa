"""Batch knobs every SLO policy gets from the performance model, unless its plan sets them.

- Running-batch cap (SLOs-Serve Alg. 2, PolyServe §3.4/§4.5): the largest decode batch whose
  predicted iteration time still meets the tightest per-token target among running and
  waiting latency requests.
- Prefill chunk (PolyServe §4.7, continuous chunked-prefill prediction): the largest chunk that,
  mixed with the current decodes, keeps that iteration within the tightest TPOT; but at least
  what the most urgent waiting request needs to make its TTFT, and never above the start-up size.
- A target no batch can meet (not even one request) sets no knobs: capping would only starve.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core.types import EngineView, PerfModel, RequestView

MIN_CHUNK = 16


@dataclass(frozen=True)
class BatchKnobs:
    batch_cap: int | None
    chunk_size: int | None
    tightest_tpot_s: float | None


def _tpot_s(r: RequestView) -> float | None:
    return None if r.slo.tpot_ms is None or r.best_effort_tier else r.slo.tpot_ms / 1000.0


def tightest_tpot(view: EngineView) -> float | None:
    values = [t for r in (*view.running, *view.waiting) if (t := _tpot_s(r)) is not None]
    return min(values) if values else None


def _ttft_need(view: EngineView, perf: PerfModel, decodes: int, kv: int, limit: int) -> int:
    """Tokens per step the most urgent waiting request needs to finish its prefill on time."""
    need = 0
    for r in view.waiting:
        if r.slo.ttft_ms is None or r.best_effort_tier:
            continue
        remaining = max(r.prompt_len - r.prefix_cached, 1)
        slack = r.arrival + r.slo.ttft_ms / 1000.0 - view.now
        step = perf.step_time(min(remaining, limit), decodes, kv)
        if slack <= step:
            return limit  # already late or tight: prefill it as fast as possible
        steps_left = max(int(slack / step), 1)
        need = max(need, -(-remaining // steps_left))
    return need


def batch_knobs(view: EngineView, perf: PerfModel, tokens_per_step: float = 1.0) -> BatchKnobs:
    """`tokens_per_step`: output tokens a decode gains per batch (Acc(s) under speculation, with
    `perf` then costing the drafts and verify tokens): the batch may last that many TPOTs."""
    tightest = tightest_tpot(view)
    if tightest is None:
        return BatchKnobs(None, None, None)
    tpot = tightest * tokens_per_step
    decodes = len(view.running)
    kv = sum(r.prompt_len + r.generated for r in view.running)
    per_req_kv = kv / decodes if decodes else float(sum(r.prompt_len for r in view.waiting) / max(len(view.waiting), 1))
    if perf.step_time(0, 1, int(per_req_kv)) > tpot:
        # Not even one request can meet the tightest target: throttling everyone else would
        # not save it, so leave batch and chunk to SGLang.
        return BatchKnobs(None, None, tightest)
    cap = perf.max_batch_within(tpot, per_req_kv, limit=view.max_running_requests)
    chunk = None
    if view.chunk_size > 0:
        fit = perf.max_chunk_within(tpot, decodes, kv, view.chunk_size)
        need = _ttft_need(view, perf, decodes, kv, view.chunk_size)
        chunk = min(view.chunk_size, max(fit, need, MIN_CHUNK))
    return BatchKnobs(max(cap, 1), chunk, tightest)
