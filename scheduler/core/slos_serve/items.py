"""From request views to the DP's terms: prefill deadline, TPOT tier, tokens and memory.

SLOs-Serve reasons about a prefill deadline plus a decode rate. Latency requests carry both
directly (DSLO: first token by arrival + TTFT, token k by + k·TPOT). Deadline and compound
requests only have an end-to-end deadline, so we split what is left of it: a share for the
prefill, the rest spread over the predicted remaining output as an effective TPOT. TPOTs are
a client's explicit TPOT is used as is (clients pick from a few classes), while derived TPOTs,
which are continuous, are rounded down onto a geometric ladder so the DP sees few tiers
(rounding down is safe: it only asks for faster decoding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scheduler.core.estimates import DEFAULT_OUTPUT_LEN, request_deadline, token_due
from scheduler.core.slo import SloClass
from scheduler.core.types import RequestView

TIERS_PER_OCTAVE = 4
MIN_DERIVED_TPOT_S = 0.01  # a deadline needing faster decoding than this is treated as lost


def quantize_tpot(tpot_s: float) -> float:
    """Largest ladder value 2^(k/4) ms not above tpot_s."""
    ms = max(tpot_s * 1000.0, 1e-3)
    k = math.floor(math.log2(ms) * TIERS_PER_OCTAVE + 1e-9)
    return 2.0 ** (k / TIERS_PER_OCTAVE) / 1000.0


def quantize_tpots(tpot_s: np.ndarray) -> np.ndarray:
    """`quantize_tpot` of each entry, with the same float steps."""
    ms = np.maximum(tpot_s * 1000.0, 1e-3)
    k = np.floor(np.log2(ms) * TIERS_PER_OCTAVE + 1e-9)
    return 2.0 ** (k / TIERS_PER_OCTAVE) / 1000.0


def derived_tiers(tpot_s: np.ndarray, floor_s: float) -> np.ndarray:
    """`derived_tier` of each entry (nan: None)."""
    return np.where(tpot_s < floor_s, np.nan, quantize_tpots(tpot_s))


def expected_outputs(
    predicted: np.ndarray, max_new: np.ndarray, generated: np.ndarray, default_tokens: int
) -> np.ndarray:
    """`expected_output` of requests as columns (nan: no prediction, no cap)."""
    capped = np.where(np.isnan(max_new), float(default_tokens), np.minimum(max_new, default_tokens))
    total = np.where(np.isnan(predicted), capped, predicted)
    return np.maximum(1.0, total - generated)


def expected_output(r: RequestView, default_tokens: int) -> float:
    """Remaining output tokens the DP plans for: the analyzer's bound, else the client cap up
    to the default, else the default. A planning length, not estimates.output_bound's upper
    bound: a cap alone counts only up to the default."""
    if r.predicted_output_len is not None:
        total = r.predicted_output_len
    elif r.max_new_tokens is not None:
        total = min(r.max_new_tokens, default_tokens)
    else:
        total = default_tokens
    return max(1.0, total - r.generated)


def prefill_deadline(r: RequestView, now: float, prefill_share: float = 0.2) -> float | None:
    """Just the prefill deadline (cheap: used to rank a deep queue before full demands)."""
    cls = r.slo.slo_class
    if cls is SloClass.LATENCY:
        return token_due(r.slo, r.arrival, 0)
    if cls is SloClass.DEADLINE or cls is SloClass.COMPOUND:
        end = request_deadline(r)
        return None if end is None else now + prefill_share * max(0.0, end - now)
    return None


def derived_tier(tpot_s: float, floor_s: float) -> float | None:
    """A deadline's effective TPOT; None when no batch could be that fast (it would
    otherwise drag every other request's batch time down with it)."""
    return None if tpot_s < floor_s else quantize_tpot(tpot_s)


@dataclass(frozen=True)
class Demand:
    deadline: float  # absolute prefill deadline; <= now: the target is already lost
    tpot: float | None  # quantized TPOT in seconds, None: no decode target
    prefill_tokens: int
    mem_tokens: int


def demand(
    r: RequestView,
    now: float,
    default_output: int = DEFAULT_OUTPUT_LEN,
    prefill_share: float = 0.2,
    min_tpot_s: float = MIN_DERIVED_TPOT_S,
) -> Demand | None:
    """The request's SLO in DP terms, or None when it has no target (best effort)."""
    if r.best_effort_tier and r.started:
        return None  # declined earlier and already running: it decodes without a guarantee
    out = expected_output(r, default_output)
    prefill = max(1, r.prompt_len - r.prefix_cached)
    mem = prefill + int(math.ceil(out))
    cls = r.slo.slo_class
    if cls is SloClass.LATENCY:
        first_due = token_due(r.slo, r.arrival, 0)
        if first_due is None:  # no TTFT: no token is ever due
            return None
        tpot = None if r.slo.tpot_ms is None else r.slo.tpot_ms / 1000.0
        return Demand(first_due, tpot, prefill, mem)
    if cls in (SloClass.DEADLINE, SloClass.COMPOUND):
        end = request_deadline(r)
        if end is None:
            return None
        left = end - now
        if left <= 0:
            return Demand(now, None, prefill, mem)
        if r.started:
            return Demand(now, derived_tier(left / out, min_tpot_s), prefill, mem)
        return Demand(
            now + prefill_share * left, derived_tier((1 - prefill_share) * left / out, min_tpot_s), prefill, mem
        )
    return None
