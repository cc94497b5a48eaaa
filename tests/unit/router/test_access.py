"""The access file: keys, roles, limits and shares, and every mistake named by its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.access import OPEN_ACCESS, AccessConfigError, AccessTable, Role, bearer_token
from scheduler.core.slo import SloClass

CLIENT_KEY = "client-key-0123456789"
ADMIN_KEY = "admin-key-0123456789"
METRICS_KEY = "metrics-key-0123456789"
WORKER_KEY = "worker-key-0123456789"
ENV = {"TENANT_A": CLIENT_KEY, "OPS": ADMIN_KEY, "PROM": METRICS_KEY, "WORKERS": WORKER_KEY}


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "access.yaml"
    path.write_text(text)
    return str(path)


FULL = """
keys:
  - {name: ops, role: admin, key_env: OPS}
  - {name: prometheus, role: metrics, key_env: PROM}
  - {name: workers, role: worker, key_env: WORKERS}
  - name: tenant-a
    role: client
    key_env: TENANT_A
    share: 2
    limits: {classes: [latency, best_effort], min_ttft_ms: 1000, max_weight: 2, on_violation: reject}
"""


def test_each_key_is_its_principal_with_role_limits_and_share(tmp_path: Path) -> None:
    table = AccessTable.build(config_path=write(tmp_path, FULL), env=ENV)
    tenant = table.authenticate(f"Bearer {CLIENT_KEY}")
    assert tenant is not None and tenant.name == "tenant-a" and tenant.role is Role.CLIENT
    assert tenant.share == 2.0
    assert tenant.limits is not None and tenant.limits.min_ttft_ms == 1000.0
    assert tenant.limits.classes == frozenset({SloClass.LATENCY, SloClass.BEST_EFFORT})
    assert tenant.limits.on_violation == "reject"
    ops = table.authenticate(f"bearer {ADMIN_KEY}")  # the scheme is case-insensitive
    assert ops is not None and ops.role is Role.ADMIN


def test_the_worker_key_is_the_worker_secret_and_never_an_http_key(tmp_path: Path) -> None:
    table = AccessTable.build(config_path=write(tmp_path, FULL), env=ENV)
    assert table.worker_secret() == WORKER_KEY.encode()
    assert table.authenticate(f"Bearer {WORKER_KEY}") is None


def test_roles_admin_may_everything_over_http_the_others_their_own() -> None:
    table = AccessTable.build(api_key=CLIENT_KEY, admin_api_key=ADMIN_KEY)
    client, admin = table.authenticate(f"Bearer {CLIENT_KEY}"), table.authenticate(f"Bearer {ADMIN_KEY}")
    assert client is not None and admin is not None
    assert client.may(Role.CLIENT) and not client.may(Role.ADMIN) and not client.may(Role.METRICS)
    assert admin.may(Role.CLIENT) and admin.may(Role.ADMIN) and admin.may(Role.METRICS)


@pytest.mark.parametrize(
    "header", [None, "", "Bearer", "Bearer ", "Basic " + CLIENT_KEY, "Bearer wrong-key-0123456789"]
)
def test_missing_or_unknown_keys_authenticate_nobody(header: str | None) -> None:
    assert AccessTable.build(api_key=CLIENT_KEY).authenticate(header) is None


def test_with_no_key_configured_everything_stays_open() -> None:
    assert AccessTable.build().authenticate(None) is OPEN_ACCESS


def test_a_non_ascii_header_is_no_key_not_an_error() -> None:
    assert bearer_token("Bearer clé-ünïcode") is not None
    assert AccessTable.build(api_key=CLIENT_KEY).authenticate("Bearer clé-ünïcode") is None


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("keys: []", "keys"),
        ("keys: [{name: a, role: root, key_env: OPS}]", "keys[0].role"),
        ("keys: [{name: a, role: client}]", "keys[0]"),
        ("keys: [{name: a, role: client, key_env: NOPE}]", "keys[0].key_env"),
        ("keys: [{name: a, role: client, key_env: OPS, limits: {min_ttft_ms: -1}}]", "keys[0].limits.min_ttft_ms"),
        ("keys: [{name: a, role: client, key_env: OPS, limits: {classes: [gold]}}]", "keys[0].limits.classes"),
        ("keys: [{name: a, role: client, key_env: OPS, limits: {speed: 1}}]", "keys[0].limits.speed"),
        ("keys: [{name: a, role: admin, key_env: OPS, limits: {max_weight: 1}}]", "keys[0].limits"),
        ("keys: [{name: a, role: client, key_env: OPS, share: 0}]", "keys[0].share"),
        ("keys: [{name: a, role: client, key_env: SHORT}]", "keys[0]"),
        ("keys: [{name: a, role: client, key_env: OPS, colour: red}]", "keys[0].colour"),
    ],
)
def test_each_mistake_names_its_field(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(AccessConfigError) as err:
        AccessTable.build(config_path=write(tmp_path, text), env={**ENV, "SHORT": "short"})
    assert str(err.value).startswith(field)


def test_two_names_for_one_key_or_one_name_twice_are_refused(tmp_path: Path) -> None:
    same_key = "keys: [{name: a, role: client, key_env: OPS}, {name: b, role: admin, key_env: OPS}]"
    with pytest.raises(AccessConfigError, match="same key"):
        AccessTable.build(config_path=write(tmp_path, same_key), env=ENV)
    same_name = "keys: [{name: a, role: client, key_env: OPS}, {name: a, role: admin, key_env: PROM}]"
    with pytest.raises(AccessConfigError, match="used twice"):
        AccessTable.build(config_path=write(tmp_path, same_name), env=ENV)


def test_the_worker_key_must_differ_from_every_http_key(tmp_path: Path) -> None:
    text = "keys: [{name: w, role: worker, key_env: OPS}]"
    with pytest.raises(AccessConfigError, match="worker key must differ"):
        AccessTable.build(admin_api_key=ADMIN_KEY, config_path=write(tmp_path, text), env=ENV)


def test_a_key_file_is_read_and_stripped(tmp_path: Path) -> None:
    key_file = tmp_path / "ops.key"
    key_file.write_text(ADMIN_KEY + "\n")
    table = AccessTable.build(config_path=write(tmp_path, f"keys: [{{name: ops, role: admin, key_file: {key_file}}}]"))
    found = table.authenticate(f"Bearer {ADMIN_KEY}")
    assert found is not None and found.name == "ops"
