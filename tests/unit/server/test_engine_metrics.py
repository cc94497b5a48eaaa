"""The engine's series on a worker's /metrics, rendered from the scheduler's status snapshot."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from server.engine_metrics import engine_exposition
from tests.unit.deploy.test_monitoring import _engine_status


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def test_the_engine_status_becomes_series() -> None:
    samples = _samples(engine_exposition(_engine_status()))
    assert samples[("sglang_slo_engine_waiting", ())] == 1
    assert samples[("sglang_slo_engine_kv_capacity_tokens", ())] == 1000
    assert samples[("sglang_slo_engine_preempted_total", ())] == 1
    assert samples[("sglang_slo_engine_late_steps_total", ())] == 1
    assert samples[("sglang_slo_engine_emulated_steps_total", ())] == 100
    assert samples[("sglang_slo_engine_predicted_decode_seconds", (("batch", "8"),))] == 0.009


def test_unknown_values_are_left_out_and_no_snapshot_means_no_series() -> None:
    status = {**_engine_status(), "kv_used_tokens": None, "emulation": None}
    names = {name for name, _ in _samples(engine_exposition(status))}
    assert "sglang_slo_engine_kv_used_tokens" not in names and "sglang_slo_engine_late_steps_total" not in names
    assert engine_exposition({}) == b""
