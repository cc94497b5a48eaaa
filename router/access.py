"""Who may call what: API keys with roles, per-key SLO limits and fair shares, from one file.

A serving system shared by tenants cannot have one key: the key that generates is not the key
that moves other users' requests, flushes caches or reads every prompt in flight. Each key here
has a role:

- `client`: generation, model and server info (the routes an OpenAI or SGLang client calls);
- `admin`: everything a client may do, and the operator's routes (`/slo/status`, `/slo/migrate`,
  `/flush_cache`, SGLang's admin routes on a worker, `/metrics`);
- `metrics`: `/metrics` only (a Prometheus scraper);
- `worker`: the router-worker credential (router/worker_auth.py); never accepted over HTTP.

A client key may carry `limits` (scheduler/core/slo_limits.py) and a `share`, its weight when
keys compete for the same capacity. The router and the worker's HTTP edge read the same file
(`--auth-config`), so a request is held to the same terms however it arrives.

The file (YAML or JSON); a key's secret comes from `key_env` (an environment variable) or
`key_file` (a file holding it), never from the command line, so it shows in no process list:

    keys:
      - name: ops
        role: admin
        key_file: /etc/sglang-slo/keys/ops
      - name: tenant-a
        role: client
        key_env: TENANT_A_KEY
        share: 2
        limits: {classes: [latency, best_effort], min_ttft_ms: 1000, max_weight: 2}
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from scheduler.core.slo import SloClass
from scheduler.core.slo_limits import ON_VIOLATION, SloLimits

API_KEY_ENV = "SGLANG_SLO_API_KEY"  # where a launcher finds --api-key when no flag gives it
ADMIN_API_KEY_ENV = "SGLANG_SLO_ADMIN_API_KEY"
MIN_KEY_BYTES = 16  # keys in the file: long enough that guessing is not an attack
PRINCIPAL_SCOPE_KEY = "sglang_slo.principal"  # where the guard leaves the caller in the ASGI scope
LIMIT_FIELDS = ("classes", "min_ttft_ms", "min_tpot_ms", "min_deadline_ms", "max_weight", "on_violation")


class Role(str, Enum):
    CLIENT = "client"
    ADMIN = "admin"
    METRICS = "metrics"
    WORKER = "worker"


class AccessConfigError(ValueError):
    """A mistake in the access file or flags; the message names the field."""


@dataclass(frozen=True)
class Principal:
    """An authenticated caller."""

    name: str
    role: Role
    limits: SloLimits | None = None
    share: float = 1.0

    def may(self, needed: Role) -> bool:
        """Whether this caller may use a route that needs `needed` (admin may use every HTTP route)."""
        if self.role is Role.WORKER:
            return False
        return self.role is needed or self.role is Role.ADMIN


# The caller when no key is configured at all: a loopback development server, as SGLang without
# --api-key. Everything is open, as it was.
OPEN_ACCESS = Principal("anonymous", Role.ADMIN)


def _digest(secret: str | bytes) -> bytes:
    raw = secret.encode() if isinstance(secret, str) else secret
    return hashlib.sha256(raw).digest()


def bearer_token(authorization: str | bytes | None) -> bytes | None:
    """The token of an `Authorization: Bearer TOKEN` header (scheme case-insensitive), else None."""
    if not authorization:
        return None
    raw = authorization.encode("latin-1", "replace") if isinstance(authorization, str) else authorization
    scheme, _, token = raw.partition(b" ")
    if scheme.lower() != b"bearer" or not token.strip():
        return None
    return token.strip()


class AccessTable:
    """The keys a server accepts, each mapped to its Principal."""

    def __init__(self, entries: Iterable[tuple[str | bytes, Principal]] = (), worker_secret: str | None = None) -> None:
        self._worker_secret = worker_secret.encode() if worker_secret else None
        self._by_digest: dict[bytes, Principal] = {}
        names: set[str] = set()
        for secret, principal in entries:
            digest = _digest(secret)
            if digest in self._by_digest:
                raise AccessConfigError(
                    f"keys: {principal.name!r} has the same key as {self._by_digest[digest].name!r}"
                )
            if principal.name in names:
                raise AccessConfigError(f"keys: the name {principal.name!r} is used twice")
            names.add(principal.name)
            self._by_digest[digest] = principal

    @property
    def is_open(self) -> bool:
        """No key configured: every caller is OPEN_ACCESS."""
        return not self._by_digest

    def principals(self) -> list[Principal]:
        return list(self._by_digest.values())

    def authenticate(self, authorization: str | bytes | None) -> Principal | None:
        """The caller behind an Authorization header; None when the key is missing or unknown.
        With no key configured, everyone is OPEN_ACCESS."""
        if self.is_open:
            return OPEN_ACCESS
        token = bearer_token(authorization)
        if token is None:
            return None
        digest = _digest(token)
        found = None
        for known, principal in self._by_digest.items():  # every entry compared: no timing by position
            if hmac.compare_digest(known, digest):
                found = principal
        return found

    def worker_secret(self) -> bytes | None:
        """The `worker` role's key, if the file names one (the router-worker credential)."""
        return self._worker_secret

    @classmethod
    def build(
        cls,
        *,
        api_key: str | None = None,
        admin_api_key: str | None = None,
        config_path: str | None = None,
        env: Mapping[str, str] = os.environ,
    ) -> AccessTable:
        """The table from the flags and the file together: `--api-key` is a client key named
        "api-key", `--admin-api-key` an admin key named "admin-api-key"."""
        entries: list[tuple[str | bytes, Principal]] = []
        worker_secrets: list[str] = []
        if api_key:
            entries.append((api_key, Principal("api-key", Role.CLIENT)))
        if admin_api_key:
            entries.append((admin_api_key, Principal("admin-api-key", Role.ADMIN)))
        if config_path:
            for secret, principal in load_access_file(config_path, env):
                if principal.role is Role.WORKER:
                    worker_secrets.append(secret)
                else:
                    entries.append((secret, principal))
        if len(worker_secrets) > 1:
            raise AccessConfigError("keys: at most one key may have role worker")
        worker_secret = worker_secrets[0] if worker_secrets else None
        if worker_secret is not None and any(
            hmac.compare_digest(_digest(worker_secret), _digest(s)) for s, _ in entries
        ):
            raise AccessConfigError("keys: the worker key must differ from every HTTP key")
        return cls(entries, worker_secret)


