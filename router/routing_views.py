"""What a routing policy sees: snapshots of workers and of the request being placed.

Policies are pure functions of these views (plus their own small state), so the same policy
object runs in the router process, in unit tests and in a simulator, and never touches ZMQ,
HTTP or SGLang. The router fills the views from the workers' load reports (EMAs measured on
the worker) and its own bookkeeping (requests it has in flight on each worker).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.core.slo import SloSpec


@dataclass(frozen=True)
class WorkerView:
    """One worker as of its last load report plus the router's own in-flight count."""

    worker_id: str
    gpu: str  # "h100", "a100", "a40", "cpu", ...: for reports and heterogeneity-aware policies
    kv_capacity_tokens: int  # KV-cache tokens the worker can hold
    max_running: int  # the worker's running-batch cap
    queue_len: int = 0  # waiting requests on the worker
    running: int = 0  # requests in the running batch
    kv_used_tokens: int = 0
    queue_delay_s: float = 0.0  # EMA of measured queueing delay (arrival to first scheduled), GoodServe q_g
    prefill_s_per_token: float = 0.0  # EMA per prompt token, GoodServe p_g
    decode_s_per_token: float = 0.0  # EMA per output token of one request at the current batch, GoodServe d_g
    iteration_s: float = 0.0  # EMA of one engine iteration (the wait for the current step), PolyServe
    tokens_per_minute: float = 0.0  # prompt + output tokens served over the last minute
    inflight: int = 0  # requests the router has sent there that have not finished
    tpot_tier_ms: float | None = None  # PolyServe: the TPOT tier this instance serves; None = unassigned
    role: str = "mixed"  # "prefill" / "decode" in a PD pool (see protocol.Register.role)
    healthy: bool = True
    last_report_s: float = 0.0  # router clock time of the last report
    queue_drain_s: float | None = None  # the worker's predicted time until its queue has all started
    # The engine's perf model's step of its running batch with no prefill (0: not reported).
    # decode_s_per_token is the measured gap between tokens, which also carries the prefill
    # chunks mixed into the steps: a model of a batch's base cost must not count them.
    decode_step_s: float = 0.0
    slo_levers: bool = False  # its engine keeps each step within the tightest resident's TPOT

    @property
    def kv_free_tokens(self) -> int:
        return max(0, self.kv_capacity_tokens - self.kv_used_tokens)

    @property
    def load(self) -> int:
        """Requests on the worker as the router best knows it."""
        return max(self.inflight, self.queue_len + self.running)


@dataclass(frozen=True)
class RouteRequest:
    """The request being placed. Never its true output length: only a prediction or bound."""

    rid: str
    prompt_tokens: int
    slo: SloSpec
    arrival_s: float  # router clock
    prefix_hashes: tuple[int, ...] = ()  # hashes of the prompt's leading blocks, for prefix reuse
    predicted_output_tokens: int | None = None  # the analyzer's prediction / upper bound
    max_new_tokens: int | None = None  # the client's cap


@dataclass(frozen=True)
class RunningView:
    """A request in flight, for migration checks (GoodServe re-checks every tau iterations)."""

    request: RouteRequest
    worker_id: str
    generated: int  # tokens streamed back so far
    first_token_s: float | None = None


@dataclass(frozen=True)
class Decision:
    """Where a request goes; `best_effort` when no worker can meet its SLO (it is still served)."""

    worker_id: str
    reason: str = ""
    best_effort: bool = False
    detail: dict[str, float] = field(default_factory=dict)
