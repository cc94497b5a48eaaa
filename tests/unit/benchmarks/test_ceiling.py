"""benchmarks.experiments.ceiling: the packing estimate of how many requests a card could finish."""

from __future__ import annotations

import json

import pytest

from benchmarks.experiments.ceiling import ceiling, main, request_cost, share_fitting
from scheduler.core.perf_model import linear_model
from scheduler.core.sim import SimRequest
from scheduler.core.slo import SloSpec


def _req(i: int, arrival: float, prompt: int, output: int) -> SimRequest:
    return SimRequest(
        rid=f"r{i}", slo=SloSpec(), arrival=arrival, prompt_len=prompt, output_len=output, max_new_tokens=output
    )


def test_cheapest_requests_are_packed_first() -> None:
    # 1 + 2 + 3 fit in 6.5 s whatever the order they are given in; 4 would not.
    assert share_fitting([4.0, 1.0, 3.0, 2.0], 6.5) == pytest.approx(3 / 4)
    assert share_fitting([4.0, 1.0, 3.0, 2.0], 10.0) == 1.0
    assert share_fitting([4.0], 3.9) == 0.0


def test_a_request_costs_its_prompt_and_its_share_of_full_decode_batches() -> None:
    # 1 ms per token processed, 10 ms per step: a full batch of 4 spreads the step over 4 tokens.
    perf = linear_model(base_s=0.010, per_token_s=0.001)
    req = _req(0, 0.0, prompt=100, output=8)
    decode_per_token = (0.010 + 4 * 0.001) / 4
    assert request_cost(req, perf, prefill_per_token=0.001, max_running=4) == pytest.approx(
        100 * 0.001 + 8 * decode_per_token
    )


def test_an_overloaded_window_keeps_the_cheap_requests_and_a_light_one_keeps_all() -> None:
    perf = linear_model(base_s=0.010, per_token_s=0.001)
    light = [_req(i, float(i), prompt=100, output=10) for i in range(10)]  # ~0.15 s of work per second
    heavy = [_req(i, i * 0.01, prompt=100 + 100 * (i % 3), output=10) for i in range(100)]  # ~10 s in 1 s
    assert ceiling(light, perf, rate=1.0, seed=0, max_running=4).fits["0"] == 1.0
    over = ceiling(heavy, perf, rate=100.0, seed=0, max_running=4)
    assert over.work_per_window > 1.0
    assert 0.0 < over.fits["0"] < over.fits["20"]
    assert over.fits["0"] < 1.0
    assert 0.5 < over.prefill_share < 1.0  # prompts of 100-300 tokens against 10 output tokens


def test_the_command_reports_a_lower_ceiling_at_a_higher_rate(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--gpu", "h100", "--mix", "jitserve", "--units", "300", "--seeds", "0", "--max-output", "512"]
    assert main([*argv, "--rates", "5,200", "--json"]) == 0
    rows = {r["rate"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[5.0]["fits"]["0"] == 1.0
    assert rows[200.0]["fits"]["0"] < rows[5.0]["fits"]["0"]
    assert rows[200.0]["work_per_window"] > rows[5.0]["work_per_window"]
