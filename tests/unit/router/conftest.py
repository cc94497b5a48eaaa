"""Shared fixtures of the router tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq.asyncio


@pytest.fixture
def ctx() -> Iterator[zmq.asyncio.Context]:
    """A private ZMQ context per test, destroyed even when a test fails with sockets open."""
    context = zmq.asyncio.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)
