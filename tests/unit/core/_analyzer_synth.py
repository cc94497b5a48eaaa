"""Synthetic length data shared by the analyzer tests: the answer length depends on the task word."""

from __future__ import annotations

import numpy as np

from scheduler.core.analyzer.base import LengthSample

TASKS = {"translate": 30.0, "summarize": 120.0, "explain": 250.0, "implement": 600.0}
FILLER = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def make_samples(n: int, seed: int = 0, noise: float = 0.25) -> list[LengthSample]:
    rng = np.random.default_rng(seed)
    tasks = list(TASKS)
    out = []
    for _ in range(n):
        task = tasks[rng.integers(len(tasks))]
        words = [task] + list(rng.choice(FILLER, size=rng.integers(3, 12)))
        prompt = " ".join(words)
        length = max(1, int(TASKS[task] * rng.lognormal(0.0, noise)))
        # The last ~15 % of an answer wraps up, so a generated prefix tells how close the end is.
        reply = " ".join("finally" if i >= 0.85 * length else f"{task}word{i % 7}" for i in range(length))
        out.append(
            LengthSample(prompt, len(words), length, app_id=task if rng.random() < 0.5 else None, output_text=reply)
        )
    return out
