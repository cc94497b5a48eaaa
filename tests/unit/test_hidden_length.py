"""A benchmark's true output length (the hidden hint) ends the request, but no policy can read it.

The adapter is exercised on its own: SGLang's request handling underneath is replaced by a
recorder, and the request is SGLang's real SamplingParams inside a minimal Req stand-in.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from sglang.srt.sampling.sampling_params import SamplingParams

from scheduler import sglang_scheduler
from scheduler.core.clock import WallClock
from scheduler.core.programs import ProgramTracker
from scheduler.sglang_scheduler import SloScheduler
from server.slo_request import ARRIVAL_PARAM, ORACLE_HINT_PARAM, SLO_PARAM

CLIENT_CAP, TRUE_LEN = 512, 37


def _scheduler(emulating: bool, oracle: bool = False) -> SloScheduler:
    s = SloScheduler.__new__(SloScheduler)  # no engine: only the adapter's own state
    s.slo_pacer = object() if emulating else None
    s.slo_oracle = oracle
    s.slo_clock = WallClock()
    s.slo_programs = ProgramTracker()
    s.slo_lengths = None
    s._slo_views, s._slo_stage_deadlines, s._slo_client_caps = {}, {}, {}
    s.waiting_queue, s.running_batch = [], SimpleNamespace(reqs=[])
    return s


def _request(rid: str = "r1") -> SimpleNamespace:
    params = SamplingParams(
        max_new_tokens=CLIENT_CAP,
        custom_params={ORACLE_HINT_PARAM: TRUE_LEN, SLO_PARAM: {"deadline_ms": 5000}, ARRIVAL_PARAM: 1.0},
    )
    return SimpleNamespace(rid=rid, sampling_params=params)


@pytest.fixture
def handled(monkeypatch: pytest.MonkeyPatch) -> list:
    seen: list = []
    monkeypatch.setattr(sglang_scheduler._BaseScheduler, "handle_generate_request", lambda self, r: seen.append(r))
    return seen


def _view_of(s: SloScheduler, recv: SimpleNamespace):
    req = SimpleNamespace(
        rid=recv.rid,
        sampling_params=recv.sampling_params,
        origin_input_ids=[1, 2, 3],
        output_ids=[5],
        customized_info=None,
        prefix_indices=None,
    )
    return s._request_view(req)


@pytest.mark.parametrize("emulating", [True, False], ids=["emulated-gpu", "real-engine"])
def test_the_engine_stops_at_the_true_length_but_the_policy_sees_the_clients_cap(
    handled: list, emulating: bool
) -> None:
    s, recv = _scheduler(emulating=emulating), _request()
    s.handle_generate_request(recv)
    assert handled == [recv]
    assert recv.sampling_params.max_new_tokens == TRUE_LEN and recv.sampling_params.ignore_eos
    view = _view_of(s, recv)
    assert view.max_new_tokens == CLIENT_CAP
    assert view.oracle_output_len is None and view.predicted_output_len is None
    fields = dataclasses.asdict(view)
    assert TRUE_LEN not in [v for k, v in fields.items() if k != "slo"], fields


def test_without_a_hint_the_request_is_untouched(handled: list) -> None:
    s = _scheduler(emulating=False)
    recv = SimpleNamespace(rid="r2", sampling_params=SamplingParams(max_new_tokens=CLIENT_CAP))
    s.handle_generate_request(recv)
    assert recv.sampling_params.max_new_tokens == CLIENT_CAP and not recv.sampling_params.ignore_eos
    assert "r2" not in s._slo_client_caps


def test_only_an_oracle_policy_is_given_the_length(handled: list) -> None:
    s, recv = _scheduler(emulating=True, oracle=True), _request()
    s.handle_generate_request(recv)
    assert _view_of(s, recv).oracle_output_len == TRUE_LEN
