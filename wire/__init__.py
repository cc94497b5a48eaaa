"""The wire vocabulary: names every process agrees on, and nothing else.

The HTTP edge writes these keys, the scheduler reads them, the router forwards them and the
benchmarks send them, so they live in one leaf package that imports nothing of ours. Changing a
value here changes the wire format between processes of different versions.
"""

from __future__ import annotations

# ---- inside SGLang's sampling_params.custom_params (HTTP edge -> scheduler) -------------------
SLO_PARAM = "slo"  # the request's validated SLO, as SloSpec.to_dict()
ARRIVAL_PARAM = "slo_arrival"  # unix time the request reached the first server (or router)
ORACLE_HINT_PARAM = "slo_oracle_output_len"  # a benchmark's true output length: never in a policy view
INTERNAL_PARAM_PREFIX = "slo_"  # custom_params keys only our processes set (clients' are stripped)

# ---- request headers -------------------------------------------------------------------------
SLO_HEADER_FIELDS = {  # header -> SLO field it fills when the body leaves the field out
    "x-slo-ttft-ms": "ttft_ms",
    "x-slo-tpot-ms": "tpot_ms",
    "x-slo-deadline-ms": "deadline_ms",
}
ARRIVAL_HEADER = "x-slo-arrival"  # the router's arrival stamp on a proxied request
AGENT_TOKEN_HEADER = "x-slo-agent-token"  # proves the proxied request came through the worker agent

# ---- inside SGLang's customized_info / meta_info (scheduler -> HTTP edge) --------------------
TOKEN_TS_KEY = "slo_token_ts"  # per output token: unix time it left the scheduler
TIER_KEY = "slo_best_effort"  # per output token: 1 when the policy had declined the request
REPORT_KEY = "slo"  # meta_info key of the SLO report on the final output

# ---- router <-> worker protocol ---------------------------------------------------------------
REGISTER_AGAIN = "unknown or dead worker: send Register again"  # Ack reason: the router lost the worker

# ---- admission and shedding (every HTTP edge, the router, the benchmarks) ---------------------
# `error.reason` of a 429/503 a request was shed with, and of the abort finish reason of a stream
# shed after it started.
QUEUE_FULL = "queue_full"  # HTTP 429: the waiting queue (count or tokens) is at its bound
SLO_INFEASIBLE = "slo_infeasible"  # HTTP 503: on_infeasible=reject and the SLO will certainly be missed
QUEUE_TIMEOUT = "queue_timeout"  # HTTP 503: max_queue_ms passed before the request started
DRAINING = "draining"  # HTTP 503: the server is shutting down gracefully and admits nothing new
SHED_REASONS = (QUEUE_FULL, SLO_INFEASIBLE, QUEUE_TIMEOUT, DRAINING)
RETRY_AFTER_HEADER = "retry-after"
# Keys of an abort finish_reason (scheduler -> HTTP edge) that carry a shed's details.
SHED_REASON_KEY = "reason"
RETRY_AFTER_KEY = "retry_after_s"
PREDICTED_WAIT_KEY = "predicted_wait_ms"
SHED_CLASS_KEY = "class"

# ---- tenancy (set by an HTTP edge from the caller's key; clients' `slo_*` keys are stripped) ----
TENANT_PARAM = "slo_tenant"  # custom_params: the caller's key name (fair shares between keys)
SHARE_PARAM = "slo_share"  # custom_params: that key's share of contended capacity (> 0)
