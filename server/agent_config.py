"""What a worker's agent is told at start: where the router is, who this worker is, and how it
reaches its own HTTP server. Read by the link (server/worker_agent.py) and by the request half
(server/agent_requests.py)."""

from __future__ import annotations

from dataclasses import dataclass

from router.transport import CurveKeys
from server.agent_load import REPORT_S


@dataclass(frozen=True)
class AgentConfig:
    router_address: str
    worker_id: str
    gpu: str
    model: str  # the model path: the router loads its tokenizer from it
    http_url: str  # this worker's own HTTP server, as the agent calls it
    api_key: str | None = None  # this server's own key, for the agent's local calls only
    agent_token: str | None = None  # lets the middleware trust our forwarded arrival times
    worker_secret: bytes | None = None  # the router's worker credential (None: no authentication)
    allow_remote: bool = False
    heartbeat_s: float = 0.5
    report_s: float = REPORT_S
    role: str = "mixed"  # "prefill" / "decode" under PD disaggregation
    bootstrap_port: int | None = None  # a prefill worker's KV bootstrap port
    tier_ms: float | None = None  # the TPOT tier it starts in
    time_scale: float = 1.0  # --emulate-slowdown of an emulated GPU
    advertised_url: str | None = None  # where the router reaches it (default http_url; a wildcard host:
    # the router fills in where the connection comes from)
    curve: CurveKeys | None = None  # encrypts the link to the router
