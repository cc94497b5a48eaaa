"""The worker credential's primitives: the handshake end to end without sockets, sealing (a
tampered, replayed or unsealed message is refused), and where the secret comes from."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from router.protocol import Abort, Ack, Register, Submit
from router.worker_auth import (
    AuthError,
    RouterAuth,
    WorkerAuth,
    legacy_secret,
    load_worker_secret,
    resolve_worker_secret,
)

SECRET = b"0123456789abcdef-secret"
REG = Register(worker_id="w0", gpu="h100", model="m", kv_capacity_tokens=10, max_running=2)


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def _handshake(router: RouterAuth, worker: WorkerAuth, identity: bytes = b"c1") -> tuple[Register, Ack | None]:
    hello = worker.hello(REG)
    assert hello.nonce is not None and hello.proof is None
    answer = worker.answer(router.challenge(identity), REG)
    assert answer is not None
    refused = router.verify(identity, answer)
    if refused is not None:
        return answer, None
    return answer, router.accept(answer, Ack(accepted=True, reason="registered"))


def test_the_handshake_authenticates_both_ends_and_opens_a_session() -> None:
    router, worker = RouterAuth(SECRET), WorkerAuth(SECRET)
    _, ack = _handshake(router, worker)
    assert ack is not None and worker.accept(ack)
    sealed = router.seal("w0", Abort(rid="r1"))
    assert worker.open(sealed) == Abort(rid="r1")


def test_a_wrong_secret_fails_either_way() -> None:
    _, ack = _handshake(RouterAuth(SECRET), WorkerAuth(b"another secret, 16+"))
    assert ack is None
    router, worker = RouterAuth(b"another secret, 16+"), WorkerAuth(SECRET)
    worker.hello(REG)
    answer = worker.answer(router.challenge(b"c1"), REG)
    forged = Ack(accepted=True, proof="00" * 32)  # a router that does not know the secret
    assert router.verify(b"c1", answer) is not None and not worker.accept(forged)


def test_a_challenge_serves_once_one_connection_and_expires() -> None:
    clock = Clock()
    router, worker = RouterAuth(SECRET, clock=clock), WorkerAuth(SECRET)
    worker.hello(REG)
    answer = worker.answer(router.challenge(b"c1"), REG)
    assert router.verify(b"c2", answer) is not None  # another connection's challenge
    answer = worker.answer(router.challenge(b"c1"), REG)
    assert router.verify(b"c1", answer) is None
    assert router.verify(b"c1", answer) == "unknown, used or expired challenge"  # replay
    answer = worker.answer(router.challenge(b"c1"), REG)
    clock.t = 60.0
    assert router.verify(b"c1", answer) == "unknown, used or expired challenge"


def test_a_register_changed_after_signing_is_refused() -> None:
    router, worker = RouterAuth(SECRET), WorkerAuth(SECRET)
    worker.hello(REG)
    answer = worker.answer(router.challenge(b"c1"), REG)
    assert router.verify(b"c1", replace(answer, gpu="a40")) == "wrong worker secret"


def test_sealed_messages_are_checked_and_never_replayed() -> None:
    router, worker = RouterAuth(SECRET), WorkerAuth(SECRET)
    _, ack = _handshake(router, worker)
    assert ack is not None and worker.accept(ack)
    first = router.seal("w0", Abort(rid="a"))
    second = router.seal("w0", Abort(rid="b"))
    assert worker.open(second) == Abort(rid="b")
    with pytest.raises(AuthError, match="replayed"):
        worker.open(first)  # older than what was already taken
    tampered = replace(router.seal("w0", Abort(rid="c")), body=Abort(rid="evil").to_wire().decode())
    with pytest.raises(AuthError, match="MAC"):
        worker.open(tampered)
    with pytest.raises(AuthError, match="unsealed"):
        worker.open(Submit(rid="x", input_ids=[1], sampling_params={}))


def test_no_session_no_send_and_no_secret_no_sealing() -> None:
    assert RouterAuth(SECRET).seal("unknown", Abort(rid="r")) is None
    assert RouterAuth(None).seal("w0", Abort(rid="r")) == Abort(rid="r")
    plain = WorkerAuth(None)
    assert plain.open(Abort(rid="r")) == Abort(rid="r") and plain.accept(Ack(accepted=True))
    assert plain.answer(RouterAuth(SECRET).challenge(b"c"), REG) is None


def test_the_secret_comes_from_the_flag_the_file_or_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("from-a-file-0123456789\n")
    assert load_worker_secret("from-the-flag-0123456", str(path), env={}) == b"from-the-flag-0123456"
    assert load_worker_secret(None, str(path), env={}) == b"from-a-file-0123456789"
    assert (
        load_worker_secret(None, None, env={"SGLANG_SLO_WORKER_SECRET": "from-env-0123456789"})
        == b"from-env-0123456789"
    )
    assert load_worker_secret(None, None, env={}) is None
    with pytest.raises(ValueError, match="16 bytes"):
        load_worker_secret("short", None, env={})


def test_a_client_key_alone_is_a_legacy_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SGLANG_SLO_WORKER_SECRET", raising=False)
    assert resolve_worker_secret(None, None, "k") == (legacy_secret("k"), "api key (legacy)")
    assert resolve_worker_secret(None, None, None) == (None, "none")
    assert resolve_worker_secret("a-real-secret-0123456", None, "k")[1] == "worker secret"


def test_the_access_files_worker_key_is_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SGLANG_SLO_WORKER_SECRET", raising=False)
    configured = b"the worker key of the access file"
    assert resolve_worker_secret(None, None, "k", configured) == (configured, "worker secret")  # not the legacy
    assert resolve_worker_secret(configured.decode(), None, None, configured) == (configured, "worker secret")
    with pytest.raises(ValueError, match="differs from the worker key of --auth-config"):
        resolve_worker_secret("another secret, 16+ bytes", None, None, configured)
    monkeypatch.setenv("SGLANG_SLO_WORKER_SECRET", "an env secret, 16+ bytes")
    with pytest.raises(ValueError, match="differs"):
        resolve_worker_secret(None, None, None, configured)
