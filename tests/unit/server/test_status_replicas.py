"""The HTTP process subscribes to one status channel per scheduler that publishes one: SGLang
0.5.23's --attn-dp-size (whose records read enable_dp_attention false) as well as the
deprecated --dp-size N --enable-dp-attention and plain data parallelism."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("flags", "replicas"),
    [
        ([], 1),
        (["--attn-dp-size", "2", "--tp-size", "2"], 2),
        (["--dp-size", "2", "--enable-dp-attention", "--tp-size", "2"], 2),
        (["--dp-size", "3"], 3),
    ],
)
def test_one_channel_per_publishing_scheduler(flags: list[str], replicas: int) -> None:
    from sglang.srt.server_args import ServerArgs

    from launch_server import build_parser
    from server.sglang_http import status_replicas

    record = ServerArgs.from_cli_args(build_parser().parse_args(["--model-path", "m", *flags]))
    assert status_replicas(record) == replicas
