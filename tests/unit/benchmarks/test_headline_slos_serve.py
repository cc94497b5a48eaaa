"""The SLOs-Serve headline on several replicas: the baselines sit behind round-robin and SLOs-Serve
behind its own router, and capacity is the paper's metric, the total rate per GPU."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.experiments.headline_slos_serve import SLOS_SCENARIOS, scenario_capacity, slos_serve, slos_systems


def test_one_replica_is_one_card_behind_no_router() -> None:
    for cfg in slos_systems():
        assert cfg.pool == "a100:1" and cfg.routing == "round_robin", cfg


def test_several_replicas_put_only_slos_serve_behind_its_router() -> None:
    systems = {cfg.label: cfg for cfg in slos_systems(4)}
    assert {cfg.pool for cfg in systems.values()} == {"a100:4"}
    for label in ("vllm", "sarathi"):
        assert systems[label].routing == "round_robin" and systems[label].routing_params == ()
    for label in ("slos", "slos+spec"):
        assert systems[label].routing == "slos" and dict(systems[label].routing_params) == {"order": "round_robin"}


class _Card:
    """Attains 95 % up to `per_gpu` units/s per GPU, then 50 %."""

    def __init__(self, per_gpu: float, gpus: int) -> None:
        self.limit = per_gpu * gpus
        self.rates: list[float] = []

    def run(self, cfg: Any, spec: Any, rate: float, scale: Any, tag: str = "") -> dict[str, float]:
        self.rates.append(rate)
        return {"attainment": 0.95 if rate <= self.limit else 0.5}


@pytest.mark.parametrize("replicas", [1, 4])
def test_capacity_is_per_gpu(replicas: int) -> None:
    card = _Card(per_gpu=5.0, gpus=replicas)
    spec = SLOS_SCENARIOS["chatbot"].spec(100, 0)
    cfg = slos_systems(replicas)[0]
    per_gpu = scenario_capacity(card, "chatbot", cfg, spec, probes=10, replicas=replicas)  # type: ignore[arg-type]
    assert card.rates[0] == 4.0 * replicas  # the search starts at the same load per GPU
    assert 5.0 * 0.95 <= per_gpu <= 5.0, card.rates


class _Cards:
    """Every system attains 95 % up to 5 units/s per GPU, then 50 %."""

    def run(self, cfg: Any, spec: Any, rate: float, scale: Any, tag: str = "") -> dict[str, float]:
        gpus = int(cfg.pool.split(":")[1])
        return {"attainment": 0.95 if rate <= 5.0 * gpus else 0.5}


def test_the_four_replica_row_compares_totals_and_the_ratios_per_gpu() -> None:
    one = slos_serve(_Cards(), [0], quick=False)  # type: ignore[arg-type]
    x4 = one.details["x4"]["x4"][0]
    assert 4 * 5.0 * 0.95 <= x4 <= 4 * 5.0  # the four cards' total rate, not per GPU
    assert one.rows[-1].claim == "ChatBot capacity on 4 replicas / 1 replica"
    four = slos_serve(_Cards(), [0], quick=False, replicas=4, systems_only=("vllm", "sarathi", "slos"))  # type: ignore[arg-type]
    assert set(four.details["x_best_baseline_no_spec"].values()) == {1.0}  # the same per-GPU card everywhere
    assert four.details["x4"] == {}  # no separate four-replica search: every system already ran on four
