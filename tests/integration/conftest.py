"""Real servers for integration tests: started once per session/module, stopped by PID."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from server.process import ServerProcess
from tests.integration.keyed_worker import serve_keyed_worker


@pytest.fixture(scope="session")
def tiny_server() -> Iterator[ServerProcess]:
    """The tiny random model with EDF (the default policy)."""
    with ServerProcess("--model-path", "tiny", "--slo-policy", "edf", name="tiny-edf") as server:
        yield server


@pytest.fixture(scope="session")
def default_server() -> Iterator[ServerProcess]:
    """The default model (SmolLM2-135M-Instruct) with EDF, as `./slo serve` starts it: shared by
    the tests that only send it requests (loading the model is most of a test's time)."""
    with ServerProcess("--slo-policy", "edf", name="default-edf") as server:
        yield server


@pytest.fixture(scope="session")
def keyed_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The tiny worker with keys of every role (keyed_worker.py), for the suites that check them."""
    yield from serve_keyed_worker(tmp_path_factory.mktemp("keys"))
