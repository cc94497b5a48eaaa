"""Pattern-graph matching for compound requests: per-stage sub-deadlines from similar history.

JITServe §4.1 / Tempo §4.1. A multi-stage program is a chain of *super-nodes*, one per stage
(the stage's parallel calls merged): node weight = total output tokens, edge weight = total
input tokens entering the stage. A partially executed program is matched against stored
patterns that are longer and share its prefix structure (same call kinds per stage), by a
Gaussian-kernel similarity over node and edge weights. The best match's accumulated share
φ(s) = t_{≤s} / t_total gives stage s the sub-deadline D_s = φ(s)·D of the program deadline D.
History is clustered with K-medoids (match medoids first, then their members) and patterns
that are rarely matched decay (×0.9 per hour) and are evicted first when the store is full.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DEEPRESEARCH = Path("/work/shared/data/jitserve-deepresearch/deepresearch_training.json")


@dataclass(frozen=True)
class StageCost:
    """Time of one call from its token counts, in decode-token units (only ratios matter)."""

    prefill_per_token: float = 0.01
    decode_per_token: float = 1.0

    def call_time(self, input_tokens: float, output_tokens: float) -> float:
        return input_tokens * self.prefill_per_token + output_tokens * self.decode_per_token


@dataclass(frozen=True)
class SuperNode:
    out_tokens: float  # node weight: all calls' output tokens
    in_tokens: float  # weight of the edge into this stage: all calls' input tokens
    fanout: int  # parallel calls in the stage
    kind: str = "llm"  # model/tool identity: a different one at a stage means a different pattern
    time: float = 0.0  # the stage's duration: its slowest parallel call

    @classmethod
    def from_calls(cls, calls: Sequence[tuple[float, float]], cost: StageCost, kind: str = "llm") -> SuperNode:
        """`calls` are (input_tokens, output_tokens) pairs run in parallel."""
        if not calls:
            raise ValueError("a stage needs at least one call")
        return cls(
            out_tokens=float(sum(o for _, o in calls)),
            in_tokens=float(sum(i for i, _ in calls)),
            fanout=len(calls),
            kind=kind,
            time=max(cost.call_time(i, o) for i, o in calls),
        )


@dataclass(frozen=True)
class PatternGraph:
    stages: tuple[SuperNode, ...]
    app_id: str | None = None

    def __len__(self) -> int:
        return len(self.stages)

    def prefix(self, n: int) -> PatternGraph:
        return PatternGraph(self.stages[:n], self.app_id)

    def times(self) -> np.ndarray:
        return np.array([s.time for s in self.stages], dtype=float)

    def phi(self) -> np.ndarray:
        """Accumulated share φ(s) = t_{≤s}/t_total: non-decreasing, ends at exactly 1."""
        t = self.times()
        total = t.sum()
        if total <= 0:
            return np.arange(1, len(t) + 1, dtype=float) / max(len(t), 1)
        out = np.cumsum(t) / total
        out[-1] = 1.0
        return np.maximum.accumulate(out)


def node_similarity(a: SuperNode, b: SuperNode, sigma: float, node_weight: float) -> float:
    """Gaussian kernels on log token counts: scale-free, so 100 vs 200 ≈ 1000 vs 2000."""
    dn = math.log1p(a.out_tokens) - math.log1p(b.out_tokens)
    de = math.log1p(a.in_tokens) - math.log1p(b.in_tokens)
    k = 2.0 * sigma * sigma
    return node_weight * math.exp(-dn * dn / k) + (1.0 - node_weight) * math.exp(-de * de / k)


def similarity(partial: PatternGraph, candidate: PatternGraph, sigma: float = 0.5, node_weight: float = 0.5) -> float:
    """Mean per-stage similarity over the shorter graph's stages (the longer one's prefix)."""
    n = min(len(partial), len(candidate))
    if n == 0:
        return 0.0
    return sum(node_similarity(partial.stages[i], candidate.stages[i], sigma, node_weight) for i in range(n)) / n


def diverges(partial: PatternGraph, candidate: PatternGraph, match_fanout: bool = False) -> bool:
    """True when `candidate` cannot be where `partial` is heading: it is not longer, or some
    stage so far invoked a different model/tool (or, optionally, fanned out differently)."""
    if len(candidate) <= len(partial):
        return True
    for a, b in zip(partial.stages, candidate.stages, strict=False):
        if a.kind != b.kind or (match_fanout and a.fanout != b.fanout):
            return True
    return False


def graph_distance(a: PatternGraph, b: PatternGraph, sigma: float = 0.5, length_penalty: float = 0.5) -> float:
    """Dissimilarity for clustering whole patterns: kernel distance plus a length mismatch term."""
    kinds = sum(x.kind != y.kind for x, y in zip(a.stages, b.stages, strict=False))
    longest = max(len(a), len(b), 1)
    return 1.0 - similarity(a, b, sigma) + length_penalty * (abs(len(a) - len(b)) + kinds) / longest


def kmedoids(dist: np.ndarray, k: int, max_iter: int = 50, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """K-medoids on a precomputed distance matrix: k-medoids++ seeding, then alternate
    (assign to nearest medoid; move each medoid to its cluster's most central member).
    Returns (medoid indices, label per point)."""
    n = dist.shape[0]
    if n == 0:
        return np.zeros(0, int), np.zeros(0, int)
    k = min(k, n)
    rng = np.random.default_rng(seed)
    medoids = [int(rng.integers(n))]
    while len(medoids) < k:
        d = dist[:, medoids].min(axis=1) ** 2
        if d.sum() <= 0:
            rest = np.setdiff1d(np.arange(n), medoids)
            medoids.append(int(rest[0]))
            continue
        medoids.append(int(rng.choice(n, p=d / d.sum())))
    meds = np.array(medoids)
    labels = dist[:, meds].argmin(axis=1)
    for _ in range(max_iter):
        new = meds.copy()
        for c in range(k):
            members = np.flatnonzero(labels == c)
            if len(members):
                new[c] = members[dist[np.ix_(members, members)].sum(axis=1).argmin()]
        new_labels = dist[:, new].argmin(axis=1)
        if np.array_equal(new, meds) and np.array_equal(new_labels, labels):
            break
        meds, labels = new, new_labels
    return meds, labels


@dataclass
class _Entry:
    graph: PatternGraph
    score: float = 1.0  # reuse frequency, decayed over time


@dataclass
class Match:
    graph: PatternGraph
    similarity: float


@dataclass
class PatternLibrary:
    """History of finished programs, matched against running ones to amortise deadlines."""

    sigma: float = 0.5
    node_weight: float = 0.5
    match_fanout: bool = False
    capacity: int = 10_000
    decay_per_hour: float = 0.9
    probe: int = 3  # clusters searched when an index is built
    _entries: list[_Entry] = field(default_factory=list)
    _medoids: np.ndarray | None = None
    _labels: np.ndarray | None = None
    _last_decay: float = 0.0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, graph: PatternGraph) -> None:
        """Store a finished program; when full, evict the least-reused pattern first."""
        if len(self._entries) >= self.capacity:
            worst = min(range(len(self._entries)), key=lambda i: self._entries[i].score)
            del self._entries[worst]
            self._medoids = self._labels = None
        self._entries.append(_Entry(graph))
        if self._labels is not None:
            self._labels = np.append(self._labels, -1)  # unclustered until the next rebuild

    def decay(self, now: float) -> None:
        """Age reuse scores by decay_per_hour for each hour since the last call (clock injected)."""
        hours = max(now - self._last_decay, 0.0) / 3600.0
        factor = self.decay_per_hour**hours
        for e in self._entries:
            e.score *= factor
        self._last_decay = now

    def evict_below(self, min_score: float) -> int:
        before = len(self._entries)
        self._entries = [e for e in self._entries if e.score >= min_score]
        if len(self._entries) != before:
            self._medoids = self._labels = None
        return before - len(self._entries)

    def scores(self) -> list[float]:
        return [e.score for e in self._entries]

    def build_index(self, k: int, seed: int = 0) -> None:
        """Cluster stored patterns with K-medoids (offline), so matching probes a few clusters."""
        graphs = [e.graph for e in self._entries]
        n = len(graphs)
        dist = np.zeros((n, n))
        for i in range(n):
            for j in range(i + 1, n):
                dist[i, j] = dist[j, i] = graph_distance(graphs[i], graphs[j], self.sigma)
        self._medoids, self._labels = kmedoids(dist, k, seed=seed)

    def _candidates(self, partial: PatternGraph) -> list[int]:
        if self._medoids is None or self._labels is None or len(self._medoids) == 0:
            return list(range(len(self._entries)))
        med_sim = [similarity(partial, self._entries[m].graph, self.sigma, self.node_weight) for m in self._medoids]
        chosen = set(np.argsort(med_sim)[::-1][: self.probe].tolist())
        return [i for i, lab in enumerate(self._labels) if lab in chosen or lab < 0]

    def match(self, partial: PatternGraph, top_k: int = 1) -> list[Match]:
        """Most similar stored patterns that extend `partial`; the winners' scores go up.

        Falls back to the whole store when the probed clusters hold no extension, and drops the
        fan-out rule before giving up, so a new program always gets a pattern if any is longer.
        """
        for pool in (self._candidates(partial), range(len(self._entries))):
            for fanout in (True, False) if self.match_fanout else (False,):
                scored = [
                    (similarity(partial, self._entries[i].graph, self.sigma, self.node_weight), i)
                    for i in pool
                    if not diverges(partial, self._entries[i].graph, fanout)
                ]
                if scored:
                    scored.sort(key=lambda t: -t[0])
                    best = scored[:top_k]
                    for _, i in best:
                        self._entries[i].score += 1.0
                    return [Match(self._entries[i].graph, s) for s, i in best]
        return []

    def phi_next(self, partial: PatternGraph, top_k: int = 1) -> float | None:
        """Predicted φ at the next stage (index len(partial)), similarity-weighted over top_k."""
        matches = self.match(partial, top_k)
        if not matches:
            return None
        w = np.array([max(m.similarity, 1e-9) for m in matches])
        vals = np.array([m.graph.phi()[len(partial)] for m in matches])
        return float((w * vals).sum() / w.sum())

    def stage_deadline(self, partial: PatternGraph, deadline: float, top_k: int = 1) -> float | None:
        """D_s = φ(s)·D for the next stage s = len(partial), relative to program arrival."""
        phi = self.phi_next(partial, top_k)
        return None if phi is None else phi * deadline


def load_deepresearch(path: Path = DEEPRESEARCH, cost: StageCost | None = None) -> list[PatternGraph]:
    """The JITServe deep-research traces as super-node chains (all calls are LLM calls)."""
    cost = cost or StageCost()
    graphs = []
    for job in json.loads(Path(path).read_text()):
        stages = sorted(job["stages"], key=lambda s: s["stage_number"])
        nodes = tuple(
            SuperNode.from_calls([(r["input_tokens"], r["output_tokens"]) for r in s["requests"]], cost) for s in stages
        )
        graphs.append(PatternGraph(nodes, app_id="deepresearch"))
    return graphs


def evaluate_next_stage(
    train: Sequence[PatternGraph], test: Sequence[PatternGraph], library: PatternLibrary, top_k: int = 1
) -> dict[str, float]:
    """Relative error of the predicted next-stage accumulated share φ(N) given the first N
    stages, against the test program's true φ(N). `library` already holds `train`. Baselines:
    the training mean of φ(N) over programs with more than N stages (no matching), and a
    uniform split by the mean stage count. Also the single-stage share t_N/t_total error."""
    mean_len = float(np.mean([len(g) for g in train]))
    errs, errs_mean, errs_uniform, errs_share = [], [], [], []
    for g in test:
        truth = g.phi()
        shares = g.times() / max(g.times().sum(), 1e-12)
        for n in range(1, len(g)):
            partial = g.prefix(n)
            pred = library.phi_next(partial, top_k)
            if pred is None:
                continue
            errs.append(abs(pred - truth[n]) / truth[n])
            longer = [h.phi()[n] for h in train if len(h) > n]
            errs_mean.append(abs(float(np.mean(longer)) - truth[n]) / truth[n])
            errs_uniform.append(abs(min((n + 1) / mean_len, 1.0) - truth[n]) / truth[n])
            match = library.match(partial, 1)[0].graph
            t = match.times()
            errs_share.append(abs(t[n] / t.sum() - shares[n]) / max(shares[n], 1e-12))
    return {
        "points": float(len(errs)),
        "phi_rel_err_mean": float(np.mean(errs)),
        "phi_rel_err_median": float(np.median(errs)),
        "phi_rel_err_p90": float(np.quantile(errs, 0.9)),
        "baseline_mean_phi_rel_err_mean": float(np.mean(errs_mean)),
        "baseline_uniform_rel_err_mean": float(np.mean(errs_uniform)),
        "stage_share_rel_err_median": float(np.median(errs_share)),
    }


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Next-stage φ error of pattern-graph matching on deep-research traces")
    ap.add_argument("--data", type=Path, default=DEEPRESEARCH)
    ap.add_argument("--train-frac", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sigma", type=float, default=0.5)
    ap.add_argument("--top-k", type=int, default=1)
    ap.add_argument("--clusters", type=int, default=0, help="K-medoids clusters for the index (0: exhaustive)")
    ap.add_argument("--prefill-per-token", type=float, default=StageCost.prefill_per_token)
    args = ap.parse_args(argv)

    graphs = load_deepresearch(args.data, StageCost(prefill_per_token=args.prefill_per_token))
    order = np.random.default_rng(args.seed).permutation(len(graphs))
    cut = int(len(graphs) * args.train_frac)
    train, test = [graphs[i] for i in order[:cut]], [graphs[i] for i in order[cut:]]
    library = PatternLibrary(sigma=args.sigma)
    for g in train:
        library.add(g)
    if args.clusters:
        library.build_index(args.clusters, seed=args.seed)
    res = evaluate_next_stage(train, test, library, args.top_k)
    print(f"deep-research: {len(train)} train / {len(test)} test programs, {int(res['points'])} next-stage predictions")
    for key, value in res.items():
        if key != "points":
            print(f"  {key:34s} {value:.4f}")


if __name__ == "__main__":
    main()
