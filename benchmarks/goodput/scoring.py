"""Score one run from what the client saw, so every server and policy is judged the same way.

The server's own reports are not trusted: a stock server has none, and a policy must not grade
itself. Each `RequestRecord` becomes an `SloOutcome` through `scheduler.core.outcome.evaluate`,
and the goodput definitions come from `scheduler.core.goodput`, so "attained" here means what it
means in the server's counters.

Conventions (why they are what they are):
- A request is an *SLO request* unless its class is "none" or its SLO parses to best-effort.
  Only SLO requests count in attainment and goodput; every request counts in throughput.
- A never-sent request (an earlier stage failed, or the run ended) is an unfinished miss: the
  workload asked for it, so not sending it is a failure of the system under test.
- A compound stage's deadline runs from its program's first send, not its own send.
- Service-gain potential values each request at its trace's true output length, so a policy
  cannot raise its gain ratio by cutting answers short or never starting them.
- TTFT counts every request that got a first token, TPOT every one with two or more tokens, and
  E2E finished requests only (an unfinished request has no end to measure).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from benchmarks.goodput.records import PlannedRequest, RequestRecord
from scheduler.core.estimates import absolute_deadline, base_gain, deadline_seconds
from scheduler.core.gain import outcome_gain
from scheduler.core.goodput import summarize
from scheduler.core.outcome import SloOutcome, evaluate
from scheduler.core.slo import SloClass, SloSpec, parse_slo

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Scored:
    """One record with its outcome and the numbers the run totals need."""

    record: RequestRecord
    outcome: SloOutcome
    gain: float
    potential: float
    output_tokens: int = 0  # what the totals need of the record's token times, kept so a
    tpot_s: float | None = None  # long simulation can score each request as it ends and drop them
    last_token_s: float | None = None

    @property
    def is_slo(self) -> bool:
        return not self.outcome.slo.is_best_effort


def _spec(record: RequestRecord) -> SloSpec:
    if record.cls == "none" or not record.slo:
        return SloSpec()
    return parse_slo(record.slo)


def score_record(record: RequestRecord, alpha: float = 1.0) -> Scored:
    """Outcome and realised / potential service gain of one record (exact per-token gain)."""
    spec = _spec(record)
    arrival = record.send_s if record.send_s is not None else record.scheduled_s
    tokens = record.token_s if record.sent else []
    if record.finish_s is not None:
        finish = record.finish_s
    else:
        finish = tokens[-1] if tokens else arrival
    deadline_abs = ttlt = None
    if spec.slo_class is SloClass.COMPOUND and record.program_start_s is not None:
        rel = record.program_deadline_s if record.program_deadline_s is not None else deadline_seconds(spec)
        deadline_abs = absolute_deadline(rel, arrival, program_arrival=record.program_start_s)
        ttlt = finish - record.program_start_s
    outcome = evaluate(spec, arrival, tokens, finish, finished=record.finished, deadline_abs=deadline_abs)
    gain = outcome_gain(outcome, record.prompt_tokens, alpha=alpha, token_times=tokens, arrival=arrival, ttlt_s=ttlt)
    full = max(record.target_output_tokens, len(tokens))
    n = record.output_tokens
    tpot = (record.token_s[-1] - record.token_s[0]) / (n - 1) if record.sent and n > 1 else None
    last = record.token_s[-1] if record.token_s else None
    return Scored(record, outcome, gain, base_gain(record.prompt_tokens, full, spec.weight), n, tpot, last)


@dataclass
class RunMetrics:
    """Every number of one run; per-second values are None when the run has no duration."""

    requests: int
    slo_requests: int
    sent: int
    finished: int
    dropped: int  # sent, answered by the server with an abort (e.g. an SLO admission drop)
    lost: int  # sent, never answered, not cut: must be 0 on a healthy server
    cut: int  # given up by the client at the drain timeout
    never_sent: int
    duration_s: float | None
    output_tokens: int
    finished_rps: float | None
    throughput_tok_s: float | None
    attained: int
    goodput_rps: float | None
    attainment: float
    attainment_by_class: dict[str, float]
    attainment_by_tier: dict[str, float]
    dslo_tokens: int
    dslo_tok_s: float | None
    jitserve_tokens: int
    jitserve_tok_s: float | None
    service_gain: float
    service_gain_potential: float
    service_gain_ratio: float | None
    ttft_ms: dict[str, float | None]
    tpot_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]
    # The client's first-token wait the server's own clock does not see (client -> HTTP edge, and
    # scheduler -> detokenizer -> HTTP -> client): host transit, not scheduling. Empty when the
    # server reports no TTFT of its own (stock SGLang).
    host_transit_ms: dict[str, float | None]
    requests_by_class: dict[str, int]
    requests_by_tier: dict[str, int]
    alpha: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: NaN and infinities become None (json.dumps(allow_nan=False) accepts it)."""
        return _json_safe(asdict(self))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def percentiles_ms(values_s: Sequence[float]) -> dict[str, float | None]:
    """p50/p90/p99 in ms (numpy's linear interpolation); None for an empty set."""
    if not values_s:
        return {f"p{p}": None for p in PERCENTILES}
    found = np.percentile(np.asarray(values_s, dtype=float) * 1000.0, PERCENTILES)
    return {f"p{p}": float(v) for p, v in zip(PERCENTILES, found)}