def _positive(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise AccessConfigError(f"{field}: must be a positive finite number, got {value!r}")
    return float(value)


def parse_limits(raw: Any, field: str) -> SloLimits:
    if not isinstance(raw, Mapping):
        raise AccessConfigError(f"{field}: must be a mapping")
    unknown = sorted(set(raw) - set(LIMIT_FIELDS))
    if unknown:
        raise AccessConfigError(f"{field}.{unknown[0]}: unknown field (allowed: {', '.join(LIMIT_FIELDS)})")
    classes = None
    if raw.get("classes") is not None:
        names = raw["classes"]
        if not isinstance(names, list) or not names:
            raise AccessConfigError(f"{field}.classes: must be a non-empty list of SLO classes")
        try:
            classes = frozenset(SloClass(n) for n in names)
        except ValueError:
            allowed = ", ".join(c.value for c in SloClass)
            raise AccessConfigError(f"{field}.classes: each must be one of {allowed}, got {names!r}") from None
    on_violation = raw.get("on_violation", ON_VIOLATION[0])
    if on_violation not in ON_VIOLATION:
        raise AccessConfigError(f"{field}.on_violation: must be one of {', '.join(ON_VIOLATION)}")
    bounds = {
        name: _positive(raw[name], f"{field}.{name}")
        for name in ("min_ttft_ms", "min_tpot_ms", "min_deadline_ms", "max_weight")
        if raw.get(name) is not None
    }
    return SloLimits(classes=classes, on_violation=on_violation, **bounds)


def _secret(entry: Mapping[str, Any], field: str, env: Mapping[str, str]) -> str:
    sources = [k for k in ("key_env", "key_file") if entry.get(k) is not None]
    if len(sources) != 1:
        raise AccessConfigError(f"{field}: give exactly one of key_env, key_file")
    if sources[0] == "key_env":
        name = entry["key_env"]
        value = env.get(str(name))
        if not value:
            raise AccessConfigError(f"{field}.key_env: the environment variable {name!r} is not set")
    else:
        try:
            value = Path(str(entry["key_file"])).read_text().strip()
        except OSError as e:
            raise AccessConfigError(f"{field}.key_file: {e}") from None
    if len(value.encode()) < MIN_KEY_BYTES:
        raise AccessConfigError(f"{field}: the key must be at least {MIN_KEY_BYTES} bytes")
    return value


ENTRY_FIELDS = ("name", "role", "key_env", "key_file", "share", "limits")


def load_access_file(path: str, env: Mapping[str, str] = os.environ) -> list[tuple[str, Principal]]:
    """Every key of the file with its Principal; AccessConfigError naming the field otherwise."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise AccessConfigError(f"--auth-config: {e}") from None
    except yaml.YAMLError as e:
        raise AccessConfigError(f"--auth-config: not valid YAML/JSON: {e}") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("keys"), list) or not doc["keys"]:
        raise AccessConfigError("keys: must be a non-empty list")
    out: list[tuple[str, Principal]] = []
    for i, entry in enumerate(doc["keys"]):
        field = f"keys[{i}]"
        if not isinstance(entry, Mapping):
            raise AccessConfigError(f"{field}: must be a mapping")
        unknown = sorted(set(entry) - set(ENTRY_FIELDS))
        if unknown:
            raise AccessConfigError(f"{field}.{unknown[0]}: unknown field (allowed: {', '.join(ENTRY_FIELDS)})")
        name = entry.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise AccessConfigError(f"{field}.name: must be a string of 1..64 chars")
        try:
            role = Role(entry.get("role"))
        except ValueError:
            allowed = ", ".join(r.value for r in Role)
            raise AccessConfigError(f"{field}.role: must be one of {allowed}, got {entry.get('role')!r}") from None
        limits = parse_limits(entry["limits"], f"{field}.limits") if entry.get("limits") is not None else None
        if limits is not None and role is not Role.CLIENT:
            raise AccessConfigError(f"{field}.limits: only client keys carry SLO limits")
        share = _positive(entry["share"], f"{field}.share") if entry.get("share") is not None else 1.0
        out.append((_secret(entry, field, env), Principal(name, role, limits, share)))
    return out


def read_key(
    value: str | None, path: str | None, env_name: str, flag: str, env: Mapping[str, str] = os.environ
) -> str | None:
    """A key from its flag, else its file (`flag`-file), else its environment variable. A file or
    the environment keeps the key out of the process list, so a flag value is warned about.
    A mistake is an AccessConfigError naming the flag."""
    if value is not None and path is not None:
        raise AccessConfigError(f"{flag} and {flag}-file: give one of them")
    if path is not None:
        try:
            value = Path(path).read_text().strip()
        except OSError as e:
            raise AccessConfigError(f"{flag}-file: {e}") from None
        if not value:
            raise AccessConfigError(f"{flag}-file: {path} is empty")
        return value
    if value:
        logging.getLogger(__name__).warning(
            "%s on the command line is visible in the process list: prefer %s-file or $%s", flag, flag, env_name
        )
        return value
    return env.get(env_name) or None
