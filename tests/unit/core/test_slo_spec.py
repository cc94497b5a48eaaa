"""SloSpec parsing and validation: class inference, each rejection and the field it names,
server defaults and the DSLO token due times."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.slo import (
    FIELDS,
    MAX_ID_LEN,
    SloClass,
    SloSpec,
    SloValidationError,
    merge_defaults,
    parse_slo,
)

FAST = settings(max_examples=80, deadline=None)

positive = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False) | st.integers(1, 10**6)


def _error(spec, prefix="slo."):
    with pytest.raises(SloValidationError) as info:
        parse_slo(spec, prefix=prefix)
    return info.value


# --- class inference -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, expected",
    [
        ({}, SloClass.BEST_EFFORT),
        ({"weight": 2}, SloClass.BEST_EFFORT),
        ({"max_queue_ms": 500}, SloClass.BEST_EFFORT),
        ({"ttft_ms": 200}, SloClass.LATENCY),
        ({"ttft_ms": 200, "tpot_ms": 50}, SloClass.LATENCY),
        ({"deadline_ms": 1000}, SloClass.DEADLINE),
        # a deadline outranks the latency fields when inferring
        ({"ttft_ms": 200, "deadline_ms": 1000}, SloClass.DEADLINE),
        # a program id outranks everything
        ({"program_id": "p", "deadline_ms": 1000}, SloClass.COMPOUND),
        ({"program_id": "p", "deadline_ms": 1000, "ttft_ms": 100, "stage": 2}, SloClass.COMPOUND),
        # explicit nulls count as absent
        ({"ttft_ms": None, "deadline_ms": None, "program_id": None}, SloClass.BEST_EFFORT),
    ],
)
def test_class_inferred_from_fields(spec, expected):
    assert parse_slo(spec).slo_class is expected


@pytest.mark.parametrize("cls", [c.value for c in SloClass])
def test_explicit_class_wins_over_inference(cls):
    spec = {
        "latency": {"class": "latency", "ttft_ms": 100, "deadline_ms": 500},  # would infer deadline
        "deadline": {"class": "deadline", "deadline_ms": 500, "program_id": "p"},  # would infer compound
        "compound": {"class": "compound", "deadline_ms": 500, "program_id": "p"},
        "best_effort": {"class": "best_effort", "program_id": "p"},  # would infer compound
    }[cls]
    assert parse_slo(spec).slo_class is SloClass(cls)


def test_class_accepts_enum_member():
    assert parse_slo({"class": SloClass.DEADLINE, "deadline_ms": 10}).slo_class is SloClass.DEADLINE


@FAST
@given(
    ttft=st.none() | positive,
    tpot=st.none() | positive,
    deadline=st.none() | positive,
    program=st.none() | st.text(min_size=1, max_size=8),
)
def test_inference_priority_property(ttft, tpot, deadline, program):
    spec = {"ttft_ms": ttft, "tpot_ms": tpot, "deadline_ms": deadline, "program_id": program}
    if program is not None:
        expected = SloClass.COMPOUND
    elif deadline is not None:
        expected = SloClass.DEADLINE
    elif ttft is not None or tpot is not None:
        expected = SloClass.LATENCY
    else:
        expected = SloClass.BEST_EFFORT
    try:
        parsed = parse_slo(spec)
    except SloValidationError as e:
        # Only combination rules may reject these well-typed values.
        tpot_without_ttft = tpot is not None and ttft is None  # DSLO needs its first-token anchor
        if expected is SloClass.COMPOUND:
            assert deadline is None or tpot_without_ttft or (ttft is not None and deadline < ttft)
        elif expected is SloClass.DEADLINE:
            assert tpot_without_ttft or (ttft is not None and deadline < ttft)
            assert e.field == ("slo.ttft_ms" if tpot_without_ttft else "slo.deadline_ms")
        else:
            assert expected is SloClass.LATENCY and tpot_without_ttft
            assert e.field == "slo.ttft_ms"
        return
    assert parsed.slo_class is expected
    assert parsed.ttft_ms == (None if ttft is None else float(ttft))
    assert parsed.tpot_ms == (None if tpot is None else float(tpot))
    assert parsed.deadline_ms == (None if deadline is None else float(deadline))
    assert parsed.program_id == program


# --- parsed values -------------------------------------------------------------------------


def test_values_become_floats_and_defaults_fill_in():
    s = parse_slo({"ttft_ms": 200, "tpot_ms": 50})
    assert isinstance(s.ttft_ms, float) and s.ttft_ms == 200.0
    assert isinstance(s.tpot_ms, float) and s.tpot_ms == 50.0
    assert s.weight == 1.0
    assert s.deadline_ms is None and s.max_queue_ms is None and s.program_id is None and s.stage is None


def test_weight_and_max_queue_parsed():
    s = parse_slo({"weight": 3, "max_queue_ms": 250})
    assert s.weight == 3.0 and s.max_queue_ms == 250.0


def test_explicit_records_only_non_null_client_fields():
    s = parse_slo({"ttft_ms": 100, "tpot_ms": None, "weight": 2})
    assert s.explicit == frozenset({"ttft_ms", "weight"})
    # explicit does not take part in equality
    assert s == SloSpec(ttft_ms=100.0, slo_class=SloClass.LATENCY, weight=2.0)


@pytest.mark.parametrize("stage", [0, 3, "retrieve", "x" * MAX_ID_LEN])
def test_valid_stages(stage):
    s = parse_slo({"program_id": "prog", "deadline_ms": 1000, "stage": stage})
    assert s.stage == stage


def test_program_id_at_max_length_is_accepted():
    assert parse_slo({"program_id": "a" * MAX_ID_LEN, "deadline_ms": 5}).program_id == "a" * MAX_ID_LEN


def test_deadline_equal_to_ttft_is_accepted():
    s = parse_slo({"ttft_ms": 100, "deadline_ms": 100})
    assert s.deadline_ms == s.ttft_ms == 100.0


# --- validation errors: each names its field ---------------------------------------------------


@pytest.mark.parametrize("spec", [None, 5, "fast", [1, 2], 3.5])
def test_non_mapping_rejected_naming_the_object(spec):
    e = _error(spec)
    assert e.field == "slo"
    assert type(spec).__name__ in e.message


def test_non_mapping_uses_custom_prefix():
    assert _error("x", prefix="sampling_params.custom_params.slo.").field == "sampling_params.custom_params.slo"


def test_unknown_field_named_first_alphabetically():
    e = _error({"zeta": 1, "alpha": 2, "ttft_ms": 100})
    assert e.field == "slo.alpha"
    for name in FIELDS:
        assert name in e.message


@pytest.mark.parametrize("name", ["ttft_ms", "tpot_ms", "deadline_ms", "max_queue_ms", "weight"])
@pytest.mark.parametrize("bad", ["100", True, False, [1], {"v": 1}])
def test_non_number_rejected(name, bad):
    e = _error({name: bad})
    assert e.field == f"slo.{name}"
    assert "must be a number" in e.message


@pytest.mark.parametrize("name", ["ttft_ms", "tpot_ms", "deadline_ms", "max_queue_ms", "weight"])
@pytest.mark.parametrize("bad", [0, 0.0, -1, -0.5, math.inf, -math.inf, math.nan])
def test_non_positive_or_non_finite_rejected(name, bad):
    e = _error({name: bad})
    assert e.field == f"slo.{name}"
    assert "positive finite" in e.message


@FAST
@given(
    name=st.sampled_from(["ttft_ms", "tpot_ms", "deadline_ms", "max_queue_ms", "weight"]),
    bad=st.floats(max_value=0.0) | st.integers(max_value=0) | st.just(math.inf) | st.just(math.nan),
)
def test_non_positive_rejected_property(name, bad):
    assert _error({name: bad}).field == f"slo.{name}"


def test_huge_integer_rejected_as_validation_error():
    assert _error({"ttft_ms": 10**400}).field == "slo.ttft_ms"


@pytest.mark.parametrize("bad", ["fast", "LATENCY", "", 1, ["latency"], {"a": 1}])
def test_bad_class_rejected(bad):
    e = _error({"class": bad, "ttft_ms": 100})
    assert e.field == "slo.class"
    for c in SloClass:
        assert c.value in e.message


@pytest.mark.parametrize("bad", ["", "x" * (MAX_ID_LEN + 1), 5, ["p"], True])
def test_bad_program_id_rejected(bad):
    e = _error({"program_id": bad, "deadline_ms": 100})
    assert e.field == "slo.program_id"


@pytest.mark.parametrize("bad", [True, 1.5, ["s"], {"s": 1}])
def test_stage_wrong_type_rejected(bad):
    e = _error({"program_id": "p", "deadline_ms": 100, "stage": bad})
    assert e.field == "slo.stage"


@pytest.mark.parametrize("bad", [-1, -100, "", "s" * (MAX_ID_LEN + 1)])
def test_stage_out_of_range_rejected(bad):
    e = _error({"program_id": "p", "deadline_ms": 100, "stage": bad})
    assert e.field == "slo.stage"


def test_stage_without_program_rejected():
    e = _error({"deadline_ms": 100, "stage": 1})
    assert e.field == "slo.stage"
    assert "program_id" in e.message


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"class": "latency"}, "slo.ttft_ms"),
        ({"class": "latency", "deadline_ms": 100}, "slo.ttft_ms"),
        ({"tpot_ms": 50}, "slo.ttft_ms"),  # inferred latency, tpot needs ttft for the DSLO
        ({"class": "deadline"}, "slo.deadline_ms"),
        ({"class": "deadline", "ttft_ms": 100}, "slo.deadline_ms"),
        ({"class": "compound", "deadline_ms": 100}, "slo.program_id"),
        ({"class": "compound", "program_id": "p"}, "slo.deadline_ms"),
        ({"program_id": "p"}, "slo.deadline_ms"),  # inferred compound without a deadline
        ({"class": "best_effort", "ttft_ms": 100}, "slo.ttft_ms"),
        ({"class": "best_effort", "tpot_ms": 100}, "slo.tpot_ms"),
        ({"class": "best_effort", "deadline_ms": 100}, "slo.deadline_ms"),
        ({"ttft_ms": 200, "deadline_ms": 100}, "slo.deadline_ms"),  # deadline before first token
        ({"program_id": "p", "ttft_ms": 200, "deadline_ms": 199}, "slo.deadline_ms"),
    ],
)
def test_combination_errors_name_the_field(spec, field):
    assert _error(spec).field == field


def test_error_carries_field_and_message_in_str():
    e = _error({"ttft_ms": -3})
    assert isinstance(e, ValueError)
    assert str(e) == f"{e.field}: {e.message}"
    assert "-3" in e.message


def test_custom_prefix_applies_to_every_field_error():
    prefix = "sampling_params.custom_params.slo."
    assert _error({"ttft_ms": 0}, prefix=prefix).field == prefix + "ttft_ms"
    assert _error({"bogus": 1}, prefix=prefix).field == prefix + "bogus"
    assert _error({"class": "deadline"}, prefix=prefix).field == prefix + "deadline_ms"


# --- wire form and round trip -------------------------------------------------------------------


def test_to_dict_only_set_fields_with_class_spelled_out():
    s = parse_slo({"ttft_ms": 100, "tpot_ms": 20})
    assert s.to_dict() == {"class": "latency", "weight": 1.0, "ttft_ms": 100.0, "tpot_ms": 20.0}
    assert SloSpec().to_dict() == {"class": "best_effort", "weight": 1.0}


valid_specs = st.one_of(
    st.builds(
        lambda ttft, tpot, w: {"ttft_ms": ttft, "tpot_ms": tpot, "weight": w},
        positive,
        st.none() | positive,
        st.none() | positive,
    ),
    st.builds(lambda d, q: {"deadline_ms": d, "max_queue_ms": q}, positive, st.none() | positive),
    st.builds(
        lambda d, p, stage: {"deadline_ms": d, "program_id": p, "stage": stage},
        positive,
        st.text(min_size=1, max_size=20),
        st.none() | st.integers(0, 50) | st.text(min_size=1, max_size=10),
    ),
    st.builds(lambda q: {"max_queue_ms": q}, st.none() | positive),
)


@FAST
@given(valid_specs)
def test_to_dict_round_trips(raw):
    s = parse_slo(raw)
    wire = s.to_dict()
    assert wire["class"] == s.slo_class.value
    assert parse_slo(wire) == s


# --- DSLO due times and defaults -----------------------------------------------------------------


def test_token_due_s():
    s = SloSpec(ttft_ms=200.0, tpot_ms=50.0, slo_class=SloClass.LATENCY)
    assert s.token_due_s(0) == pytest.approx(0.2)
    assert s.token_due_s(1) == pytest.approx(0.25)
    assert s.token_due_s(10) == pytest.approx(0.7)


def test_token_due_s_without_tpot_is_ttft_for_every_token():
    s = SloSpec(ttft_ms=300.0, slo_class=SloClass.LATENCY)
    assert s.token_due_s(0) == s.token_due_s(99) == pytest.approx(0.3)


def test_token_due_s_none_without_ttft():
    assert SloSpec(deadline_ms=100.0, tpot_ms=10.0, slo_class=SloClass.DEADLINE).token_due_s(3) is None
    assert SloSpec().token_due_s(0) is None


@FAST
@given(ttft=positive, tpot=positive, i=st.integers(0, 5000))
def test_token_due_s_linear_and_increasing(ttft, tpot, i):
    s = SloSpec(ttft_ms=float(ttft), tpot_ms=float(tpot), slo_class=SloClass.LATENCY)
    assert s.token_due_s(i) == pytest.approx((ttft + i * tpot) / 1000.0)
    assert s.token_due_s(i + 1) > s.token_due_s(i)


def test_is_best_effort():
    assert SloSpec().is_best_effort
    assert not parse_slo({"ttft_ms": 1}).is_best_effort


def test_merge_defaults():
    own = parse_slo({"ttft_ms": 100})
    default = parse_slo({"deadline_ms": 5000})
    assert merge_defaults(own, default) is own
    assert merge_defaults(None, default) is default
    fallback = merge_defaults(None, None)
    assert fallback.is_best_effort and fallback.ttft_ms is None and fallback.deadline_ms is None


@pytest.mark.parametrize("cls", ["deadline", "latency", None])
def test_tpot_without_ttft_is_rejected_whatever_the_class(cls):
    spec = {"deadline_ms": 1000, "tpot_ms": 50}
    if cls is not None:
        spec["class"] = cls
    assert _error(spec).field == "slo.ttft_ms"
