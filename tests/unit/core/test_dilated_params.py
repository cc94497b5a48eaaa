"""Policy time constants on an emulated card in dilated time: card seconds, like its steps."""

from __future__ import annotations

import pytest

from scheduler.components.assembly import build_components
from scheduler.config import SloServerConfig
from scheduler.core.perf_model import profile_path
from scheduler.core.policies import POLICIES, dilated_params
from scheduler.core.registry import ParamError


def test_seconds_parameters_stretch_with_the_card_and_nothing_else_does() -> None:
    default_idle = POLICIES.defaults("slos")["idle_batch_s"]
    out = dilated_params("slos", {"max_candidates": 8}, 5.0)
    assert out == {"max_candidates": 8, "idle_batch_s": pytest.approx(5 * default_idle)}
    assert dilated_params("slos", {"idle_batch_s": 0.02}, 5.0) == {"idle_batch_s": pytest.approx(0.1)}
    assert dilated_params("slos", {"idle_batch_s": 0.02}, 1.0) == {"idle_batch_s": 0.02}
    assert dilated_params("tempo", {}, 5.0) == {}  # no seconds among its parameters


def test_a_bad_value_is_left_for_the_policy_to_refuse_by_name() -> None:
    out = dilated_params("slos", {"idle_batch_s": "soon"}, 5.0)
    with pytest.raises(ParamError, match="idle_batch_s"):
        POLICIES.params("slos", out)


def test_the_server_builds_the_policy_in_card_seconds_under_emulation() -> None:
    profile = str(profile_path("h100", "llama3-8b"))
    live = build_components(SloServerConfig(policy="slos", emulate_profile=profile, emulate_slowdown=5.0))
    plain = build_components(SloServerConfig(policy="slos", emulate_profile=profile))
    assert live.planner.policy.idle == pytest.approx(5 * plain.planner.policy.idle)