def host_transit_s(r: RequestRecord) -> float | None:
    """The client's TTFT (from its send) minus the server's own (from its edge stamp)."""
    if r.send_s is None or not r.token_s or r.server_ttft_ms is None:
        return None
    return r.token_s[0] - r.send_s - r.server_ttft_ms / 1000.0


def makespan(records: Iterable[RequestRecord]) -> float | None:
    """First send to last finish (None when nothing was sent or nothing ended after it)."""
    sent = [r for r in records if r.sent]
    if not sent:
        return None
    start = min(r.send_s for r in sent)  # type: ignore[type-var]
    ends = [r.finish_s for r in sent if r.finish_s is not None] or [t for r in sent for t in r.token_s[-1:]]
    span = max(ends, default=start) - start
    return span if span > 0 else None


def makespan_scored(scored: Iterable[Scored]) -> float | None:
    """`makespan` of the scored records (their token times may have been dropped)."""
    sent = [s for s in scored if s.record.sent]
    if not sent:
        return None
    start = min(s.record.send_s for s in sent)  # type: ignore[type-var]
    ends = [s.record.finish_s for s in sent if s.record.finish_s is not None] or [
        s.last_token_s for s in sent if s.last_token_s is not None
    ]
    span = max(ends, default=start) - start  # type: ignore[type-var]
    return span if span > 0 else None


def _rate(value: float, duration_s: float | None) -> float | None:
    return value / duration_s if duration_s else None


def _attainment_by(groups: Iterable[tuple[str, bool]]) -> dict[str, float]:
    seen: dict[str, list[bool]] = defaultdict(list)
    for key, ok in groups:
        seen[key].append(ok)
    return {k: sum(v) / len(v) for k, v in sorted(seen.items())}


def score(records: Sequence[RequestRecord], duration_s: float | None = None, alpha: float = 1.0) -> RunMetrics:
    """All metrics of one run; `duration_s` overrides the makespan as the per-second divisor."""
    return score_all([score_record(r, alpha) for r in records], duration_s, alpha)


def score_all(scored: Sequence[Scored], duration_s: float | None = None, alpha: float = 1.0) -> RunMetrics:
    """`score` of records already scored one by one (`score_record`), with the same `alpha`."""
    records = [s.record for s in scored]
    duration = duration_s if duration_s is not None else makespan_scored(scored)
    outcomes = [s.outcome for s in scored]
    summary = summarize(outcomes, [r.prompt_tokens for r in records], alpha=alpha, duration_s=duration)
    slo = [s for s in scored if s.is_slo]
    output_tokens = sum(s.output_tokens for s in scored)
    finished = [r for r in records if r.finished]
    gain = sum(s.gain for s in scored)
    potential = sum(s.potential for s in scored)
    tpots = [s.tpot_s for s in scored if s.tpot_s is not None]
    return RunMetrics(
        requests=len(records),
        slo_requests=len(slo),
        sent=sum(r.sent for r in records),
        finished=len(finished),
        dropped=sum(r.sent and r.finish_s is not None and not r.finished for r in records),
        lost=sum(r.lost for r in records),
        cut=sum(r.cut for r in records),
        never_sent=sum(not r.sent for r in records),
        duration_s=duration,
        output_tokens=output_tokens,
        finished_rps=_rate(len(finished), duration),
        throughput_tok_s=_rate(output_tokens, duration),
        attained=summary.attained,
        goodput_rps=_rate(summary.attained, duration),
        attainment=summary.attainment,
        attainment_by_class=_attainment_by((s.record.cls, s.outcome.attained) for s in slo),
        attainment_by_tier=_attainment_by((s.record.tier, s.outcome.attained) for s in slo if s.record.tier),
        dslo_tokens=summary.dslo_tokens,
        dslo_tok_s=_rate(summary.dslo_tokens, duration),
        jitserve_tokens=summary.jitserve_tokens,
        jitserve_tok_s=_rate(summary.jitserve_tokens, duration),
        service_gain=gain,
        service_gain_potential=potential,
        service_gain_ratio=gain / potential if potential else None,
        ttft_ms=percentiles_ms([s.outcome.ttft_s for s in scored if s.record.sent and s.outcome.ttft_s is not None]),
        tpot_ms=percentiles_ms(tpots),
        e2e_ms=percentiles_ms([r.finish_s - r.send_s for r in finished if r.send_s is not None]),  # type: ignore[operator]
        host_transit_ms=percentiles_ms([t for r in records if (t := host_transit_s(r)) is not None]),
        requests_by_class=dict(sorted(Counter(r.cls for r in records).items())),
        requests_by_tier=dict(sorted(Counter(r.tier for r in records if r.tier).items())),
        alpha=alpha,
    )


