"""benchmarks.experiments.tenant_fairness on a short real-trace flood: each tenant's shares add up, the tenants'
requests and program ids stay apart, and the blend gives the smaller tenant at least what it
got without it."""

from __future__ import annotations

import json

import pytest

from benchmarks.experiments.tenant_fairness import main


def test_two_tenants_shares_with_and_without_the_blend(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--gpu", "a100", "--mix", "tempo", "--units", "60", "--rate", "40", "--seeds", "0"]
    assert main([*argv, "--fairness", "0,1", "--json"]) == 0
    rows = {r["fairness"]: r for r in json.loads(capsys.readouterr().out)}
    for row in rows.values():
        for key in ("served_share", "token_share", "flood_token_share"):
            assert row[f"A_{key}"] + row[f"B_{key}"] == pytest.approx(1.0)
        assert row["A_served_share"] > row["B_served_share"]  # A sent four times as much
    assert rows[1.0]["B_flood_token_share"] >= rows[0.0]["B_flood_token_share"]
