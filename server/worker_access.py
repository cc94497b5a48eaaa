"""Who may call which route of a worker's HTTP port, and which keys it accepts.

Why the worker's own edge checks keys, not SGLang: SGLang knows two keys; with only `--api-key`
its admin routes (/abort_request, /update_weights_from_disk, /configure_logging, ...) accept the
client key; some routes that change the server are not marked admin at all
(/load_lora_adapter_from_tensors, /set_trace_level); and it has no room for several client keys,
a metrics key or per-key SLO limits. So the edge (SloMiddleware, made the outermost middleware by
server/sglang_http.py) authenticates every request against an AccessTable (router/access.py) by
the route's role: an allow-list of client routes, /metrics for the metrics role, /health* open,
everything else SGLang serves is admin. SGLang itself is given one random internal key as both of
its keys, which the edge puts in place of the caller's on every request it lets through, and which
only this process, its worker agent and SGLang's warm-up hold. SGLang's check so stays a second
wall and never sees a caller's key; /server_info is scrubbed of every key on the way out.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router.access import (
    ADMIN_API_KEY_ENV,
    API_KEY_ENV,
    OPEN_ACCESS,
    AccessConfigError,
    AccessTable,
    Principal,
    Role,
    read_key,
)

VERTEX_ROUTE = os.environ.get("AIP_PREDICT_ROUTE", "/vertex_generate")  # Vertex AI's configurable route
INTERNAL = Principal("worker-internal", Role.ADMIN)  # this process's own calls (agent, warm-up)

OPEN_PATHS = frozenset({"/health", "/health_generate"})  # probes carry no secret (SGLang's rule too)
_POST = ("POST",)
_GET = ("GET", "HEAD")
# What a client of the model may call: generation, tokenization, sessions, model and server info.
CLIENT_ROUTES: dict[str, tuple[str, ...]] = {
    "/generate": ("POST", "PUT"),
    "/v1/completions": _POST,
    "/v1/chat/completions": _POST,
    "/invocations": _POST,
    VERTEX_ROUTE: _POST,
    "/encode": ("POST", "PUT"),
    "/classify": ("POST", "PUT"),
    "/v1/embeddings": _POST,
    "/v1/classify": _POST,
    "/v1/score": _POST,
    "/v1/rerank": ("POST", "PUT"),
    "/v1/responses": _POST,
    "/v1/messages": _POST,
    "/v1/messages/count_tokens": _POST,
    "/v1/audio/transcriptions": _POST,
    "/api/chat": _POST,
    "/api/generate": _POST,
    "/api/show": _POST,
    "/api/tags": _GET,
    "/tokenize": _POST,
    "/v1/tokenize": _POST,
    "/detokenize": _POST,
    "/v1/detokenize": _POST,
    "/parse_function_call": _POST,
    "/separate_reasoning": _POST,
    "/open_session": ("GET", "POST"),
    "/close_session": ("GET", "POST"),
    "/get_model_info": _GET,
    "/model_info": _GET,
    "/v1/models": _GET,
    "/server_info": _GET,  # scrubbed of keys (scrub_secrets)
    "/get_server_info": _GET,
    "/weight_version": _GET,
    "/get_weight_version": _GET,
    "/": _GET,
    "/ping": _GET,
}
CLIENT_PREFIXES = (("/v1/models/", _GET), ("/v1/responses/", ("GET", "POST")))
CLIENT_WEBSOCKETS = frozenset({"/v1/realtime"})
SECRET_FIELDS = frozenset({"api_key", "admin_api_key", "ssl_keyfile_password"})


def route_role(method: str, path: str, websocket: bool = False) -> Role | None:
    """The role a route needs; None: open to anyone (health probes, CORS preflights)."""
    if websocket:
        return Role.CLIENT if path in CLIENT_WEBSOCKETS else Role.ADMIN
    if method == "OPTIONS" or path in OPEN_PATHS:
        return None
    if path == "/metrics":
        return Role.METRICS
    methods = CLIENT_ROUTES.get(path)
    if methods is None:
        methods = next((m for prefix, m in CLIENT_PREFIXES if path.startswith(prefix)), None)
    return Role.CLIENT if methods is not None and method in methods else Role.ADMIN


@dataclass(frozen=True)
class Verdict:
    """The caller and whether it may call the route; `status` 401/403 and `message` when not."""

    principal: Principal | None
    status: int = 200
    message: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == 200


class WorkerAccess:
    """The keys one worker accepts, plus its internal key (None when no key is configured at all:
    then everything is open, as SGLang without keys)."""

    def __init__(self, table: AccessTable, internal_key: str | None = None) -> None:
        self.table = table
        self.internal_key = internal_key if not table.is_open else None
        self._internal = internal_key.encode() if self.internal_key else None

    @property
    def is_open(self) -> bool:
        return self.table.is_open

    def check(self, method: str, path: str, authorization: bytes | None, websocket: bool = False) -> Verdict:
        needed = route_role(method, path, websocket)
        if needed is None:
            return Verdict(None)
        principal = self._caller(authorization)
        if principal is None:
            return Verdict(None, 401, "Authorization: a valid 'Bearer <API key>' is required")
        if principal.may(needed):
            return Verdict(principal)
        if not any(p.may(needed) for p in self.table.principals()):
            return Verdict(
                principal,
                403,
                f"{path}: needs the {needed.value} role and this worker has no such key "
                "(give it --admin-api-key-file, or a key of that role in --auth-config)",
            )
        return Verdict(
            principal, 403, f"{path}: needs the {needed.value} role; this key's role is {principal.role.value}"
        )

    def _caller(self, authorization: bytes | None) -> Principal | None:
        if self.table.is_open:
            return OPEN_ACCESS
        if self._internal is not None and authorization:
            scheme, _, token = authorization.partition(b" ")
            if scheme.lower() == b"bearer" and secrets.compare_digest(token.strip(), self._internal):
                return INTERNAL
        return self.table.authenticate(authorization)

    def inner_authorization(self) -> bytes | None:
        """The Authorization SGLang gets in place of the caller's (None: pass the caller's on)."""
        return b"Bearer " + self._internal if self._internal is not None else None


def scrub_secrets(value: Any) -> Any:
    """`value` with every key, password or secret field removed, at any depth."""
    if isinstance(value, dict):
        return {k: scrub_secrets(v) for k, v in value.items() if k not in SECRET_FIELDS}
    if isinstance(value, list):
        return [scrub_secrets(v) for v in value]
    return value


def is_loopback_host(host: str | None) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address((host or "").strip("[]")).is_loopback
    except ValueError:
        return False


def build_worker_access(
    api_key: str | None, admin_api_key: str | None, auth_config: str | None, host: str | None
) -> WorkerAccess:
    """The worker's keys. `--api-key` alone on a loopback host keeps SGLang's meaning (it is the
    only key, so it is the operator's too); anywhere else the client key is only a client's, and
    admin routes need an admin key: without one they answer 403 to everyone."""
    if api_key and not admin_api_key and not auth_config and is_loopback_host(host):
        table = AccessTable([(api_key, Principal("api-key", Role.ADMIN))])
    else:
        table = AccessTable.build(api_key=api_key, admin_api_key=admin_api_key, config_path=auth_config)
    return WorkerAccess(table, secrets.token_urlsafe(32))


def add_access_args(parser: Any) -> None:
    """The worker's key flags (SGLang's own --api-key and --admin-api-key stay accepted)."""
    group = parser.add_argument_group(
        "worker access",
        "Who may call this worker's HTTP port. Roles: client (generation, model and server info), admin "
        "(everything else SGLang serves: /abort_request, /pause_generation, /update_weights_*, "
        "/load_lora_adapter, /configure_logging, /flush_cache, ..., and /slo/status), metrics (/metrics); "
        "/health and /health_generate stay open. --api-key is a client key and --admin-api-key an admin key. "
        "Default without an admin key on a --host that is not loopback: every admin route answers 403, to "
        "the client key too (SGLang would let --api-key through them); on a loopback --host, --api-key alone "
        "keeps SGLang's meaning (the only key, so the operator's). A worker joined to a router "
        "(--router-address) serves generation to every client key it holds, past the router: give it no "
        "client key (only --admin-api-key-file, and a metrics key in --auth-config) to forbid that.",
    )
    group.add_argument(
        "--auth-config",
        metavar="FILE",
        help="keys with roles (client, admin, metrics; a worker key is the router link's secret), per-key SLO "
        "limits and shares, in router/access.py's YAML format: the same file as the router's",
    )
    group.add_argument(
        "--api-key-file", metavar="PATH", help=f"read --api-key from this file (or ${API_KEY_ENV}): ps cannot show it"
    )
    group.add_argument(
        "--admin-api-key-file",
        metavar="PATH",
        help=f"read --admin-api-key from this file (or ${ADMIN_API_KEY_ENV}): ps cannot show it",
    )


def resolve_key_flags(args: Any, env: Mapping[str, str] = os.environ) -> None:
    """Fills args.api_key and args.admin_api_key from their files or environment variables."""
    try:
        args.api_key = read_key(args.api_key, args.api_key_file, API_KEY_ENV, "--api-key", env)
        args.admin_api_key = read_key(
            args.admin_api_key, args.admin_api_key_file, ADMIN_API_KEY_ENV, "--admin-api-key", env
        )
    except AccessConfigError as e:
        raise SystemExit(str(e)) from None


def access_for(args: Any) -> WorkerAccess:
    """The worker's access from its parsed flags (SystemExit naming the flag on a mistake or a
    setting that would bypass the check)."""
    from router.access import AccessConfigError

    try:
        access = build_worker_access(args.api_key, args.admin_api_key, args.auth_config, args.host)
    except AccessConfigError as e:
        raise SystemExit(f"--auth-config: {e}") from None
    if access.is_open:
        return access
    if getattr(args, "grpc_port", None):
        raise SystemExit("--grpc-port: SGLang's gRPC listener bypasses the HTTP key check; not with keys")
    if (getattr(args, "tokenizer_worker_num", 1) or 1) > 1:
        raise SystemExit("--tokenizer-worker-num: more than 1 runs HTTP processes without the key check")
    clients = [p.name for p in access.table.principals() if p.role is Role.CLIENT]
    if getattr(args, "router_address", None) and clients and not is_loopback_host(args.host):
        print(
            f"launch_server: client keys ({', '.join(clients)}) can generate on this worker's HTTP port "
            "past the router; give a routed worker no client key to forbid it",
            flush=True,
        )
    return access


def guard_keys(args: Any, access: WorkerAccess) -> None:
    """SGLang's settings get the internal key as both of its keys (before SGLang resolves them,
    after which they are read-only): callers' keys never reach SGLang, its /server_info holds
    none of them, and SGLang's check lets through only what the edge let through."""
    if access.internal_key is not None:
        args.api_key = access.internal_key
        args.admin_api_key = access.internal_key
