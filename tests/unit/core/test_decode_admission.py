"""A PD decode worker admits on the deadline-based TPOT: banked slack pays for a longer step."""

from __future__ import annotations

from scheduler.core.decode_admission import decode_cap, horizon_step
from scheduler.core.plan_path import DECODE, LeverModel, PlanSettings, finalize_plan
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import EngineView, RequestView, StepPlan
from tests.unit.core.policy_cases import policy_view
from tests.unit.core.test_batch_levers import PERF  # 10 ms + 1 ms per token

TIGHT_MS, TTFT_MS, GENERATED = 12.0, 5000.0, 10  # PERF's per-step cap at 12 ms: a batch of 2


def _latency(rid: str, tpot_ms: float, ttft_ms: float, generated: int) -> RequestView:
    slo = SloSpec(ttft_ms=ttft_ms, tpot_ms=tpot_ms, slo_class=SloClass.LATENCY)
    return RequestView(rid=rid, slo=slo, arrival=0.0, prompt_len=100, generated=generated, first_token_time=0.5)


def _next_due() -> float:
    """When the residents' next token (index GENERATED) is due."""
    return (TTFT_MS + GENERATED * TIGHT_MS) / 1000.0


def _decode_view(slack_s: float) -> EngineView:
    """Two tight residents, `slack_s` ahead of their schedule, and one transferred request waiting
    (a loose TPOT, its first token just out, its own schedule far ahead)."""
    residents = [_latency(f"r{i}", TIGHT_MS, TTFT_MS, GENERATED) for i in range(2)]
    transferred = _latency("t", 100.0, 60_000.0, 1)
    return policy_view([transferred], residents, cap=256, now=_next_due() - slack_s)


def _cap(view: EngineView) -> int | None:
    return finalize_plan(view, StepPlan(), PlanSettings(role=DECODE), LeverModel(PERF)).batch_cap


def test_banked_slack_admits_a_transferred_request_the_per_step_cap_refuses() -> None:
    view = _decode_view(slack_s=2.0)
    assert PERF.step_time(0, 3, 0) > TIGHT_MS / 1000  # three decodes miss the per-step TPOT
    cap = _cap(view)
    assert cap is not None and cap >= 3  # the transferred request joins the batch
    step = horizon_step(view)
    assert step is not None and step > TIGHT_MS / 1000
    assert PERF.step_time(0, cap, 0) <= step  # and the residents stay on their schedule


def test_without_slack_the_per_step_cap_holds() -> None:
    on_pace = _decode_view(slack_s=TIGHT_MS / 1000)  # the next token is due one TPOT from now
    assert _cap(on_pace) == 2
    behind = _decode_view(slack_s=0.005)  # on time, but with less than one TPOT left
    assert _cap(behind) == 2


def test_a_late_resident_does_not_hold_the_batch_back() -> None:
    late = _latency("late", TIGHT_MS, 100.0, GENERATED)  # its next token was due long ago
    view = _decode_view(slack_s=2.0)
    with_late = policy_view(view.waiting, [*view.running, late], cap=256, now=view.now)
    assert decode_cap(with_late, PERF) == decode_cap(view, PERF)
