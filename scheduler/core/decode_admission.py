"""A PD decode worker's admission cap, deadline-based (PolyServe §2.3, §4.5).

The per-step cap (`batch_limits`) admits only as many requests as keep every step within the
tightest TPOT among them. Under the deadline-based SLO that is stricter than the target: token
g+k of a request is due at due(g) + (k-1)·TPOT, so a request with `s` seconds to its next token
stays on schedule for its next R tokens at any constant step of at most
min over k ≤ R of (s + (k-1)·TPOT)/k (TPOT + (s - TPOT)/R once s ≥ TPOT). With the per-step cap
alone a transferred request waits out its neighbours' banked slack in the queue, where its own
slack (its first token's) runs out; PolyServe's engines admit what its router sends and let the
DSLO absorb the longer steps.

R is at most `HORIZON_TOKENS`, one by default: a step may last until the first on-time
request's next token is due. Each pass recomputes the budget from the slack left, so once the
residents' slack is spent the per-step cap is back, the batch stops growing and shrinks as
requests finish; a resident may be late in between. Spreading the slack over more tokens
guards against that, but in the simulated PD headline it kept transferred requests waiting past
their TTFT and lost more requests than it saved (benchmarks/RESULTS.md, PolyServe).

The cap never falls below the per-step one: where nobody has banked slack it is that cap.
"""

from __future__ import annotations

import numpy as np

from scheduler.core.batch_limits import STEP_MARGIN, batch_levers
from scheduler.core.columns import ViewColumns
from scheduler.core.estimates import DEFAULT_OUTPUT_LEN
from scheduler.core.pass_columns import columns_of
from scheduler.core.types import EngineView, PerfModel

# Tokens ahead a request's slack is spread over (at most its remaining output bound; None: all of it).
HORIZON_TOKENS: float | None = 1.0


def horizon_step(
    view: EngineView, columns: ViewColumns | None = None, horizon: float | None = HORIZON_TOKENS
) -> float | None:
    """Seconds a constant decode step may last and keep every on-time latency request, running
    or waiting, on its deadline-based schedule for its next min(tokens left, `horizon`) tokens
    (None: no such request). A request already late constrains nothing (its TPOT is lost); one
    without a TTFT has no schedule to bank on, so its TPOT is its step."""
    c = columns if columns is not None else columns_of(view)
    tpot = c.tpot_ms / 1000.0
    slo = ~c.be_tier & ~np.isnan(tpot)
    if not slo.any():
        return None
    due = c.token_due(c.generated)  # the next token's due time; nan without a TTFT
    slack = due - view.now
    anchored = ~np.isnan(due)
    keep = slo & (~anchored | (slack >= 0))
    if not keep.any():
        return None
    left = np.maximum(c.total_out(DEFAULT_OUTPUT_LEN) - c.generated, 1.0)
    if horizon is not None:
        left = np.minimum(left, max(horizon, 1.0))
    t, s, r = tpot[keep], slack[keep], left[keep]
    step = np.where(np.isnan(s), t, np.where(s >= t, t + (s - t) / r, s))
    return float(step.min())


def decode_cap(
    view: EngineView,
    perf: PerfModel,
    tokens_per_step: float = 1.0,
    columns: ViewColumns | None = None,
    horizon: float | None = HORIZON_TOKENS,
) -> int | None:
    """Running-batch cap of a PD decode worker: the largest batch whose predicted step fits
    `horizon_step` (with STEP_MARGIN to spare), never below the per-step TPOT cap; None where
    that cap is None (no TPOT target, or none a batch of one meets: leave it to the engine)."""
    c = columns if columns is not None else columns_of(view)
    per_step = batch_levers(view, perf, tokens_per_step, columns=c).batch_cap
    if per_step is None:
        return None
    step = horizon_step(view, c, horizon)
    if step is None:
        return per_step
    nw = c.n_waiting
    decodes = len(view.running)
    if decodes:
        per_req_kv = c.running_kv / decodes
    else:
        per_req_kv = float(c.prompt[:nw].sum()) / max(nw, 1)
    budget = step * tokens_per_step / (1 + STEP_MARGIN)
    return max(per_step, perf.max_batch_within(budget, per_req_kv, limit=view.max_running_requests))
