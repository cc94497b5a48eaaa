"""Per-key SLO limits (scheduler/core/slo_limits.py): clamp or refuse what a key may not ask for,
namespace program ids per key, and write the tenant for the scheduler's fair shares."""

from __future__ import annotations

import pytest

from scheduler.core.slo import MAX_ID_LEN, SloClass, SloSpec, parse_slo
from scheduler.core.slo_limits import CLAMP, REJECT, SloLimitError, SloLimits, apply_limits, hold_to_key, namespaced
from wire import SHARE_PARAM, TENANT_PARAM

ONE_SECOND = SloLimits(min_ttft_ms=1000.0, min_tpot_ms=20.0, min_deadline_ms=5000.0, max_weight=2.0)


def test_clamp_raises_tight_targets_and_lowers_weight_and_says_so() -> None:
    spec = parse_slo({"ttft_ms": 0.001, "tpot_ms": 1, "weight": 50})
    held, clamped = apply_limits(spec, ONE_SECOND)
    assert (held.ttft_ms, held.tpot_ms, held.weight) == (1000.0, 20.0, 2.0)
    assert held.slo_class is SloClass.LATENCY
    assert clamped == {
        "ttft_ms": {"asked": 0.001, "granted": 1000.0},
        "tpot_ms": {"asked": 1.0, "granted": 20.0},
        "weight": {"asked": 50.0, "granted": 2.0},
    }
    parse_slo(held.to_dict())  # still a valid spec on the wire


def test_within_limits_is_unchanged() -> None:
    spec = parse_slo({"ttft_ms": 2000, "tpot_ms": 50, "weight": 1.5})
    held, clamped = apply_limits(spec, ONE_SECOND)
    assert held == spec and clamped == {}


def test_raised_ttft_moves_a_deadline_below_it() -> None:
    spec = parse_slo({"ttft_ms": 10, "deadline_ms": 600, "class": "latency"})
    held, clamped = apply_limits(spec, SloLimits(min_ttft_ms=1000.0))
    assert held.ttft_ms == 1000.0 and held.deadline_ms == 1000.0
    assert clamped["deadline_ms"] == {"asked": 600.0, "granted": 1000.0}
    parse_slo(held.to_dict())


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"ttft_ms": 0.001}, "slo.ttft_ms"),
        ({"ttft_ms": 2000, "tpot_ms": 1}, "slo.tpot_ms"),
        ({"deadline_ms": 10}, "slo.deadline_ms"),
        ({"ttft_ms": 2000, "weight": 9}, "slo.weight"),
    ],
)
def test_reject_names_the_field(body: dict, field: str) -> None:
    limits = SloLimits(
        min_ttft_ms=1000.0, min_tpot_ms=20.0, min_deadline_ms=5000.0, max_weight=2.0, on_violation=REJECT
    )
    with pytest.raises(SloLimitError) as err:
        apply_limits(parse_slo(body), limits)
    assert err.value.field == field


def test_reject_still_clamps_what_the_client_did_not_ask_for() -> None:
    """The server's default SLO is not the client's request: it is clamped, never refused."""
    default = SloSpec(ttft_ms=100.0, slo_class=SloClass.LATENCY)
    held, clamped = apply_limits(default, SloLimits(min_ttft_ms=1000.0, on_violation=REJECT))
    assert held.ttft_ms == 1000.0 and "ttft_ms" in clamped


def test_class_not_allowed_is_refused_without_best_effort() -> None:
    limits = SloLimits(classes=frozenset({SloClass.DEADLINE}))
    with pytest.raises(SloLimitError) as err:
        apply_limits(parse_slo({"ttft_ms": 2000}), limits)
    assert err.value.field == "slo.class"


def test_class_not_allowed_is_served_best_effort_when_the_key_may() -> None:
    limits = SloLimits(classes=frozenset({SloClass.DEADLINE, SloClass.BEST_EFFORT}), on_violation=CLAMP)
    held, clamped = apply_limits(parse_slo({"ttft_ms": 2000, "tpot_ms": 30}), limits)
    assert held.slo_class is SloClass.BEST_EFFORT and held.ttft_ms is None and held.tpot_ms is None
    assert clamped == {"class": {"asked": "latency", "granted": "best_effort"}}
    parse_slo(held.to_dict())
    with pytest.raises(SloLimitError):  # under reject an explicit class is refused all the same
        apply_limits(parse_slo({"ttft_ms": 2000}), SloLimits(classes=limits.classes, on_violation=REJECT))


def test_program_ids_are_namespaced_per_key() -> None:
    spec = parse_slo({"program_id": "p1", "deadline_ms": 9000})
    assert namespaced(spec, "tenant-a").program_id == "tenant-a/p1"
    assert namespaced(spec, "tenant-a").program_id != namespaced(spec, "tenant-b").program_id
    long = parse_slo({"program_id": "x" * MAX_ID_LEN, "deadline_ms": 9000})
    pid = namespaced(long, "t" * 64).program_id
    assert pid is not None and len(pid) <= MAX_ID_LEN and pid.startswith("t" * 64 + "/")
    parse_slo(namespaced(long, "t" * 64).to_dict())
    assert namespaced(SloSpec(), "a") == SloSpec()


def test_hold_to_key_writes_the_tenant() -> None:
    custom: dict = {}
    spec, clamped = hold_to_key(
        parse_slo({"ttft_ms": 1, "program_id": "p", "class": "latency"}), "a", ONE_SECOND, 3.0, custom
    )
    assert custom == {TENANT_PARAM: "a", SHARE_PARAM: 3.0}
    assert spec.program_id == "a/p" and spec.ttft_ms == 1000.0 and "ttft_ms" in clamped
