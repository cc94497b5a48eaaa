"""The capacity planner: its search over pool sizes, and planning under speculative decoding."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks.planner.__main__ import Planner, Verdict, cheapest, main, parse_args


def planner_with(attainment_of: dict[str, float], target: float = 0.9) -> tuple[Planner, list[str]]:
    """A planner whose verdicts come from a table (pool -> attainment); records what it asked."""
    args = argparse.Namespace(target=target)
    asked: list[str] = []
    planner = Planner(args, {"h100": 4.0})

    def evaluate(pool: str, speculation: str = "none") -> Verdict:
        asked.append(pool)
        return Verdict(pool, 4.0 * int(pool.split(":")[1]), attainment_of[pool], 0.0, {}, 1, speculation)

    planner.evaluate = evaluate  # type: ignore[method-assign]
    return planner, asked


def test_fewest_finds_the_smallest_pool_that_meets_by_doubling_then_bisection() -> None:
    attainment = {f"h100:{n}": min(1.0, 0.1 * n) for n in range(1, 65)}  # 9 cards reach 0.9
    planner, asked = planner_with(attainment)
    assert planner.fewest(lambda n: f"h100:{n}") == 9
    assert asked[:5] == ["h100:1", "h100:2", "h100:4", "h100:8", "h100:16"]
    assert len(asked) == len(set(asked)) <= 9


def test_fewest_gives_up_when_more_cards_stop_helping() -> None:
    attainment = {f"h100:{n}": 0.5 + 0.001 * n for n in range(1, 1025)}  # a TPOT no card can keep
    planner, asked = planner_with(attainment)
    assert planner.fewest(lambda n: f"h100:{n}") is None
    assert len(asked) == 3


def test_cheapest_prefers_cost_then_attainment() -> None:
    a = Verdict("h100:2", 8.0, 0.95, 0.0, {}, 1)
    b = Verdict("h100:1", 4.0, 0.91, 0.0, {}, 1, "slo")
    c = Verdict("a100:1", 4.0, 0.93, 0.0, {}, 1)
    assert cheapest([a, b, c]) is c
    assert cheapest([]) is None


def test_a_speculation_setting_the_simulator_cannot_run_is_refused_before_planning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--rate", "5", "--speculation", "none,fixed:x"])
    assert "--speculation" in capsys.readouterr().err


def test_speculation_buys_a_smaller_pool_where_tpot_binds(tmp_path: Path) -> None:
    """A 10 ms TPOT tier at a load one H100 cannot keep without drafting: planned under both
    settings, the cheapest pool is one card with SLO-adaptive speculation, against two without."""
    argv = [
        "--mix", "slos-chat-tight10", "--slo-relative-to", "h100", "--rate", "5", "--gpus", "h100",
        "--arrivals", "trace", "--policy", "edf", "--units", "300", "--max-gpus", "4",
        "--speculation", "none,slo", "--spec-layout", "decode-only", "--spec-alpha", "0.8", "--out", str(tmp_path),
    ]  # fmt: skip
    assert main(argv) == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    tried = {(v["pool"], v["speculation"]): v["attainment"] for v in plan["tried"]}
    assert tried[("h100:1", "none")] < 0.9 <= tried[("h100:1", "slo")]
    assert tried[("h100:2", "none")] >= 0.9
    assert (plan["best"]["pool"], plan["best"]["speculation"]) == ("h100:1", "slo")
