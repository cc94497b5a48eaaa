"""--slo-tenant-fairness reaches the scheduler's plan settings (the fair-share blend between API
keys), next to the policies' own --slo-fairness between requests."""

from __future__ import annotations

import pytest

import launch_server
from scheduler.config import ENV_VAR, SloServerConfig
from scheduler.core.fairness import DEFAULT_TENANT_FAIRNESS
from scheduler.core.plan_path import settings_for
from scheduler.core.policies import make_policy


def test_the_flag_travels_to_the_plan_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.server_args import ServerArgs  # noqa: F401 - the parser needs SGLang's flags

    parser = launch_server.build_parser()
    assert parser.parse_args(["--model-path", "m"]).slo_tenant_fairness == DEFAULT_TENANT_FAIRNESS
    args = parser.parse_args(["--model-path", "m", "--slo-tenant-fairness", "0.2", "--slo-fairness", "0.7"])
    assert (args.slo_tenant_fairness, args.slo_fairness) == (0.2, 0.7)  # two blends, two flags
    monkeypatch.setenv(ENV_VAR, "")  # restored after the test
    SloServerConfig(policy="edf", tenant_fairness=0.2).to_env()
    config = SloServerConfig.from_env()
    assert settings_for(make_policy(config.policy), tenant_fairness=config.tenant_fairness).tenant_fairness == 0.2
    assert settings_for(make_policy("edf")).tenant_fairness == DEFAULT_TENANT_FAIRNESS
