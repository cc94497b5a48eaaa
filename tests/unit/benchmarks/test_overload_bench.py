"""The overload benchmark's arithmetic: nominal capacity from the profile, what counts as lost,
shed, admitted and attained, and the table; nothing is started."""

from __future__ import annotations

import pytest

from benchmarks.experiments.overload import (
    Attempt,
    Outcome,
    capacity_rps,
    cluster_of,
    parse_args,
    request_body,
    score,
    table,
)


def test_capacity_falls_with_the_slowdown_and_rises_with_the_batch() -> None:
    base = capacity_rps(parse_args(["--slowdown", "1"]))
    assert capacity_rps(parse_args(["--slowdown", "8"])) == pytest.approx(base / 8)
    assert capacity_rps(parse_args(["--slowdown", "1", "--max-running", "64"])) > base
    assert 10 < base < 200  # an H100 serving 256-in / 64-out Llama-3-8B requests, 32 at a time


def test_quick_defaults_and_the_bodies_sent() -> None:
    import random

    args = parse_args(["--quick"])
    assert args.load_list == [0.5, 2.0, 5.0] and args.duration == 30.0
    body = request_body(args, random.Random(0), has_slo=True)
    assert len(body["input_ids"]) == args.prompt and body["slo"]["on_infeasible"] == "reject"
    assert body["slo"]["ttft_ms"] == args.ttft_ms * args.slowdown
    assert "slo" not in request_body(args, random.Random(0), has_slo=False)
    cluster = cluster_of(args, workers=2)  # built, not started
    assert len(cluster.servers) == 2 and "--max-queued-requests" in cluster.router.args


def _o(*attempts: Attempt, slo: bool = True) -> Outcome:
    out = Outcome("r", slo, 0.0)
    out.attempts.extend(attempts)
    return out


def test_scoring_separates_sheds_retries_and_the_lost() -> None:
    ok = Attempt(200, 1.0, attained=True)
    missed = Attempt(200, 1.0, attained=False)
    shed = Attempt(429, 0.01, shed_reason="queue_full", retry_after_s=2)
    infeasible = Attempt(503, 0.02, shed_reason="slo_infeasible", retry_after_s=1)
    outcomes = [
        _o(ok),
        _o(missed),
        _o(shed, ok),  # shed, then admitted after Retry-After
        _o(infeasible, shed),  # shed twice
        _o(Attempt(None, 600.0)),  # no answer: lost
        _o(Attempt(502, 0.1)),  # an error without a shed reason: lost too
        _o(ok, slo=False),
    ]
    m = score(outcomes, window_s=10.0)
    assert m["sent"] == 7 and m["admitted"] == 4 and m["lost"] == 2
    assert m["goodput_rps"] == pytest.approx(0.3)
    assert m["admitted_attainment"] == pytest.approx(2 / 3)  # SLO requests only
    assert m["shed_share"] == pytest.approx(2 / 7) and m["shed_reasons"] == {"queue_full": 1, "slo_infeasible": 1}
    assert m["retry_after_accuracy"] == pytest.approx(0.5) and m["retries"] == 2
    assert m["p99_rejection_s"] == pytest.approx(0.02)
    row = {
        "load": 2.0,
        "rate": 3.0,
        "metrics": m,
        "rss_mb": {"router": 100.0, "w": 900.0},
        "late_share": 0.03,
        "valid": False,
    }
    assert "| 2x | 3.00 | 0.30 | 0.667 | 28.6% | 50.0% | 2 |" in table([row]) and "NO" in table([row])
