"""Real servers for integration tests: started once per session/module, stopped by PID."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from server.process import ServerProcess


@pytest.fixture(scope="session")
def tiny_server() -> Iterator[ServerProcess]:
    """The tiny random model with EDF (the default policy)."""
    with ServerProcess("--model-path", "tiny", "--slo-policy", "edf", name="tiny-edf") as server:
        yield server
