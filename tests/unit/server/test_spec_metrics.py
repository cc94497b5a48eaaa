"""The speculation gauges rendered from the scheduler's status snapshot."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from server.spec_metrics import speculation_exposition

ADAPTIVE = {
    "algorithm": "EAGLE",
    "slo_adaptive": True,
    "steps": 3,
    "alpha": 0.8,
    "tokens_per_verify": 2.95,
    "tightened_requests": 2,
    "switches": 5,
    "verifies": 40,
    "steps_used": {"1": 10, "3": 30},
    "per_tier_optimum": {"lengths": {"50.0": 3, "100.0": 1}},
}


def _samples(text: bytes) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_adaptive_status_becomes_gauges_and_counters() -> None:
    got = _samples(speculation_exposition({"speculation": ADAPTIVE}))
    assert got[("sglang_slo_spec_steps", (("algorithm", "EAGLE"),))] == 3
    assert got[("sglang_slo_spec_alpha", ())] == 0.8
    assert got[("sglang_slo_spec_tokens_per_verify", ())] == 2.95
    assert got[("sglang_slo_spec_tightened_requests", ())] == 2
    assert got[("sglang_slo_spec_switches_total", ())] == 5
    assert got[("sglang_slo_spec_verifies_total", ())] == 40
    assert got[("sglang_slo_spec_verifies_at_steps_total", (("steps", "3"),))] == 30
    assert got[("sglang_slo_spec_tier_optimal_steps", (("tpot_ms", "100.0"),))] == 1


def test_fixed_length_shows_only_the_length_and_no_speculation_nothing() -> None:
    got = _samples(speculation_exposition({"speculation": {"algorithm": "NGRAM", "slo_adaptive": False, "steps": 4}}))
    assert got == {("sglang_slo_spec_steps", (("algorithm", "NGRAM"),)): 4}
    assert speculation_exposition({"speculation": None}) == b""
    assert speculation_exposition({}) == b""
