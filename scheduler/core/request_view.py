"""One request as a policy sees it: the bottom of the core's vocabulary, read by the estimates
and the columns below the engine's view (scheduler.core.types, which re-exports it with the
rest of what a policy sees)."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core.slo import SloSpec


@dataclass
class RequestView:
    """One request as a policy sees it. Engines keep a view across passes and refresh only
    generated, prefix_cached, first_token_time, predicted_output_len, attained_service and
    best_effort_tier; the other fields never change once the view exists (a request whose
    static fields change gets a new view), which columns.RowCache relies on."""

    rid: str
    slo: SloSpec
    arrival: float  # seconds, same domain as the injected clock
    prompt_len: int
    generated: int = 0  # output tokens produced so far
    max_new_tokens: int | None = None  # the client's cap, not the true length
    predicted_output_len: float | None = None  # the analyzer's bound, if any
    first_token_time: float | None = None
    prefix_cached: int = 0  # prompt tokens already in the KV cache
    program_arrival: float | None = None  # compound: arrival of the program's first call
    stage_deadline: float | None = None  # compound: absolute sub-deadline φ(s)·D, if known
    attained_service: float = 0.0  # LAS: tokens (prefill+decode) served to its program so far
    best_effort_tier: bool = False  # declined by admission, runs on leftover budget
    oracle_output_len: int | None = None  # true length: filled only for *_oracle policies
    tenant: str | None = None  # the API key it came with (fair shares between keys); None: no key
    share: float = 1.0  # that key's share of contended capacity

    @property
    def started(self) -> bool:
        return self.first_token_time is not None
