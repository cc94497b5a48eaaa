"""Real servers for integration tests: started once per session/module, stopped by PID.

A shared server is stopped right after the last collected test that uses it, not at the end of
the session: an idle SGLang server still polls (a few % of a core each), and on a 2-core host
every idle one slows the tests that follow it."""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from server.process import ServerProcess
from tests.integration.keyed_worker import keyed_worker_process

SHARED = ("tiny_server", "default_server", "keyed_worker")
_last_user: dict[str, str] = {}  # shared fixture -> node id of the last collected test using it
_running: dict[str, ServerProcess] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        for name in SHARED:
            if name in getattr(item, "fixturenames", ()):
                _last_user[name] = item.nodeid


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    yield
    for name, last in _last_user.items():
        if last == item.nodeid and name in _running:
            _running.pop(name).stop()  # the fixture's own exit then finds it stopped


def _shared(name: str, server: ServerProcess) -> Iterator[ServerProcess]:
    with server:
        _running[name] = server
        try:
            yield server
        finally:
            _running.pop(name, None)


@pytest.fixture(scope="session")
def tiny_server() -> Iterator[ServerProcess]:
    """The tiny random model with EDF (the default policy)."""
    yield from _shared("tiny_server", ServerProcess("--model-path", "tiny", "--slo-policy", "edf", name="tiny-edf"))


@pytest.fixture(scope="session")
def default_server() -> Iterator[ServerProcess]:
    """The default model (SmolLM2-135M-Instruct) with EDF, as `./slo serve` starts it: shared by
    the tests that only send it requests (loading the model is most of a test's time)."""
    yield from _shared("default_server", ServerProcess("--slo-policy", "edf", name="default-edf"))


@pytest.fixture(scope="session")
def keyed_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The tiny worker with keys of every role (keyed_worker.py), for the suites that check them."""
    yield from _shared("keyed_worker", keyed_worker_process(tmp_path_factory.mktemp("keys")))
