"""Pattern-graph matching: recovers a perturbed known DAG, φ is a proper accumulated share."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core.analyzer.graph import (
    DEEPRESEARCH,
    PatternGraph,
    PatternLibrary,
    StageCost,
    SuperNode,
    diverges,
    evaluate_next_stage,
    kmedoids,
    load_deepresearch,
)

COST = StageCost()


def chain(stages: list[list[tuple[float, float]]], kinds: list[str] | None = None) -> PatternGraph:
    kinds = kinds or ["llm"] * len(stages)
    return PatternGraph(tuple(SuperNode.from_calls(c, COST, k) for c, k in zip(stages, kinds, strict=False)))


# Three distinct shapes: short-answer pipeline, wide research fan-out, long-writing chain.
PATTERNS = {
    "qa": [[(300, 20)], [(500, 40)], [(800, 30)], [(900, 60)]],
    "research": [[(400, 100)], [(200, 900), (180, 850), (190, 870)], [(4000, 150)], [(6000, 1000)]],
    "writer": [[(1000, 600)], [(1600, 700)], [(2300, 800)], [(3000, 900)], [(3800, 950)]],
}


def perturb(stages, rng, scale=0.15):
    return [[(i * rng.lognormal(0, scale), o * rng.lognormal(0, scale)) for i, o in st] for st in stages]


def test_matching_recovers_perturbed_pattern():
    rng = np.random.default_rng(0)
    lib = PatternLibrary(sigma=0.5)
    for stages in PATTERNS.values():
        for _ in range(5):
            lib.add(chain(perturb(stages, rng)))
    for stages in PATTERNS.values():
        for n in (1, 2, 3):
            probe = chain(perturb(stages, rng, 0.1)).prefix(n)
            best = lib.match(probe)[0].graph
            assert len(best) == len(stages)
            assert best.stages[0].out_tokens == pytest.approx(stages[0][0][1], rel=0.6)
            assert sum(s.fanout for s in best.stages) == sum(len(st) for st in stages)


def test_phi_monotone_and_ends_at_one():
    rng = np.random.default_rng(1)
    for stages in PATTERNS.values():
        phi = chain(perturb(stages, rng)).phi()
        assert np.all(np.diff(phi) >= 0)
        assert phi[-1] == 1.0 and phi[0] > 0
    assert list(chain([[(0, 0)], [(0, 0)]]).phi()) == [0.5, 1.0]


def test_sub_deadline_is_phi_times_deadline():
    lib = PatternLibrary()
    full = chain(PATTERNS["writer"])
    lib.add(full)
    assert lib.stage_deadline(full.prefix(2), 10.0) == pytest.approx(full.phi()[2] * 10.0)
    assert lib.stage_deadline(full, 10.0) is None  # nothing longer to learn from


def test_prefix_divergence_prunes_other_tools():
    a = chain(PATTERNS["qa"], ["llm", "search", "llm", "llm"])
    b = chain(PATTERNS["qa"], ["llm", "llm", "llm", "llm"])
    assert diverges(b.prefix(2), a) and not diverges(a.prefix(2), a)
    assert diverges(a, a.prefix(3))  # a candidate must be longer than the partial
    lib = PatternLibrary()
    lib.add(a)
    lib.add(chain(PATTERNS["writer"]))
    assert lib.match(b.prefix(2))[0].graph is not a


def test_kmedoids_separates_clusters():
    pts = np.concatenate([np.zeros(5), np.full(5, 10.0), np.full(5, 20.0)]) + np.arange(15) * 0.01
    dist = np.abs(pts[:, None] - pts[None, :])
    meds, labels = kmedoids(dist, 3, seed=0)
    assert len(set(labels[:5])) == len(set(labels[5:10])) == len(set(labels[10:])) == 1
    assert len(set(labels)) == 3
    assert set(meds.tolist()) <= set(range(15))


def test_indexed_matching_and_decayed_eviction():
    rng = np.random.default_rng(2)
    lib = PatternLibrary(capacity=12, probe=1)
    for stages in PATTERNS.values():
        for _ in range(4):
            lib.add(chain(perturb(stages, rng)))
    lib.build_index(3)
    probe = chain(PATTERNS["research"]).prefix(2)
    assert lib.match(probe)[0].graph.stages[1].fanout == 3
    lib.decay(now=3600.0)
    scores = lib.scores()
    assert max(scores) == pytest.approx(2.0 * 0.9) and min(scores) == pytest.approx(0.9)
    lib.add(chain(PATTERNS["qa"]))  # full: evicts a never-matched pattern, keeps the reused one
    assert len(lib) == 12 and max(lib.scores()) == pytest.approx(1.8)
    assert lib.evict_below(1.0) == 10


@pytest.mark.skipif(not DEEPRESEARCH.exists(), reason="deep-research traces not present")
def test_deepresearch_matching_beats_uniform():
    graphs = load_deepresearch()
    assert len(graphs) == 394 and {len(g) for g in graphs} == {4, 6}
    train, test = graphs[:300], graphs[300:]
    lib = PatternLibrary()
    for g in train:
        lib.add(g)
    res = evaluate_next_stage(train, test, lib)
    assert res["phi_rel_err_mean"] < res["baseline_uniform_rel_err_mean"]
