"""A private linear step-time model, so SLOs-Serve works before the fitted roofline lands.

step_time = base + per_token·(prefill + decode + spec) + per_kv·kv. It is the one-term
special case of the paper's roofline (§3.1.1) and is exact for toy examples such as Fig. 3
(base 0, per_token 1/6: six tokens per time unit).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinearPerfModel:
    base_s: float = 0.008  # fixed cost of a forward pass (weights read once)
    per_token_s: float = 5e-5  # compute per processed token (~20k tokens/s)
    per_kv_token_s: float = 0.0  # attention reads per KV token attended

    def step_time(self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int = 0) -> float:
        tokens = prefill_tokens + decode_reqs + spec_tokens
        return self.base_s + self.per_token_s * tokens + self.per_kv_token_s * kv_tokens
