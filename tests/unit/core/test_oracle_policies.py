"""Oracle variants plan with the true length; their base policies never see it."""

from __future__ import annotations

from scheduler.core.policies import POLICIES, make_policy
from scheduler.core.policies.oracle import OracleVariant
from scheduler.core.types import EngineView, RequestView
from tests.unit.core.policy_cases import RecordingPolicy, deadline_request, policy_view


def _view(*reqs: RequestView) -> EngineView:
    return policy_view(reqs, cap=8, chunk=64, free_kv=1000, total_kv=1000)


def _req(rid: str, oracle: int | None, predicted: float | None = 50.0, generated: int = 0) -> RequestView:
    return deadline_request(rid, deadline_ms=1000.0, out=predicted, generated=generated, oracle_output_len=oracle)


def test_oracle_variant_replaces_prediction_with_truth() -> None:
    base = RecordingPolicy()
    OracleVariant(base, "recorder_oracle").plan(_view(_req("a", 300), _req("b", None), _req("c", 5, generated=9)))
    seen = {r.rid: r.predicted_output_len for r in base.views[0].waiting}
    assert seen == {"a": 300.0, "b": 50.0, "c": 10.0}  # no hint: prediction kept; never below progress


def test_oracle_changes_tempo_decisions_only_through_the_hint() -> None:
    short_truth = [_req("long-predicted", 5, predicted=900.0), _req("short-predicted", 900, predicted=5.0)]
    plain = make_policy("tempo").plan(_view(*short_truth)).order
    oracle = make_policy("tempo_oracle").plan(_view(*short_truth)).order
    assert {"tempo_oracle", "gmax_oracle", "slos_oracle"} <= set(POLICIES)
    assert plain is not None and oracle is not None and set(plain) == set(oracle)
    assert plain != oracle  # the truth flips which request is denser


def test_oracle_changes_slos_admission_only_through_the_hint() -> None:
    # Two 600-token bounds do not fit the 1000-token pool together; the true 20-token answers do.
    both = [_req("a", 20, predicted=600.0), _req("b", 20, predicted=600.0)]
    plain = make_policy("slos").plan(_view(*both))
    oracle = make_policy("slos_oracle").plan(_view(*both))
    assert plain.best_effort == {"b"}
    assert oracle.best_effort == set()
