"""The routing benchmark's own decisions, without servers: options, the pool and router flags,
the PolyServe tiers in dilated time, per-run pacing and router counters, and the summary
(goodserve's goodput over the best other policy's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.experiments.emulated_routing import (
    Lead,
    finish,
    lead,
    mix_report,
    pacing_delta,
    parse_args,
    policy_params,
    router_counters,
    router_spec,
    routing_table,
    row_cells,
)
from benchmarks.goodput.loadgen import LengthControl
from benchmarks.goodput.mixes import POLYSERVE_TPOT_TIERS, Scale, apply_mix
from benchmarks.goodput.records import RequestRecord
from benchmarks.goodput.scoring import score
from benchmarks.workloads.traces import TraceRequest
from launch_cluster import Cluster, RouterSpec
from router.policies import ROUTING_POLICIES


def test_defaults_run_every_policy_on_both_mixes_with_slos_scaled_by_the_slowdown() -> None:
    args = parse_args([])
    assert args.policy_list == list(ROUTING_POLICIES)
    assert args.mix_list == ["goodserve", "polyserve"]
    assert args.pool_list == ["h100", "a100", "a40", "a40"]
    assert (args.units, args.rate_list, args.max_output) == (80, [3.0], 128)
    assert args.slowdown == args.slo_scale == 8.0
    assert args.client_max_tokens == args.max_output  # the router plans with the client's cap, not the truth
    assert args.control is LengthControl.HINT


def test_quick_shrinks_only_what_was_not_given() -> None:
    quick = parse_args(["--quick"])
    assert (quick.units, quick.max_output, quick.drain_timeout) == (12, 32, 60.0)
    mine = parse_args(["--quick", "--units", "20", "--slowdown", "4", "--slo-scale", "6", "--rates", "1, 2"])
    assert (mine.units, mine.slowdown, mine.slo_scale, mine.rate_list) == (20, 4.0, 6.0, [1.0, 2.0])


@pytest.mark.parametrize(
    "argv",
    [
        ["--policies", "fastest"],
        ["--mixes", "tempo,nope"],
        ["--pool", "h100,b200"],
        ["--rates", "x"],
        ["--policies", ","],
        ["--slowdown", "0.5"],
        ["--policy-param", "goodserve=tau"],
        ["--policy-param", "fastest:k=1"],
    ],
)
def test_bad_options_are_refused_before_anything_starts(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_the_pool_is_one_emulated_worker_per_card_with_the_shared_flags() -> None:
    args = parse_args(["--slowdown", "6", "--slo-policy", "slos", "--max-running-requests", "16"])
    assert [w.name for w in args.workers] == ["h100-0", "a100-1", "a40-2", "a40-3"]
    argv = args.workers[2].argv()
    assert argv[:2] == ["--emulate-gpu", "a40"]
    flags = " ".join(argv)
    assert "--emulate-slowdown 6 --slo-policy slos --max-running-requests 16" in flags


def test_polyserve_gets_the_mix_tiers_in_dilated_time() -> None:
    params = policy_params("polyserve", Scale.from_option(8.0), {})
    assert params["tiers_ms"] == [t * 8 for t, _ in POLYSERVE_TPOT_TIERS] == [160.0, 240.0, 400.0, 800.0]
    assert params["release_after_s"] == 80.0
    assert policy_params("goodserve", Scale.from_option(8.0), {}) == {}
    overridden = policy_params("polyserve", Scale.from_option(8.0), {"polyserve": {"batch_growth": 0.3}})
    assert overridden["batch_growth"] == 0.3 and overridden["tiers_ms"][0] == 160.0


def test_every_polyserve_request_bins_into_its_own_tier_at_an_odd_scale() -> None:
    scale = Scale.from_option(2.37)
    reqs = [TraceRequest(arrival_s=i, prompt_tokens=100, output_tokens=10, rid=f"r{i}") for i in range(200)]
    tpots = {p.slo["tpot_ms"] for p in apply_mix(reqs, "polyserve", scale, seed=0)}
    assert tpots == set(policy_params("polyserve", scale, {})["tiers_ms"])


def test_router_flags_carry_the_policy_its_params_and_extra_args() -> None:
    args = parse_args(["--router-arg=--dead-after-s=2", "--policy-param", "goodserve:tau=20"])
    spec = router_spec("goodserve", Scale.from_option(args.slo_scale), args)
    assert spec.argv(4000) == [
        "--worker-port", "4000", "--routing-policy", "goodserve", "--routing-policy-param", "tau=20",
        "--dead-after-s=2",
    ]  # fmt: skip
    poly = router_spec("polyserve", Scale.from_option(8.0), args).argv(4000)
    assert "tiers_ms=[160.0, 240.0, 400.0, 800.0]" in poly


def test_restarting_the_router_needs_one_and_keeps_the_worker_port() -> None:
    args = parse_args(["--pool", "h100"])
    bare, routed = Cluster(args.workers), Cluster(args.workers, router=RouterSpec(worker_port=45123))
    try:
        with pytest.raises(RuntimeError, match="without a router"):
            bare.restart_router(RouterSpec())
        with pytest.raises(ValueError, match="45123"):
            routed.restart_router(RouterSpec(worker_port=45124))
        assert routed.router is not None and routed.router.proc is None  # nothing was started or stopped
    finally:
        for proc in [*bare.servers, *routed.servers, routed.router]:
            if proc is not None:
                proc.log_path.unlink(missing_ok=True)  # constructing a process makes its log file


def test_pacing_is_counted_per_run() -> None:
    before = {"steps": 100, "late_steps": 2, "unpaced_steps": 0, "p95_abs_error": 0.0}
    after = {"steps": 300, "late_steps": 12, "unpaced_steps": 0, "p95_abs_error": 0.01, "gpu_model": "a40/llama3-8b"}
    delta = pacing_delta(before, after)
    assert delta is not None
    assert (delta["steps"], delta["late_steps"], delta["late_share"]) == (200, 10, 0.05)
    assert pacing_delta(None, after) is None
    assert pacing_delta(after, after)["late_share"] == 0.0  # an idle worker is not late


def test_router_counters_are_found_at_the_top_or_one_level_down() -> None:
    counters = {"migrated": 3, "decision_ns": {"p50": 1000}}
    assert router_counters(counters) is counters
    assert router_counters({"workers": [], "dispatcher": counters}) is counters
    assert router_counters(None) == router_counters({"error": "down"}) == {}


def _run(label: str, goodput: float | None, rate: float = 3.0, **metrics: Any) -> dict[str, Any]:
    m = {"goodput_rps": goodput, "attainment": 0.5, "attained": 10, "lost": 0, "ttft_ms": {"p90": 812.4}, **metrics}
    config = {
        "slo_status": {"workers": [], "dispatcher": {"migrated": 4, "resubmitted": 1, "decision_ns": {"p50": 2500}}},
        "pacing": {"h100-0": {"late_share": 0.004}, "a40-2": {"late_share": 0.021}, "a40-3": None},
    }
    return {"label": label, "rate": rate, "metrics": m, "config": config}


def test_goodserve_is_compared_with_the_best_other_policy_at_the_same_rate() -> None:
    runs = [_run("round_robin", 1.0), _run("least_request", 2.0), _run("goodserve", 2.54), _run("goodserve", 9.0, 6)]
    found = lead(runs, "goodserve", 3.0)
    assert found == Lead("goodserve", 2.54, "least_request", 2.0)
    assert found.ratio == pytest.approx(1.27)
    assert "+27%" in found.line()
    assert lead(runs, "polyserve", 3.0) is None
    assert lead(runs, "goodserve", 6).best_other is None and lead(runs, "goodserve", 6).ratio is None
    assert lead([_run("goodserve", None), _run("random", 1.0)], "goodserve", 3.0).ratio is None


def test_a_row_shows_client_metrics_router_counters_pacing_and_the_lead() -> None:
    runs = [_run("random", 1.0), _run("goodserve", 1.5)]
    cells = row_cells(runs[1], runs)
    assert cells[:5] == ["goodserve", "3.00", "0.500", "10", "1.500"]
    assert cells[6] == "812"  # TTFT p90 ms
    assert cells[9:] == ["4", "1", "0", "2.1% INVALID", "2.5 / -", "1.50"]  # a40-2 ran over 2 % late
    table = routing_table(runs)
    assert table.count("\n") == 3 and "goodput × best other" in table
    report = mix_report("goodserve", runs)
    assert report.startswith("## goodserve") and "x1.50 (+50%" in report


def _record(key: str, *, lost: bool) -> RequestRecord:
    done = {} if lost else {"token_s": [0.5, 0.6], "finish_s": 0.6, "finish_reason": "length"}
    slo = {"class": "deadline", "deadline_ms": 5000.0}
    return RequestRecord(key, "deadline", slo, 10, 2, 0.0, send_s=0.0, **done)


@pytest.mark.parametrize("lost, status", [(False, 0), (True, 1)])
def test_the_exit_status_says_whether_a_request_was_lost(tmp_path: Path, lost: bool, status: int) -> None:
    args = parse_args(["--out", str(tmp_path), "--no-plots"])
    records = [_record("r0", lost=False), _record("r1", lost=lost)]
    run = {"label": "goodserve", "rate": 3.0, "metrics": score(records), "config": {}, "records": records}
    assert finish(args, {"goodserve": [run]}) == status
    assert (tmp_path / "goodserve" / "results.json").is_file()
    assert "## goodserve" in (tmp_path / "results.md").read_text()


def test_goodserve_deadlines_scale_a_solo_run_on_the_mid_tier_card() -> None:
    from benchmarks.experiments.emulated_routing import mix_scale
    from benchmarks.goodput.mixes import profile_zero_load

    goodserve, polyserve = mix_scale("goodserve", 8.0), mix_scale("polyserve", 8.0)
    a100, h100 = profile_zero_load("a100"), profile_zero_load("h100")
    assert goodserve.solo_ms(512, 128) == pytest.approx(8.0 * a100.solo_ms(512, 128))
    assert goodserve.solo_ms(512, 128) > 1.3 * polyserve.solo_ms(512, 128)  # the A100 is slower than the H100
    assert polyserve.tpot_factor == pytest.approx(8.0) and polyserve.solo_ms(512, 128) == pytest.approx(
        8.0 * h100.solo_ms(512, 128)
    )


def test_rates_are_per_offered_second_and_rescoring_rewrites_the_tables(tmp_path: Path) -> None:
    from dataclasses import replace as dc_replace

    from benchmarks.experiments.emulated_routing import main, rescore

    early = [dc_replace(_record(f"r{i}", lost=False), scheduled_s=float(i)) for i in range(3)]  # offered over 2 s
    late = [dc_replace(r, token_s=[4.0, 4.5], finish_s=4.5) for r in early]  # still within 5 s, longer drain
    assert score(early).goodput_rps > 5 * score(late).goodput_rps  # per makespan the slow drain looks worse
    runs = []
    for label, records in (("fast", early), ("drained", late)):
        run = {"label": label, "rate": 3.0, "metrics": score(records), "config": {}, "records": records}
        rescore(run)
        runs.append(run)
    assert runs[0]["metrics"].goodput_rps == runs[1]["metrics"].goodput_rps == 1.5  # 3 attained / 2 s offered
    # A compound stage sent after its parents (scheduled at 7 s) does not stretch the offered
    # window the run recorded from the planned arrivals.
    staged = {"label": "dag", "rate": 3.0, "config": {"offered_window_s": 2.0}, "records": [*early[:2], late[2]]}
    staged["records"][-1] = dc_replace(staged["records"][-1], scheduled_s=7.0)
    rescore(staged)
    assert staged["metrics"].goodput_rps == 1.5
    args = parse_args(["--out", str(tmp_path), "--no-plots", "--mixes", "goodserve"])
    assert finish(args, {"goodserve": runs}) == 0
    (tmp_path / "results.md").unlink()
    assert main(["--out", str(tmp_path), "--no-plots", "--mixes", "goodserve", "--rescore"]) == 0
    assert "## goodserve" in (tmp_path / "results.md").read_text()