def timeline(records: Sequence[RequestRecord], bin_s: float, alpha: float = 1.0) -> list[dict[str, float | int]]:
    """Per bin [k·bin_s, (k+1)·bin_s) from the run start: goodput (SLO requests attained that
    finished in the bin, per second), finished requests/s, output tokens/s, and the queue at the
    bin's end (sent, no final chunk yet: what the client has in flight)."""
    if not bin_s > 0:
        raise ValueError(f"bin_s must be > 0, got {bin_s}")
    events = [t for r in records for t in (r.send_s, r.finish_s, *r.token_s) if t is not None]
    if not events:
        return []
    bins = int(max(events) // bin_s) + 1
    attained, done, tokens = [0] * bins, [0] * bins, [0] * bins
    for s in (score_record(r, alpha) for r in records):
        r = s.record
        if r.finished and r.finish_s is not None:
            k = int(r.finish_s // bin_s)
            done[k] += 1
            attained[k] += s.is_slo and s.outcome.attained
        for t in r.token_s if r.sent else ():
            tokens[int(t // bin_s)] += 1
    # In flight just before a bin's end: sent before it, minus those whose final chunk came before it.
    sends = np.sort([r.send_s for r in records if r.send_s is not None])
    ends = np.sort([r.finish_s for r in records if r.send_s is not None and r.finish_s is not None])
    edges = (np.arange(bins) + 1) * bin_s
    queue = np.searchsorted(sends, edges, side="left") - np.searchsorted(ends, edges, side="left")
    return [
        {
            "t_s": k * bin_s,
            "goodput_rps": attained[k] / bin_s,
            "finished_rps": done[k] / bin_s,
            "throughput_tok_s": tokens[k] / bin_s,
            "queue": int(queue[k]),
        }
        for k in range(bins)
    ]


def check_consistency(m: RunMetrics) -> list[str]:
    """The invariants any honest run satisfies; a non-empty list means the scorer or the records
    are wrong (e.g. a record flagged both cut and never sent is counted twice)."""
    bad: list[str] = []
    eps = 1e-9
    if m.attained > m.finished:
        bad.append(f"attained {m.attained} > finished {m.finished}")
    if m.goodput_rps is not None and m.finished_rps is not None and m.goodput_rps > m.finished_rps + eps:
        bad.append(f"goodput {m.goodput_rps} req/s > finished throughput {m.finished_rps} req/s")
    rates = {"attainment": m.attainment, **{f"attainment[{k}]": v for k, v in m.attainment_by_class.items()}}
    rates.update({f"attainment_by_tier[{k}]": v for k, v in m.attainment_by_tier.items()})
    bad += [f"{name} {v} outside [0, 1]" for name, v in rates.items() if not 0.0 <= v <= 1.0]
    parts = m.finished + m.dropped + m.lost + m.cut + m.never_sent
    if parts != m.requests:
        bad.append(f"finished + dropped + lost + cut + never_sent = {parts} != requests {m.requests}")
    if m.sent + m.never_sent != m.requests:
        bad.append(f"sent + never_sent = {m.sent + m.never_sent} != requests {m.requests}")
    if m.dslo_tokens > m.output_tokens:
        bad.append(f"DSLO tokens {m.dslo_tokens} > output tokens {m.output_tokens}")
    if m.service_gain > m.service_gain_potential * (1 + eps) + eps:
        bad.append(f"service gain {m.service_gain} > potential {m.service_gain_potential}")
    return bad


def offered_window(planned: list[PlannedRequest]) -> float | None:
    """Seconds from the first to the last planned arrival: goodput is per offered second, the
    same divisor for every target, so a policy is not charged for a longer drain (None when the
    whole workload arrives at once: then the makespan divides)."""
    arrivals = [p.req.arrival_s for p in planned]
    span = max(arrivals) - min(arrivals) if arrivals else 0.0
    return span if span > 0 else None


def auto_bin_s(duration_s: float | None) -> float:
    """About 30 bins per run, at least a quarter second."""
    return max(0.25, round((duration_s or 0.0) / 30.0, 2))
