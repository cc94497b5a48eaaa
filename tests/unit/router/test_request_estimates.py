"""The router reads a request's length bound and deadline exactly as the engine's policies do.

The router's rule used to be "the prediction, else the cap"; the core's is "the prediction at
most the cap, else the cap". They agree because the router's predictions never exceed the cap:
the service clamps them when it predicts and a resume shortens both alike."""

from __future__ import annotations

import math
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from router.policies.request_estimates import output_tokens
from router.policies.slos_admission import request_view
from router.resume import resume_route
from router.routing_views import RouteRequest
from router.service import GenerateCall, RouterService
from scheduler.core.estimates import DEFAULT_OUTPUT_LEN, answer_due, request_deadline
from scheduler.core.req_arrays import ReqArrays
from scheduler.core.slo import SloClass, SloSpec

caps = st.none() | st.integers(min_value=1, max_value=100_000)
raw_predictions = st.floats(min_value=-10.0, max_value=1e6) | st.just(math.inf)


class _FixedPredictor:
    def __init__(self, value: float) -> None:
        self.value = value

    def predict(self, text: str, prompt_tokens: int, program_id: str | None) -> float:
        return self.value


def _service_prediction(value: float, cap: int | None) -> int | None:
    """What RouterService puts in RouteRequest.predicted_output_tokens for this raw prediction."""
    params = {} if cap is None else {"max_new_tokens": cap}
    call = GenerateCall("r", [1, 2, 3], params, SloSpec(), False, 0.0, 0.0, prompt_text="hi")
    service = SimpleNamespace(predictor=_FixedPredictor(value), tokenizer=SimpleNamespace(loaded=False))
    return RouterService.predict_output(service, call)  # type: ignore[arg-type]


def _prediction_else_cap(req: RouteRequest, default: int) -> int:
    for value in (req.predicted_output_tokens, req.max_new_tokens):
        if value is not None and value > 0:
            return int(value)
    return default


@given(raw_predictions, caps, st.integers(min_value=0, max_value=5000), st.sampled_from([64, DEFAULT_OUTPUT_LEN]))
def test_router_and_core_bounds_agree_on_what_the_router_sends(value, cap, resumed_after, default):
    predicted = _service_prediction(value, cap)
    assert predicted is None or cap is None or 1 <= predicted <= cap
    req = RouteRequest("r", 10, SloSpec(), 0.0, predicted_output_tokens=predicted, max_new_tokens=cap)
    for routed in (req, resume_route(req, resumed_after)):
        bound = output_tokens(routed, default)
        assert bound == _prediction_else_cap(routed, default)
        core = ReqArrays.from_views([request_view(routed)], [], default).total_out[0]
        assert bound == core


SLOS = st.sampled_from(
    [
        SloSpec(deadline_ms=2000, slo_class=SloClass.DEADLINE),
        SloSpec(deadline_ms=9000, slo_class=SloClass.COMPOUND, program_id="p"),
        SloSpec(ttft_ms=200, tpot_ms=50, slo_class=SloClass.LATENCY),
    ]
)


@given(SLOS, st.floats(min_value=0.0, max_value=1e6, allow_nan=False), st.integers(1, 5000))
def test_router_deadline_is_the_cores_for_deadline_classes(slo, arrival, l_out):
    req = RouteRequest("r", 10, slo, arrival)
    due = answer_due(slo, arrival, l_out)
    if slo.slo_class is SloClass.LATENCY:
        assert due is not None and due > request_view(req).arrival  # the answer's own rule, see answer_due
    else:
        assert due == request_deadline(request_view(req))


def test_a_zero_cap_bounds_the_answer_by_one_token_not_the_default():
    assert output_tokens(RouteRequest("r", 10, SloSpec(), 0.0, max_new_tokens=0)) == 1
