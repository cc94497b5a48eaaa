"""A benchmark's true output length (the hidden hint) ends the request, but no policy can read it.

The request state and view builder are exercised directly on SGLang's real SamplingParams; the
adapter's intake override over the stand-in engine.
"""

from __future__ import annotations

import dataclasses

import pytest
from sglang.srt.sampling.sampling_params import SamplingParams

from scheduler.components.request_state import RequestStates
from scheduler.components.views import ViewBuilder
from scheduler.core.clock import WallClock
from scheduler.core.compound import CompoundDeadlines
from scheduler.core.slo import SloClass, SloSpec
from tests.unit.scheduler._stand_in_engine import StandInReq, slo_scheduler
from wire import ORACLE_HINT_PARAM

CLIENT_CAP, TRUE_LEN = 512, 37
DEADLINE = SloSpec(deadline_ms=5000.0, slo_class=SloClass.DEADLINE)


def _request(rid: str = "r1", hint: int | None = TRUE_LEN) -> StandInReq:
    custom = {ORACLE_HINT_PARAM: hint} if hint is not None else None
    req = StandInReq(rid, 3, spec=DEADLINE, arrival=1.0, max_new_tokens=CLIENT_CAP, custom=custom)
    req.output_ids = [5]
    return req


def _views(states: RequestStates, oracle: bool = False) -> ViewBuilder:
    return ViewBuilder(states, WallClock(), CompoundDeadlines(), oracle=oracle)


def test_the_engine_stops_at_the_true_length_but_the_policy_sees_the_clients_cap() -> None:
    states, req = RequestStates(), _request()
    states.lower_cap_to_hint(req.rid, req.sampling_params)
    assert req.sampling_params.max_new_tokens == TRUE_LEN and req.sampling_params.ignore_eos
    view = _views(states).request_view(req)
    assert view.max_new_tokens == CLIENT_CAP
    assert view.oracle_output_len is None and view.predicted_output_len is None
    fields = dataclasses.asdict(view)
    assert TRUE_LEN not in [v for k, v in fields.items() if k != "slo"], fields


def test_without_a_hint_the_request_is_untouched() -> None:
    states, req = RequestStates(), _request("r2", hint=None)
    states.lower_cap_to_hint(req.rid, req.sampling_params)
    assert req.sampling_params.max_new_tokens == CLIENT_CAP and not req.sampling_params.ignore_eos
    assert not states.hinted("r2")
    assert _views(states).request_view(req).max_new_tokens == CLIENT_CAP


def test_a_hint_without_a_client_cap_leaves_the_policy_uncapped() -> None:
    states = RequestStates()
    params = SamplingParams(max_new_tokens=None, custom_params={ORACLE_HINT_PARAM: TRUE_LEN})
    states.lower_cap_to_hint("r3", params)
    req = _request("r3")
    req.sampling_params = params
    assert params.max_new_tokens == TRUE_LEN
    assert _views(states).request_view(req).max_new_tokens is None


def test_only_an_oracle_policy_is_given_the_length() -> None:
    states, req = RequestStates(), _request()
    states.lower_cap_to_hint(req.rid, req.sampling_params)
    assert _views(states, oracle=True).request_view(req).oracle_output_len == TRUE_LEN


@pytest.mark.parametrize("policy", ["edf", "tempo_oracle"])
def test_the_adapters_intake_applies_the_hint_before_sglang_sees_the_request(policy: str) -> None:
    s, req = slo_scheduler(policy=policy), _request()
    s.handle_generate_request(req)
    assert s.handled == [req] and req.sampling_params.max_new_tokens == TRUE_LEN
    view = s._slo_view(s.running_batch) if s.waiting_queue else s.slo.views.request_view(req)
    assert view.max_new_tokens == CLIENT_CAP
    assert view.oracle_output_len == (TRUE_LEN if policy.endswith("_oracle") else None)
