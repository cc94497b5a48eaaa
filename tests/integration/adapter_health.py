"""What every integration test of the SGLang adapter asserts after its workload: the policy made
the passes, none of its decisions raised, and no pass fell back to SGLang's own scheduling (a
moved SGLang internal otherwise degrades to stock SGLang with the server still serving)."""

from __future__ import annotations

from typing import Any


def assert_policy_in_charge(engine: dict[str, Any]) -> None:
    """`engine`: /slo/status's engine part of a server that planned at least one pass."""
    assert engine["plan_errors"] == 0, engine
    assert engine["fallbacks"] == 0, "passes fell back to SGLang's own scheduling"
    assert engine["planned_passes"] > 0, "no pass was planned by the policy"
