"""The routed request's estimates, read through the core's one estimates module.

A `RouteRequest` names its fields for the router (`arrival_s`, `predicted_output_tokens`); these
helpers hand them to scheduler.core.estimates so a router reads a length bound or a deadline
exactly as the engine's policies do. Deadlines are absolute router-clock times. The router's
due time for a whole answer is `estimates.answer_due` (its latency-class rule is named there).
"""

from __future__ import annotations

from router.routing_views import RouteRequest
from scheduler.core.estimates import DEFAULT_OUTPUT_LEN, output_bound
from scheduler.core.slo import SloClass


def output_tokens(req: RouteRequest, default: int = DEFAULT_OUTPUT_LEN) -> int:
    """L_out, `estimates.output_bound`: the analyzer's prediction (the router's is already at
    most the client's cap), else the client's cap, else `default`; at least one token."""
    return int(output_bound(req.predicted_output_tokens, req.max_new_tokens, 0, default))


def remaining_tokens(req: RouteRequest, generated: int, default: int = DEFAULT_OUTPUT_LEN) -> int:
    """Tokens still to come. Once the prediction is overrun, the client's cap bounds what is left
    (else 1), where `estimates.output_bound` would count one more token."""
    left = output_tokens(req, default) - generated
    if left <= 0 and req.max_new_tokens is not None:
        left = req.max_new_tokens - generated
    return max(left, 1)


def counted_tokens(req: RouteRequest, l_out: int) -> int:
    """Output tokens whose time counts against `estimates.answer_due`: only the first for a
    TTFT-only SLO."""
    slo = req.slo
    if slo.slo_class is SloClass.LATENCY and slo.tpot_ms is None:
        return 1
    return l_out
