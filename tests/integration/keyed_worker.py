"""One real tiny-model worker with keys of every role, shared by the worker's access, tenancy and
adversarial suites: each reads only its own keys, so one worker serves them all and the session
pays for loading one (the fixture is `keyed_worker` in conftest.py).

Its keys, by name (`KEYS`: name -> secret), from every source the worker reads: an admin key from
the environment ("admin-api-key") and one from the file ("ops"), a client key from
--api-key-file ("api-key"), a metrics key ("prom"), a client key without limits from the
environment ("open-tenant"), client keys with SLO limits (the adversarial suite's "tenant-a" and
"tenant-b" from files; the tenancy suite's "tenant-l", clamped, and "tenant-s", rejecting, from
the environment) and the router-link key ("link"). The default SLO is tighter than any limited
key may ask for, so a request without one is clamped to the key's limits.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from server.process import ServerProcess

FILE_KEYS = ("ops", "prom", "tenant-a", "tenant-b", "link")
ENV_KEYS = {"open-tenant": "OPEN_TENANT_KEY", "tenant-l": "LIMITED_KEY", "tenant-s": "STRICT_KEY"}
KEYS = {name: f"{name}-{secrets.token_urlsafe(24)}" for name in ("api-key", "admin-api-key", *FILE_KEYS, *ENV_KEYS)}
DEFAULT_TTFT_MS = 10  # tighter than every limited key's minimum TTFT
ACCESS_FILE = """
keys:
  - {{name: ops, role: admin, key_file: {d}/ops}}
  - {{name: prom, role: metrics, key_file: {d}/prom}}
  - {{name: open-tenant, role: client, key_env: OPEN_TENANT_KEY}}
  - name: tenant-a
    role: client
    key_file: {d}/tenant-a
    share: 2
    limits: {{classes: [latency, deadline, best_effort], min_ttft_ms: 1000, min_tpot_ms: 50,
             min_deadline_ms: 5000, max_weight: 2}}
  - name: tenant-b
    role: client
    key_file: {d}/tenant-b
    limits: {{classes: [latency, best_effort], min_ttft_ms: 500, max_weight: 1, on_violation: reject}}
  - {{name: tenant-l, role: client, key_env: LIMITED_KEY, share: 2,
     limits: {{min_ttft_ms: 1000, max_weight: 2}}}}
  - {{name: tenant-s, role: client, key_env: STRICT_KEY,
     limits: {{min_ttft_ms: 1000, on_violation: reject}}}}
  - {{name: link, role: worker, key_file: {d}/link}}
"""


def keyed_worker_process(d: Path) -> ServerProcess:
    """The worker (not yet started), its key files and access file written to `d`."""
    for name in (*FILE_KEYS, "api-key"):
        (d / name).write_text(KEYS[name])
    (d / "access.yaml").write_text(ACCESS_FILE.format(d=d))
    env = {
        **os.environ,
        "SGLANG_SLO_ADMIN_API_KEY": KEYS["admin-api-key"],
        **{var: KEYS[name] for name, var in ENV_KEYS.items()},
        "SGLANG_ENABLE_REQUEST_DECOMPRESSION": "1",  # the access suite sends a zstd body
    }
    args = (
        "--model-path", "tiny", "--api-key-file", str(d / "api-key"), "--auth-config", str(d / "access.yaml"),
        "--slo-default-ttft-ms", str(DEFAULT_TTFT_MS),
    )  # fmt: skip
    return ServerProcess(*args, name="keyed-worker", env=env, ready_path="/health")
