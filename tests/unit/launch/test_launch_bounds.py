"""Bounded queues by default: a worker started through launch_server queues at most
DEFAULT_MAX_QUEUED_REQUESTS requests (SGLang alone has no bound), and the flag still overrides it.
The router's default is checked in tests/unit/router/test_launch_router.py."""

from __future__ import annotations

from launch_server import DEFAULT_MAX_QUEUED_REQUESTS, build_parser


def test_a_worker_queue_is_bounded_unless_told_otherwise() -> None:
    parser = build_parser()
    assert parser.parse_args(["--model-path", "tiny"]).max_queued_requests == DEFAULT_MAX_QUEUED_REQUESTS
    assert DEFAULT_MAX_QUEUED_REQUESTS > 0
    assert parser.parse_args(["--model-path", "tiny", "--max-queued-requests", "7"]).max_queued_requests == 7
