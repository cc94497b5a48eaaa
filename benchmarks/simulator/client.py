"""The load generator's side of a simulated run: what it would send (the planned requests as
simulator requests, the true length hidden) and what it would have recorded, so simulated runs
are scored by the same metrics as live ones."""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.goodput.mixes import Scale, profile_zero_load
from benchmarks.goodput.records import PlannedRequest, RequestRecord
from benchmarks.goodput.workload import WorkloadSpec, plan
from benchmarks.simulator.card import Card
from scheduler.core.sim import SimRecord, SimRequest
from scheduler.core.slo import SloSpec, parse_slo

CLIENT_MAX_TOKENS = 1024  # the cap the load generator puts in max_new_tokens (LoadOptions)


def sim_requests(planned: Sequence[PlannedRequest], client_max_tokens: int = CLIENT_MAX_TOKENS) -> list[SimRequest]:
    """What the load generator would send, as simulator requests (the true length hidden)."""
    starts: dict[str, float] = {}
    for p in planned:
        if p.req.program_id is not None:
            starts[p.req.program_id] = min(starts.get(p.req.program_id, p.req.arrival_s), p.req.arrival_s)
    out = []
    for p in planned:
        r = p.req
        slo = parse_slo(p.slo) if p.slo else SloSpec()
        out.append(
            SimRequest(
                rid=r.rid,
                slo=slo,
                arrival=r.arrival_s,
                prompt_len=r.prompt_tokens,
                output_len=r.output_tokens,
                max_new_tokens=max(client_max_tokens, r.output_tokens),
                program_arrival=starts.get(r.program_id) if slo.program_id is not None and r.program_id else None,
                parents=tuple(r.parents),
                think_s=r.think_s,
            )
        )
    return out


def unsent_record(p: PlannedRequest, program_starts: dict[str, float]) -> RequestRecord:
    """The load generator's record of a planned request before anything was sent."""
    r = p.req
    return RequestRecord(
        key=r.rid,
        cls=p.cls,
        slo=p.slo,
        prompt_tokens=r.prompt_tokens,
        target_output_tokens=r.output_tokens,
        scheduled_s=r.arrival_s,
        program_id=r.program_id,
        program_start_s=program_starts.get(r.program_id) if r.program_id else None,
        program_deadline_s=None if p.program_deadline_ms is None else p.program_deadline_ms / 1000.0,
    )


def to_record(p: PlannedRequest, rec: SimRecord | None, program_starts: dict[str, float]) -> RequestRecord:
    """A simulated request as the load generator would have recorded it."""
    record = unsent_record(p, program_starts)
    if rec is None or (not rec.token_times and rec.finish_time is None and rec.drop_reason is None):
        return record  # never arrived (a parent failed, or the run ended first)
    record.send_s = rec.req.arrival
    record.token_s = list(rec.token_times)
    if rec.finish_time is not None:
        record.finish_s, record.finish_reason = rec.finish_time, "length"
    elif rec.drop_reason is not None:
        record.finish_s, record.finish_reason, record.error = rec.req.arrival, "abort", rec.drop_reason
    else:
        record.cut = True  # still queued or running when the simulation stopped
    return record


def planned_workload(spec: WorkloadSpec, rate: float, card: Card) -> list[PlannedRequest]:
    """What the load generator would send at `rate`, its SLOs scaled to `card`'s zero-load speed
    (shared with the ceiling estimate, which must see the same requests)."""
    return plan(spec, rate, Scale(1.0, profile_zero_load(card.name.split("/")[0])))
