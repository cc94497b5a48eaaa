"""GoodServe §3.2: a mixture-of-experts-style output-length predictor over TF-IDF features.

The task type (code, SQL, chit-chat) shapes output length, but it is implicit in the prompt. So
K small MLP experts each specialise on one cell of a √K×√K grid of input-length × output-length
tiers (trained on one half of the data), and a gating MLP trained afterwards on the other half,
with the experts frozen, learns from the text which experts to trust. The prediction is the
gate-probability-weighted sum of expert outputs. Experts regress log(1+L): lengths are skewed.
Experts are sklearn MLPs; the gate is a small numpy MLP because it is trained through the
mixture (sklearn has no softmax-mixture loss).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from sklearn.dummy import DummyRegressor
from sklearn.exceptions import ConvergenceWarning
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.neural_network import MLPRegressor

from scheduler.core.analyzer.base import LengthPredictor, LengthSample, floor_at_generated
from scheduler.core.analyzer.qrf import generated_prefix
from scheduler.core.registry import require


def tier_edges(values: np.ndarray, tiers: int) -> np.ndarray:
    """Interior quantile cut points splitting `values` into `tiers` roughly equal groups."""
    return np.quantile(values, np.linspace(0, 1, tiers + 1)[1:-1])


class SoftmaxGate:
    """GoodServe's router: a two-layer MLP whose softmax weights the frozen experts.

    Trained end to end on the mixture's own error, mean((sum_k p_k E_k - y)^2) in log-length
    space, with full-batch Adam; a classifier on "which expert was closest" would learn only
    hard labels and blur between equally good experts.
    """

    def __init__(self, hidden: int = 32, epochs: int = 300, lr: float = 0.01, l2: float = 1e-4, seed: int = 0):
        self.hidden, self.epochs, self.lr, self.l2, self.seed = hidden, epochs, lr, l2, seed
        self.params: list[np.ndarray] = []

    def _forward(self, x: sparse.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
        w1, b1, w2, b2 = self.params
        h = np.maximum(x @ w1 + b1, 0.0)
        z = h @ w2 + b2
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        return h, p / p.sum(axis=1, keepdims=True)

    def fit(self, x: sparse.csr_matrix, experts: np.ndarray, y: np.ndarray) -> SoftmaxGate:
        rng = np.random.default_rng(self.seed)
        d, k = x.shape[1], experts.shape[1]
        self.params = [
            rng.normal(0, 1 / math.sqrt(d), (d, self.hidden)),
            np.zeros(self.hidden),
            rng.normal(0, 1 / math.sqrt(self.hidden), (self.hidden, k)),
            np.zeros(k),
        ]
        m = [np.zeros_like(w) for w in self.params]
        v = [np.zeros_like(w) for w in self.params]
        n = x.shape[0]
        for t in range(1, self.epochs + 1):
            h, p = self._forward(x)
            y_hat = (p * experts).sum(axis=1)
            d_yhat = 2.0 * (y_hat - y) / n
            d_z = d_yhat[:, None] * p * (experts - y_hat[:, None])  # softmax-mixture gradient
            d_h = (d_z @ self.params[2].T) * (h > 0)
            grads = [x.T @ d_h, d_h.sum(0), h.T @ d_z, d_z.sum(0)]
            for i, g in enumerate(grads):
                g = np.asarray(g) + self.l2 * self.params[i]
                m[i] = 0.9 * m[i] + 0.1 * g
                v[i] = 0.999 * v[i] + 0.001 * g * g
                self.params[i] -= self.lr * (m[i] / (1 - 0.9**t)) / (np.sqrt(v[i] / (1 - 0.999**t)) + 1e-8)
        return self

    def predict_proba(self, x: sparse.csr_matrix) -> np.ndarray:
        return self._forward(x)[1]


@dataclass(frozen=True)
class MoeParams:
    n_experts: int = 9  # tiers × tiers (input-length tier × output-length tier)
    max_features: int = 4000
    expert_hidden: tuple[int, ...] = (32, 16)
    gate_hidden: int = 32
    gate_epochs: int = 600
    expert_lr: float = 0.01
    min_expert_samples: int = 8
    max_iter: int = 300
    seed: int = 0

    def __post_init__(self) -> None:
        tiers = int(round(math.sqrt(self.n_experts))) if self.n_experts > 0 else 0
        ok = tiers >= 1 and tiers * tiers == self.n_experts
        require(ok, "n_experts", "must be a perfect square (tiers × tiers)", self.n_experts)


class MoePredictor(LengthPredictor):
    name = "moe"

    def __init__(self, params: MoeParams = MoeParams()) -> None:
        self.n_experts = params.n_experts
        self.tiers = int(round(math.sqrt(params.n_experts)))
        self.expert_hidden = params.expert_hidden
        self.gate_hidden = params.gate_hidden
        self.gate_epochs = params.gate_epochs
        self.expert_lr = params.expert_lr
        self.min_expert_samples = params.min_expert_samples
        self.max_iter = params.max_iter
        self.seed = params.seed
        self.vectorizer = TfidfVectorizer(
            max_features=params.max_features, sublinear_tf=True, ngram_range=(1, 2), min_df=2
        )
        self.experts: list[MLPRegressor | DummyRegressor] = []
        self.gate: SoftmaxGate | None = None
        self.in_edges = np.zeros(0)
        self.out_edges = np.zeros(0)

    def _features(self, texts: Sequence[str], prompt_lens: Sequence[int] | np.ndarray) -> sparse.csr_matrix:
        dense = np.log1p(np.asarray(prompt_lens, float)).reshape(-1, 1) / 10.0
        return sparse.hstack([self.vectorizer.transform(texts), sparse.csr_matrix(dense)], format="csr")

    def _expert_outputs(self, x: sparse.csr_matrix) -> np.ndarray:
        """(n, K) expert predictions in log(1+L) space."""
        return np.column_stack([e.predict(x) for e in self.experts])

    def fit(self, samples: Sequence[LengthSample]) -> MoePredictor:
        # max_iter is a deliberate training budget, not a bug to warn about on every expert.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return self._fit(samples)

    def _fit(self, samples: Sequence[LengthSample]) -> MoePredictor:
        if len(samples) < 4:
            raise ValueError("MoE needs at least 4 samples (two halves)")
        rng = np.random.default_rng(self.seed)
        order = rng.permutation(len(samples))
        half = len(samples) // 2
        first = [samples[i] for i in order[:half]]
        second = [samples[i] for i in order[half:]]
        self.vectorizer.set_params(min_df=1 if len(samples) < 50 else 2)
        self.vectorizer.fit([s.prompt_text for s in samples])
        # The pruned-terms set is only introspection and dominates the pickled artifact's size.
        if hasattr(self.vectorizer, "stop_words_"):
            del self.vectorizer.stop_words_

        # Phase 1: one expert per (input tier, output tier) cell of the first half.
        in_len = np.array([s.prompt_len for s in first], float)
        out_len = np.array([s.output_len for s in first], float)
        self.in_edges = tier_edges(in_len, self.tiers)
        self.out_edges = tier_edges(out_len, self.tiers)
        cell = np.searchsorted(self.in_edges, in_len, side="right") * self.tiers + np.searchsorted(
            self.out_edges, out_len, side="right"
        )
        x1 = self._features([s.prompt_text for s in first], in_len)
        y1 = np.log1p(out_len)
        self.experts = []
        for k in range(self.n_experts):
            mask = cell == k
            if mask.sum() < self.min_expert_samples:
                # Too few samples to train an MLP: answer the cell's (or the half's) mean.
                expert: MLPRegressor | DummyRegressor = DummyRegressor().fit(
                    x1[:1], [y1[mask].mean() if mask.any() else y1.mean()]
                )
            else:
                expert = MLPRegressor(
                    hidden_layer_sizes=self.expert_hidden,
                    max_iter=self.max_iter,
                    learning_rate_init=self.expert_lr,
                    random_state=self.seed + k,
                    alpha=1e-3,
                    tol=1e-6,
                    n_iter_no_change=30,
                ).fit(x1[mask], y1[mask])
            self.experts.append(expert)

        # Phase 2: experts frozen; the gate learns to weight them on the other half.
        x2 = self._features([s.prompt_text for s in second], [s.prompt_len for s in second])
        y2 = np.log1p(np.array([s.output_len for s in second], float))
        self.gate = SoftmaxGate(hidden=self.gate_hidden, epochs=self.gate_epochs, seed=self.seed)
        self.gate.fit(x2, self._expert_outputs(x2), y2)
        return self

    def _predict_matrix(self, x: sparse.csr_matrix) -> np.ndarray:
        assert self.gate is not None, "MoePredictor.predict before fit"
        return np.expm1((self.gate.predict_proba(x) * self._expert_outputs(x)).sum(axis=1))

    def _estimate(self, prompt_text: str, prompt_len: int, app_id: str | None, generated: int, text: str) -> float:
        # The feature window is the text so far: prompt plus whatever was generated.
        window = f"{prompt_text} {text}" if text else prompt_text
        return self._predict_matrix(self._features([window], [prompt_len]))[0]

    def predict_many(self, samples: Sequence[LengthSample], generated: Sequence[int] | None = None) -> list[float]:
        gens = list(generated) if generated is not None else [0] * len(samples)
        texts = []
        for s, g in zip(samples, gens, strict=False):
            prefix = generated_prefix(s.output_text, g, s.output_len)
            texts.append(f"{s.prompt_text} {prefix}" if prefix else s.prompt_text)
        raw = self._predict_matrix(self._features(texts, [s.prompt_len for s in samples]))
        return [floor_at_generated(r, g) for r, g in zip(raw, gens, strict=False)]
