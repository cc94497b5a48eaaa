"""Where a request's SLO comes from (body > custom_params > headers), how bad values are
named, and how the validated SLO and arrival travel in custom_params."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.slo import SloClass, SloSpec, SloValidationError, parse_slo
from scheduler.core.slo_wire import extract_slo, inject_native, inject_openai, read_injected
from wire import ARRIVAL_PARAM, SLO_HEADER_FIELDS, SLO_PARAM

FAST = settings(max_examples=60, deadline=None)
DEFAULT = SloSpec(deadline_ms=30_000.0, slo_class=SloClass.DEADLINE)


def _native_body(custom_slo=None, **extra):
    sp = {"max_new_tokens": 8}
    if custom_slo is not None:
        sp["custom_params"] = {SLO_PARAM: custom_slo}
    return {"text": "hi", "sampling_params": sp, **extra}


# --- precedence ------------------------------------------------------------------------------------


def test_body_slo_wins_and_is_removed_from_body():
    body = _native_body(custom_slo={"deadline_ms": 999}, slo={"ttft_ms": 100})
    spec = extract_slo(body, {"x-slo-ttft-ms": "5"}, DEFAULT, native=True)
    assert spec.slo_class is SloClass.LATENCY
    assert spec.ttft_ms == 100.0  # body beats the header for the same field
    assert spec.deadline_ms is None  # custom_params not consulted when the body has `slo`
    assert SLO_PARAM not in body


def test_custom_params_used_on_native_route():
    body = _native_body(custom_slo={"deadline_ms": 750})
    spec = extract_slo(body, {}, DEFAULT, native=True)
    assert spec.slo_class is SloClass.DEADLINE and spec.deadline_ms == 750.0


def test_custom_params_ignored_on_openai_route():
    body = _native_body(custom_slo={"deadline_ms": 750})
    spec = extract_slo(body, {}, DEFAULT, native=False)
    assert spec is DEFAULT


def test_custom_params_in_a_list_of_sampling_params():
    body = {"text": ["a", "b"], "sampling_params": [{"temperature": 0}, {"custom_params": {SLO_PARAM: {"ttft_ms": 7}}}]}
    assert extract_slo(body, {}, None, native=True).ttft_ms == 7.0


def test_null_body_slo_falls_through_to_custom_params():
    body = _native_body(custom_slo={"deadline_ms": 40}, slo=None)
    assert extract_slo(body, {}, None, native=True).deadline_ms == 40.0


def test_headers_fill_missing_fields():
    body = {"slo": {"ttft_ms": 100}}
    headers = {"x-slo-ttft-ms": "999", "x-slo-tpot-ms": "25", "x-slo-deadline-ms": "5000"}
    spec = extract_slo(body, headers, DEFAULT, native=False)
    assert spec.ttft_ms == 100.0  # from body
    assert spec.tpot_ms == 25.0 and spec.deadline_ms == 5000.0  # from headers
    assert spec.slo_class is SloClass.DEADLINE  # inferred from the merged fields


def test_headers_fill_custom_params_too():
    body = _native_body(custom_slo={"ttft_ms": 50})
    spec = extract_slo(body, {"x-slo-tpot-ms": "10"}, None, native=True)
    assert (spec.ttft_ms, spec.tpot_ms) == (50.0, 10.0)


def test_headers_alone():
    spec = extract_slo({}, {"x-slo-ttft-ms": "200", "x-slo-tpot-ms": "20.5"}, DEFAULT, native=False)
    assert spec.slo_class is SloClass.LATENCY
    assert (spec.ttft_ms, spec.tpot_ms) == (200.0, 20.5)


def test_header_value_with_whitespace_and_exponent():
    spec = extract_slo({}, {"x-slo-deadline-ms": " 1.5e3 "}, None, native=False)
    assert spec.deadline_ms == 1500.0


def test_unrelated_headers_ignored():
    assert extract_slo({}, {"x-slo-weight": "3", "x-ttft-ms": "1"}, DEFAULT, native=False) is DEFAULT


def test_defaults_when_no_slo_anywhere():
    assert extract_slo(_native_body(), {}, DEFAULT, native=True) is DEFAULT
    spec = extract_slo({}, {}, None, native=False)
    assert spec.is_best_effort and spec.ttft_ms is None


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("header", sorted(SLO_HEADER_FIELDS))
@pytest.mark.parametrize("bad", ["fast", "", "12ms", "0", "-5", "nan", "inf", "-inf", "1e999"])
def test_bad_header_named(header, bad):
    with pytest.raises(SloValidationError) as info:
        extract_slo({"slo": {"ttft_ms": 100, "deadline_ms": 200}}, {header: bad}, DEFAULT, native=False)
    assert info.value.field == header
    assert repr(bad) in info.value.message


def test_bad_body_field_named_with_body_prefix():
    with pytest.raises(SloValidationError) as info:
        extract_slo({"slo": {"ttft_ms": -1}}, {}, DEFAULT, native=True)
    assert info.value.field == "slo.ttft_ms"


def test_bad_custom_params_field_named_with_its_path():
    with pytest.raises(SloValidationError) as info:
        extract_slo(_native_body(custom_slo={"tpot_ms": "x"}), {}, DEFAULT, native=True)
    assert info.value.field == "sampling_params.custom_params.slo.tpot_ms"


@pytest.mark.parametrize("bad", ["fast", 5, [1], True])
def test_non_object_body_slo(bad):
    with pytest.raises(SloValidationError) as info:
        extract_slo({"slo": bad}, {}, DEFAULT, native=False)
    assert info.value.field == "slo"


def test_non_object_custom_params_slo():
    with pytest.raises(SloValidationError) as info:
        extract_slo(_native_body(custom_slo="tight"), {}, DEFAULT, native=True)
    assert info.value.field == "sampling_params.custom_params.slo"


def test_header_combined_with_body_validated_together():
    # header ttft 500 and body deadline 100: deadline before the first-token target
    with pytest.raises(SloValidationError) as info:
        extract_slo({"slo": {"deadline_ms": 100}}, {"x-slo-ttft-ms": "500"}, None, native=False)
    assert info.value.field == "slo.deadline_ms"


# --- injection ------------------------------------------------------------------------------------

SPEC = parse_slo({"ttft_ms": 120, "tpot_ms": 15, "weight": 2})


def test_inject_native_dict_creates_custom_params():
    body = {"text": "x", "sampling_params": {"temperature": 0.5}}
    inject_native(body, SPEC, 123.5)
    custom = body["sampling_params"]["custom_params"]
    assert custom == {SLO_PARAM: SPEC.to_dict(), ARRIVAL_PARAM: 123.5}
    assert body["sampling_params"]["temperature"] == 0.5


def test_inject_native_missing_or_null_sampling_params():
    for body in ({"text": "x"}, {"text": "x", "sampling_params": None}):
        inject_native(body, SPEC, 1.0)
        assert body["sampling_params"]["custom_params"][ARRIVAL_PARAM] == 1.0


def test_inject_native_keeps_other_custom_params_and_overwrites_client_slo():
    body = _native_body(custom_slo={"deadline_ms": 9})
    body["sampling_params"]["custom_params"]["mine"] = 7
    inject_native(body, SPEC, 2.0)
    custom = body["sampling_params"]["custom_params"]
    assert custom["mine"] == 7
    assert custom[SLO_PARAM] == SPEC.to_dict()


def test_inject_native_list_sets_every_entry():
    body = {"text": ["a", "b", "c"], "sampling_params": [{}, {"custom_params": {"k": 1}}, {"temperature": 0}]}
    inject_native(body, SPEC, 3.0)
    for params in body["sampling_params"]:
        assert params["custom_params"][SLO_PARAM] == SPEC.to_dict()
        assert params["custom_params"][ARRIVAL_PARAM] == 3.0
    assert body["sampling_params"][1]["custom_params"]["k"] == 1


def test_injected_entries_are_independent_copies_per_entry():
    body = {"sampling_params": [{}, {}]}
    inject_native(body, SPEC, 3.0)
    body["sampling_params"][0]["custom_params"][SLO_PARAM]["ttft_ms"] = 1
    assert body["sampling_params"][1]["custom_params"][SLO_PARAM]["ttft_ms"] == 120.0


@pytest.mark.parametrize("bad", ["x", 3, [1, "a"], [{}, None]])
def test_inject_native_bad_sampling_params(bad):
    with pytest.raises(SloValidationError) as info:
        inject_native({"sampling_params": bad}, SPEC, 0.0)
    assert info.value.field == "sampling_params"


def test_inject_native_bad_custom_params():
    with pytest.raises(SloValidationError) as info:
        inject_native({"sampling_params": {"custom_params": "nope"}}, SPEC, 0.0)
    assert info.value.field == "sampling_params.custom_params"


def test_inject_openai_top_level():
    body = {"model": "m", "messages": [], "custom_params": {"other": True}}
    inject_openai(body, SPEC, 9.25)
    assert body["custom_params"] == {"other": True, SLO_PARAM: SPEC.to_dict(), ARRIVAL_PARAM: 9.25}
    assert "sampling_params" not in body
    fresh = {"model": "m"}
    inject_openai(fresh, SPEC, 1.0)
    assert fresh["custom_params"][ARRIVAL_PARAM] == 1.0


def test_inject_openai_bad_custom_params():
    with pytest.raises(SloValidationError) as info:
        inject_openai({"custom_params": [1]}, SPEC, 0.0)
    assert info.value.field == "custom_params"


# --- read_injected --------------------------------------------------------------------------------


def test_read_injected_round_trip_native():
    body = {"sampling_params": {}}
    inject_native(body, SPEC, 42.0)
    got = read_injected(body["sampling_params"]["custom_params"])
    assert got == (SPEC, 42.0)


def test_read_injected_none_cases():
    assert read_injected(None) is None
    assert read_injected({}) is None
    assert read_injected({"other": 1}) is None
    assert read_injected({SLO_PARAM: {"ttft_ms": 1}}) is None  # no arrival
    assert read_injected({SLO_PARAM: {"ttft_ms": 1}, ARRIVAL_PARAM: "now"}) is None


def test_read_injected_integer_arrival_becomes_float():
    spec, arrival = read_injected({SLO_PARAM: {"deadline_ms": 10}, ARRIVAL_PARAM: 5})
    assert isinstance(arrival, float) and arrival == 5.0
    assert spec.deadline_ms == 10.0


positive = st.floats(min_value=0.5, max_value=1e5, allow_nan=False)
raw_slos = st.one_of(
    st.builds(lambda a, b: {"ttft_ms": a, "tpot_ms": b}, positive, st.none() | positive),
    st.builds(lambda d, w: {"deadline_ms": d, "weight": w}, positive, positive),
    st.builds(
        lambda d, p, s: {"deadline_ms": d, "program_id": p, "stage": s},
        positive,
        st.text(min_size=1, max_size=12),
        st.none() | st.integers(0, 9),
    ),
    st.builds(lambda q: {"max_queue_ms": q}, st.none() | positive),
)


@FAST
@given(raw=raw_slos, arrival=st.floats(0, 2e9, allow_nan=False), native=st.booleans(), as_list=st.booleans())
def test_extract_inject_read_round_trip(raw, arrival, native, as_list):
    sp = [{"a": 1}, {"b": 2}] if as_list else {"a": 1}
    body = {"slo": copy.deepcopy(raw), "sampling_params": sp}
    spec = extract_slo(body, {}, None, native=native)
    assert spec == parse_slo(raw)
    if native:
        inject_native(body, spec, arrival)
        customs = [p["custom_params"] for p in (body["sampling_params"] if as_list else [body["sampling_params"]])]
    else:
        inject_openai(body, spec, arrival)
        customs = [body["custom_params"]]
    for custom in customs:
        assert read_injected(custom) == (spec, arrival)


def test_null_body_field_falls_back_to_the_header():
    spec = extract_slo({"slo": {"ttft_ms": None, "tpot_ms": 20}}, {"x-slo-ttft-ms": "300"}, None, native=False)
    assert spec.ttft_ms == 300.0 and spec.tpot_ms == 20.0
