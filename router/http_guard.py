"""Who may call which router route, and what of a worker's answers a client may see.

Every route names the role it needs (router/access.py): the client routes generate and read
model and server info; the operator's routes (`/slo/status` lists every request in flight and
every worker's address, `/slo/migrate` moves anyone's request, `/flush_cache` empties every
worker's cache) need an admin key; `/metrics` takes a metrics (scraper) key or an admin key;
the health checks are open, as in SGLang. A client key is never an operator key.

A missing or unknown key is a 401 (`authentication_error`), a known key on a route its role may
not call a 403 (`permission_error`) naming the role needed. The caller's Principal is left in
the ASGI scope under PRINCIPAL_SCOPE_KEY, where the SLO edge reads its limits and share.

A worker's `/server_info` is SGLang's full settings, which include its `api_key` and
`admin_api_key`; `scrub_secrets` drops every credential-like field before a client sees it.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from router.access import PRINCIPAL_SCOPE_KEY, AccessTable, Role

# Route -> the role it needs; None: open to everyone (health checks). A route of the app that is
# missing here stops the app from being built (create_app), so no route is left unguarded.
ROUTE_ROLES: dict[str, Role | None] = {
    "/generate": Role.CLIENT,
    "/v1/completions": Role.CLIENT,
    "/v1/chat/completions": Role.CLIENT,
    "/v1/models": Role.CLIENT,
    "/model_info": Role.CLIENT,
    "/get_model_info": Role.CLIENT,
    "/server_info": Role.CLIENT,
    "/get_server_info": Role.CLIENT,
    "/slo/status": Role.ADMIN,
    "/slo/migrate": Role.ADMIN,
    "/flush_cache": Role.ADMIN,
    "/metrics": Role.METRICS,
    "/health": None,
    "/health_generate": None,
}

# Field names that hold a credential, wherever they sit in a worker's settings (lower-cased).
SECRET_MARKERS = (
    "api_key",
    "apikey",
    "secret",
    "password",
    "passwd",
    "credential",
    "key_file",
    "keyfile",
    "private_key",
)
_WORDS = re.compile(r"[^a-z0-9]+")


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return Response(orjson.dumps(body), status, headers=headers, media_type="application/json")


def _authorization(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            return bytes(value)
    return None


class RoleGuard:
    """Authenticates every HTTP request and checks its route's role before the app sees it.
    A path the table does not list (a 404 to be) still needs a valid key of any role."""

    def __init__(self, app: ASGIApp, table: AccessTable, roles: dict[str, Role | None] = ROUTE_ROLES) -> None:
        self.app = app
        self.table = table
        self.roles = roles

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        listed = path in self.roles
        needed = self.roles.get(path)
        principal = self.table.authenticate(_authorization(scope))
        if principal is None and (needed is not None or not listed):
            response = _error(
                401,
                "missing or unknown API key (send 'Authorization: Bearer KEY')",
                "authentication_error",
                {"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        if principal is not None and needed is not None and not principal.may(needed):
            role = principal.role.value
            message = f"{path} needs a key with the {needed.value} role; this key ({principal.name}) has {role}"
            await _error(403, message, "permission_error")(scope, receive, send)
            return
        if principal is not None:
            scope[PRINCIPAL_SCOPE_KEY] = principal
        await self.app(scope, receive, send)


def is_secret_name(name: str, value: Any) -> bool:
    """Whether a settings field holds a credential: its name says so (api_key, secret, password,
    credential, key file), or it is a string named like a token (`hf_token`, `agent_token`;
    numbers such as `max_total_num_tokens` are not)."""
    low = name.lower()
    if any(marker in low for marker in SECRET_MARKERS):
        return True
    return isinstance(value, str) and any(word.endswith("token") for word in _WORDS.split(low))


def scrub_secrets(value: Any) -> Any:
    """`value` without any credential-like field, at any depth (dicts inside lists too)."""
    if isinstance(value, dict):
        return {k: scrub_secrets(v) for k, v in value.items() if not (isinstance(k, str) and is_secret_name(k, v))}
    if isinstance(value, list):
        return [scrub_secrets(v) for v in value]
    return value
