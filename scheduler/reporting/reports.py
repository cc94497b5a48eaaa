"""Turns the per-token emit times the scheduler attaches to each output into the SLO report
every response carries, and records the outcome once per request."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler.core.estimates import absolute_deadline, deadline_seconds
from scheduler.core.outcome import evaluate
from scheduler.core.programs import ProgramTracker
from scheduler.core.slo import SloSpec
from scheduler.reporting.metrics import SloMetrics
from wire import REPORT_KEY, TIER_KEY, TOKEN_TS_KEY


@dataclass
class _Tracked:
    slo: SloSpec
    arrival: float
    token_times: list[float] = field(default_factory=list)
    best_effort: bool | None = None  # tier when its first token came out
    clamped: dict[str, Any] | None = None  # what the caller's key limits changed (slo_limits)


class SloReportKeeper:
    """Scores a request once, with compound-program deadlines (measured from the program's first
    arrival), counts the outcome by tier and keeps the recent reports by rid. The worker's book and
    the router's reports both score this way, so "attained" means the same behind a router."""

    def __init__(self, metrics: SloMetrics, keep_reports: int = 10_000) -> None:
        self.metrics = metrics
        self.programs = ProgramTracker()
        self._reports: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._keep = keep_reports

    def begin(self, slo: SloSpec, arrival: float) -> None:
        """A request arrived: a compound program's deadline runs from its first request."""
        if slo.program_id is not None:
            self.programs.arrival(slo.program_id, arrival)

    def score(
        self,
        rid: str,
        slo: SloSpec,
        arrival: float,
        token_times: Sequence[float],
        finished: bool,
        tier: str,
        now: float | None = None,
    ) -> dict[str, Any]:
        """The report (outcome + tier), recorded in the metrics and kept; an unfinished request
        (or one without tokens) ends at `now` (default: the current time)."""
        deadline_abs = None
        if slo.program_id is not None and slo.deadline_ms is not None:
            program_arrival = self.programs.arrival(slo.program_id, arrival)
            deadline_abs = absolute_deadline(deadline_seconds(slo), arrival, program_arrival)
        end = token_times[-1] if finished and token_times else (time.time() if now is None else now)
        outcome = evaluate(slo, arrival, token_times, end, finished=finished, deadline_abs=deadline_abs)
        self.metrics.record(outcome, tier)
        report = {**outcome.to_dict(), "tier": tier}
        self._reports[rid] = report
        while len(self._reports) > self._keep:
            self._reports.popitem(last=False)
        return report

    def report(self, rid: str) -> dict[str, Any] | None:
        return self._reports.get(rid)


class SloReportBook(SloReportKeeper):
    """Per-request accumulation keyed by rid, plus recent reports for the OpenAI routes, whose
    responses do not carry meta_info and get their `slo` block by response id."""

    def __init__(self, metrics: SloMetrics, keep_reports: int = 10_000) -> None:
        super().__init__(metrics, keep_reports)
        self._live: dict[str, _Tracked] = {}

    def start(self, rid: str, slo: SloSpec, arrival: float, clamped: dict[str, Any] | None = None) -> None:
        self._live[rid] = _Tracked(slo, arrival, clamped=clamped or None)
        self.begin(slo, arrival)

    def on_output(self, meta_info: dict[str, Any]) -> None:
        """Consume one output chunk's meta_info (incremental or cumulative token stamps); on the
        final chunk, replace the raw stamps with the report."""
        rid = meta_info.get("id")
        tracked = self._live.get(rid) if rid is not None else None
        stamps = meta_info.pop(TOKEN_TS_KEY, None)
        tiers = meta_info.pop(TIER_KEY, None)
        if rid is None or tracked is None:
            return
        if tiers and tracked.best_effort is None:
            tracked.best_effort = bool(tiers[0])
        if stamps:
            n_out = meta_info.get("completion_tokens")
            if n_out is not None and len(stamps) == n_out:
                tracked.token_times = list(stamps)  # cumulative (non-streaming) output
            else:
                tracked.token_times.extend(stamps)
        finish = meta_info.get("finish_reason")
        if finish is not None:
            finished = not (isinstance(finish, dict) and finish.get("type") == "abort")
            meta_info[REPORT_KEY] = self._finish(rid, finished)

    def on_abort(self, rid: str) -> dict[str, Any] | None:
        """A request that ended without a final output (queue timeout, client abort)."""
        return self._finish(rid, finished=False) if rid in self._live else None

    def _finish(self, rid: str, finished: bool) -> dict[str, Any]:
        tracked = self._live.pop(rid)
        tier = "best_effort" if tracked.best_effort else "admitted"
        report = self.score(rid, tracked.slo, tracked.arrival, tracked.token_times, finished, tier)
        if tracked.clamped:
            report["clamped"] = tracked.clamped  # the kept report (OpenAI's `slo` block) says it too
        return report
