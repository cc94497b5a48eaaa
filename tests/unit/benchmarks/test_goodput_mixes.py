"""benchmarks.goodput.mixes: the papers' class shares and targets, scaling, chains and programs."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest

from benchmarks.goodput.mixes import (
    MIXES,
    POLYSERVE_TPOT_TIERS,
    Calibration,
    Scale,
    ZeroLoad,
    apply_mix,
    dag_depth,
    reference_zero_load,
)
from benchmarks.goodput.records import PlannedRequest
from benchmarks.workloads.traces import TraceRequest
from scheduler.core.perf_model import load_perf_model, profile_path
from scheduler.core.slo import SloClass, parse_slo

N = 2000
REF = reference_zero_load()
SCALE1 = Scale()


def flat(n: int = N, seed: int = 0) -> list[TraceRequest]:
    rng = random.Random(seed)
    return [
        TraceRequest(
            arrival_s=0.1 * i, prompt_tokens=rng.randint(1, 4000), output_tokens=rng.randint(1, 500), rid=f"r{i}"
        )
        for i in range(n)
    ]


def dag_programs(n: int, start: float = 0.0) -> list[TraceRequest]:
    """Deep-research shape: 1 call, then 3 parallel calls, then 1 call (depth 3, 5 calls)."""
    out: list[TraceRequest] = []
    for j in range(n):
        pid, t = f"dr{j}", start + j

        def call(stage: int, c: int, parents: tuple[str, ...], pid: str = pid, t: float = t) -> TraceRequest:
            return TraceRequest(
                arrival_s=t,
                prompt_tokens=200,
                output_tokens=50,
                program_id=pid,
                stage=stage,
                parents=parents,
                rid=f"{pid}.s{stage}.c{c}",
            )

        s0 = call(0, 0, ())
        s1 = [call(1, c, (s0.rid,)) for c in range(3)]
        out += [s0, *s1, call(2, 0, tuple(r.rid for r in s1))]
    return out


def by_program(plan: Sequence[PlannedRequest]) -> dict[str, list[PlannedRequest]]:
    out: dict[str, list[PlannedRequest]] = {}
    for p in plan:
        if p.req.program_id is not None:
            out.setdefault(p.req.program_id, []).append(p)
    return out


def unit_shares(plan: Sequence[PlannedRequest]) -> dict[str, float]:
    """Class share of units: a compound program counts once."""
    counts: Counter[str] = Counter()
    seen: set[str] = set()
    for p in plan:
        if p.cls == "compound":
            assert p.req.program_id is not None
            if p.req.program_id in seen:
                continue
            seen.add(p.req.program_id)
        counts[p.cls] += 1
    total = sum(counts.values())
    return {cls: n / total for cls, n in counts.items()}


# --------------------------------------------------------------------------------------------
# Reference and scale


def test_reference_comes_from_the_h100_profile() -> None:
    model = load_perf_model(profile_path("h100", "llama3-8b"), kind="table")
    assert REF.tpot_ms == pytest.approx(1000 * model.step_time(0, 1, 1024))
    for p in (16, 256, 1024, 4096, 8192):
        assert REF.ttft_ms(p) == pytest.approx(1000 * model.step_time(p, 0, p), rel=0.15)
    assert REF.ttft_ms(100) < REF.ttft_ms(1000) < REF.ttft_ms(8000)


def test_zero_load_fit_recovers_a_line() -> None:
    z = ZeroLoad.fit([(p, 50 + 0.5 * p) for p in (10, 100, 1000)], tpot_ms=40)
    assert (z.ttft_base_ms, z.ttft_per_token_ms, z.tpot_ms) == pytest.approx((50, 0.5, 40))
    assert isinstance(Calibration.fit([(10, 5.0), (20, 6.0)], 3.0), Calibration)
    assert ZeroLoad.fit([(10, 9.0), (1000, 1.0)], 1.0).ttft_per_token_ms == 0  # never decreasing
    with pytest.raises(ValueError):
        ZeroLoad(0, 0, 1)


def test_scale_options() -> None:
    cal = Calibration(REF.ttft_base_ms * 3, REF.ttft_per_token_ms * 3, REF.tpot_ms * 4)
    assert Scale.from_option("auto", cal).tpot_factor == pytest.approx(4)
    assert Scale.from_option("auto", cal).ttft_factor(700) == pytest.approx(3)
    assert Scale.from_option("1.5", cal).tpot_factor == pytest.approx(6)
    assert Scale.from_option(2.0).ttft_factor(10) == Scale.from_option("2").tpot_factor == 2
    for bad in ("fast", "0", "-1", "inf"):
        with pytest.raises(ValueError):
            Scale.from_option(bad, cal)
    with pytest.raises(ValueError, match="calibration"):
        Scale.from_option("auto")


# --------------------------------------------------------------------------------------------
# Tempo and JITServe


@pytest.mark.parametrize(("mix", "expected"), [("tempo", (0.6, 0.2, 0.2)), ("jitserve", (1 / 3, 1 / 3, 1 / 3))])
def test_class_shares_are_unit_shares(mix: str, expected: tuple[float, float, float]) -> None:
    shares = unit_shares(apply_mix(flat(), mix, SCALE1, seed=1))
    for cls, want in zip(("latency", "deadline", "compound"), expected):
        assert shares[cls] == pytest.approx(want, abs=0.04)


@pytest.mark.parametrize("mix", ["tempo", "jitserve"])
def test_tempo_targets_at_scale_one(mix: str) -> None:
    for p in apply_mix(flat(300), mix, SCALE1, seed=2):
        if p.cls == "latency":
            assert p.slo == {"class": "latency", "ttft_ms": 2000.0, "tpot_ms": 100.0}
        elif p.cls == "deadline":
            assert p.slo == {"class": "deadline", "deadline_ms": 20000.0}
        else:
            assert p.cls == "compound"
            stages = p.slo["deadline_ms"] / 20000.0
            assert stages in (1, 2, 3) and p.program_deadline_ms == p.slo["deadline_ms"]


def test_flat_chains_are_well_formed() -> None:
    trace = flat()
    plan = apply_mix(trace, "tempo", SCALE1, seed=3)
    assert sorted(p.req.rid for p in plan) == sorted(r.rid for r in trace)  # nothing lost or duplicated
    original = {r.rid: r for r in trace}
    order = {r.rid: i for i, r in enumerate(trace)}
    programs = by_program(plan)
    assert programs and all(pid.startswith("mix-") for pid in programs)
    for pid, calls in programs.items():
        calls.sort(key=lambda p: p.req.stage or 0)
        reqs = [p.req for p in calls]
        assert 1 <= len(reqs) <= 3 and (len(reqs) >= 2 or pid == max(programs, key=lambda q: int(q[4:])))
        assert [r.stage for r in reqs] == list(range(len(reqs)))
        assert [order[r.rid] for r in reqs] == list(range(order[reqs[0].rid], order[reqs[0].rid] + len(reqs)))
        assert reqs[0].parents == () and all(r.parents == (prev.rid,) for prev, r in zip(reqs, reqs[1:]))
        assert all(r.arrival_s == original[reqs[0].rid].arrival_s and r.think_s == 0 for r in reqs)
        lengths = [(r.prompt_tokens, r.output_tokens) for r in reqs]
        assert lengths == [(original[r.rid].prompt_tokens, original[r.rid].output_tokens) for r in reqs]
        assert {p.slo["deadline_ms"] for p in calls} == {20000.0 * len(reqs)}
        assert [p.slo["stage"] for p in calls] == list(range(len(reqs)))
    assert Counter(len(c) for c in programs.values()).keys() >= {2, 3}
    arrivals = [p.req.arrival_s for p in plan]
    assert arrivals == sorted(arrivals)


def test_programs_kept_whole() -> None:
    trace = dag_programs(300)
    plan = apply_mix(trace, "jitserve", SCALE1, seed=4)
    assert [p.req for p in sorted(plan, key=lambda p: p.req.rid)] == sorted(trace, key=lambda r: r.rid)
    programs = by_program(plan)
    assert set(programs) == {r.program_id for r in trace}
    assert all(len({p.cls for p in calls}) == 1 for calls in programs.values())
    compound = [calls for calls in programs.values() if calls[0].cls == "compound"]
    assert len(compound) == pytest.approx(100, abs=30)
    for calls in compound:
        assert {p.slo["deadline_ms"] for p in calls} == {60000.0}  # 20 s x depth 3, not x 5 calls
        assert sorted(p.slo["stage"] for p in calls) == [0, 1, 1, 1, 2]


def test_mixed_trace_chains_only_lone_requests() -> None:
    trace = sorted(flat(400) + dag_programs(40, start=0.05), key=lambda r: r.arrival_s)
    plan = apply_mix(trace, "tempo", SCALE1, seed=5)
    assert sorted(p.req.rid for p in plan) == sorted(r.rid for r in trace)
    for pid, calls in by_program(plan).items():
        rids = {p.req.rid for p in calls}
        assert (
            all(rid.startswith("r") for rid in rids)
            if pid.startswith("mix-")
            else rids == {r.rid for r in trace if r.program_id == pid}
        )


def test_dag_depth() -> None:
    assert dag_depth(dag_programs(1)) == 3
    a = TraceRequest(arrival_s=0, prompt_tokens=1, output_tokens=1, program_id="p", rid="a")
    b = TraceRequest(arrival_s=0, prompt_tokens=1, output_tokens=1, program_id="p", parents=("a",), rid="b")
    c = TraceRequest(arrival_s=0, prompt_tokens=1, output_tokens=1, program_id="p", parents=("a", "b"), rid="c")
    assert dag_depth([c, b, a]) == 3
    loop = TraceRequest(arrival_s=0, prompt_tokens=1, output_tokens=1, program_id="p", parents=("z",), rid="y")
    z = TraceRequest(arrival_s=0, prompt_tokens=1, output_tokens=1, program_id="p", parents=("y",), rid="z")
    with pytest.raises(ValueError, match="cycle"):
        dag_depth([loop, z])


# --------------------------------------------------------------------------------------------
# PolyServe, SLOs-Serve, GoodServe, none


def test_polyserve_tiers() -> None:
    plan = apply_mix(flat(), "polyserve", SCALE1, seed=6)
    assert {p.cls for p in plan} == {"latency"}
    tpot = Counter(p.slo["tpot_ms"] for p in plan)
    for value, share in POLYSERVE_TPOT_TIERS:
        assert tpot[value] / N == pytest.approx(share, abs=0.03)
    ttft = Counter(round(p.slo["ttft_ms"] / SCALE1.ttft_factor(p.req.prompt_tokens)) for p in plan)
    assert set(ttft) == {300, 500, 1000}
    assert all(n / N == pytest.approx(1 / 3, abs=0.04) for n in ttft.values())


def test_slos_serve_uses_the_prompts_zero_load_ttft() -> None:
    plan = apply_mix(flat(), "slos-serve", SCALE1, seed=7)
    tiers: Counter[tuple[float, float]] = Counter()
    for p in plan:
        slowdown = p.slo["ttft_ms"] / REF.ttft_ms(p.req.prompt_tokens)
        k = 3.0 if abs(slowdown - 3) < 0.05 else 5.0
        assert p.slo["ttft_ms"] == round(k * REF.ttft_ms(p.req.prompt_tokens), 1)
        tiers[(k, p.slo["tpot_ms"])] += 1
    assert set(tiers) == {(3.0, 50.0), (5.0, 100.0)}
    assert tiers[(3.0, 50.0)] / N == pytest.approx(0.5, abs=0.04)


def test_goodserve_deadlines_within_one_to_three_solo() -> None:
    plan = apply_mix(flat(), "goodserve", SCALE1, seed=8)
    relax = [p.slo["deadline_ms"] / REF.solo_ms(p.req.prompt_tokens, p.req.output_tokens) for p in plan]
    assert {p.cls for p in plan} == {"deadline"}
    assert all(1 - 1e-3 <= r <= 3 + 1e-3 for r in relax)
    assert sum(relax) / N == pytest.approx(2.0, abs=0.05)
    assert min(relax) < 1.1 and max(relax) > 2.9


def test_none_mix_sends_no_slo() -> None:
    plan = apply_mix(flat(50), "none", SCALE1, seed=0)
    assert all(p.cls == "none" and p.slo == {} and p.program_deadline_ms is None for p in plan)


# --------------------------------------------------------------------------------------------
# Scaling, determinism, validity


def test_scale_factors_applied() -> None:
    cal = Calibration(REF.ttft_base_ms * 3, REF.ttft_per_token_ms * 3, REF.tpot_ms * 4)
    trace = flat(300)
    for mix in MIXES:
        base = apply_mix(trace, mix, SCALE1, seed=9)
        scaled = apply_mix(trace, mix, Scale(2.0, cal), seed=9)
        for a, b in zip(base, scaled):
            assert (a.cls, a.req) == (b.cls, b.req)
            if "ttft_ms" in a.slo:
                assert b.slo["ttft_ms"] == pytest.approx(6 * a.slo["ttft_ms"], abs=0.4)
                assert b.slo["tpot_ms"] == pytest.approx(8 * a.slo["tpot_ms"], abs=0.4)
            if "deadline_ms" in a.slo and mix != "goodserve":
                assert b.slo["deadline_ms"] == pytest.approx(8 * a.slo["deadline_ms"], abs=0.4)
            if mix == "goodserve":
                solo = 2 * cal.solo_ms(a.req.prompt_tokens, a.req.output_tokens)
                assert 1 - 1e-3 <= b.slo["deadline_ms"] / solo <= 3 + 1e-3


def test_uneven_calibration_scales_short_prompts_more() -> None:
    slow_launch = Calibration(REF.ttft_base_ms * 10, REF.ttft_per_token_ms, REF.tpot_ms)
    scale = Scale(1.0, slow_launch)
    assert scale.ttft_factor(16) > scale.ttft_factor(8000) > 1
    assert scale.tpot_factor == 1


FIXED_SLO_MIXES = (
    "none",
    "slos-chatbot",
    "slos-coder",
    "slos-summarizer",
    "slos-reasoning",
    "slos-chat-tight",
    "slos-chat-tight10",
)  # one SLO per application: nothing is drawn


@pytest.mark.parametrize(
    ("first", "first_tpot", "second", "second_tpot", "ttft_slowdown"),
    [
        ("slos-chatbot", 100.0, "slos-coder", 50.0, 5),  # both loose on prefill
        # both tight on prefill; Summarizer reads at reading speed, Reasoning's tightest SLO binds
        ("slos-summarizer", 100.0, "slos-reasoning", 50.0, 3),
    ],
)
def test_slos_serve_applications_have_their_papers_tiers(
    first: str, first_tpot: float, second: str, second_tpot: float, ttft_slowdown: int
) -> None:
    trace = flat(50)
    a_runs = apply_mix(trace, first, SCALE1, seed=1)
    b_runs = apply_mix(trace, second, SCALE1, seed=1)
    assert {p.slo["tpot_ms"] for p in a_runs} == {first_tpot} and {p.slo["tpot_ms"] for p in b_runs} == {second_tpot}
    for a, b in zip(a_runs, b_runs):  # the TTFT: a slowdown over the zero-load TTFT (Tab. 3)
        expected = round(ttft_slowdown * SCALE1.zero_load_ttft_ms(a.req.prompt_tokens), 1)
        assert a.slo["ttft_ms"] == b.slo["ttft_ms"] == expected


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_deterministic_for_a_seed(mix: str) -> None:
    trace = flat(500) + dag_programs(20, start=100.0)
    assert apply_mix(trace, mix, SCALE1, seed=11) == apply_mix(trace, mix, SCALE1, seed=11)
    if mix not in FIXED_SLO_MIXES:
        assert apply_mix(trace, mix, SCALE1, seed=11) != apply_mix(trace, mix, SCALE1, seed=12)


@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("scale", [SCALE1, Scale(0.001), Scale(3.0, Calibration(50.0, 2.0, 120.0))])
def test_every_body_passes_parse_slo(mix: str, scale: Scale) -> None:
    trace = flat(400) + dag_programs(20, start=100.0)
    for p in apply_mix(trace, mix, scale, seed=13):
        spec = parse_slo(p.slo)
        expected = SloClass.BEST_EFFORT if p.cls == "none" else SloClass(p.cls)
        assert spec.slo_class is expected
        assert all(v == round(v, 1) for k, v in p.slo.items() if k.endswith("_ms"))
        if p.cls == "compound":
            assert spec.program_id == p.req.program_id and spec.deadline_ms == p.program_deadline_ms


def test_unknown_mix_lists_the_valid_names() -> None:
    with pytest.raises(ValueError) as err:
        apply_mix(flat(5), "tempo2", SCALE1, seed=0)
    for name in MIXES:
        assert name in str(err.value)
