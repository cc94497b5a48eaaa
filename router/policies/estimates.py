"""Request-side numbers the SLO-aware policies share: output length and deadlines.

Kept in one place so every policy reads an SLO the same way: deadlines are absolute router-clock
times (arrival + target). For compound stages the router only knows this call's arrival, so the
program deadline is counted from it (conservative only if the router stamps the program's first
arrival into `arrival_s`, which it should).
"""

from __future__ import annotations

from router.views import RouteRequest, WorkerView
from scheduler.core.slo import SloClass

# Same assumption as the core scheduler's DEFAULT_OUTPUT_LEN: used when the request carries
# neither a prediction nor a client cap (a typical chat answer; policies only need an order).
DEFAULT_OUTPUT_TOKENS = 256


def output_tokens(req: RouteRequest, default: int = DEFAULT_OUTPUT_TOKENS) -> int:
    """L_out: the analyzer's prediction, else the client's cap, else `default`."""
    for value in (req.predicted_output_tokens, req.max_new_tokens):
        if value is not None and value > 0:
            return int(value)
    return default


def remaining_tokens(req: RouteRequest, generated: int, default: int = DEFAULT_OUTPUT_TOKENS) -> int:
    """Tokens still to come; once the prediction is overrun, the cap bounds what is left (else 1)."""
    left = output_tokens(req, default) - generated
    if left <= 0 and req.max_new_tokens is not None:
        left = req.max_new_tokens - generated
    return max(left, 1)


def deadline_s(req: RouteRequest, l_out: int) -> float | None:
    """Absolute time by which the whole answer is due, or None for best effort.

    Deadline and compound classes: arrival + deadline_ms. Latency class with a TPOT: the DSLO due
    time of the last token, arrival + TTFT + L_out·TPOT. Latency with TTFT only: arrival + TTFT
    (only the first token has a target; see `counted_tokens`)."""
    slo = req.slo
    if slo.slo_class in (SloClass.DEADLINE, SloClass.COMPOUND) and slo.deadline_ms is not None:
        return req.arrival_s + slo.deadline_ms / 1000.0
    if slo.slo_class is SloClass.LATENCY and slo.ttft_ms is not None:
        return req.arrival_s + (slo.ttft_ms + l_out * (slo.tpot_ms or 0.0)) / 1000.0
    return None


def counted_tokens(req: RouteRequest, l_out: int) -> int:
    """Output tokens whose time counts against `deadline_s`: only the first for a TTFT-only SLO."""
    slo = req.slo
    if slo.slo_class is SloClass.LATENCY and slo.tpot_ms is None:
        return 1
    return l_out


def e2e_estimate(w: WorkerView, prefill_tokens: float, decode_tokens: float, queue: bool = True) -> float:
    """GoodServe Eq. 2: q_g + p_g·(prefill tokens) + d_g·(decode tokens), seconds from now."""
    q = w.queue_delay_s if queue else 0.0
    return q + w.prefill_s_per_token * max(prefill_tokens, 0.0) + w.decode_s_per_token * decode_tokens
