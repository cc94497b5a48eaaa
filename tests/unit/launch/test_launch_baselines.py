"""SGLang's own ordering policies (0.5.23: hrrn, shortest-prefill-first) as baselines through our
launcher: with --slo-policy fcfs the user's --schedule-policy reaches SGLang; an SLO policy owns
the order, so SGLang's is set to fcfs (it must not re-sort the queue our policy planned)."""

from __future__ import annotations

import pytest

from launch_checks import check_slo_args
from launch_server import build_parser


@pytest.mark.parametrize("policy", ["hrrn", "shortest-prefill-first"])
def test_sglangs_ordering_policy_runs_under_slo_policy_fcfs(policy: str) -> None:
    args = build_parser().parse_args(["--model-path", "m", "--slo-policy", "fcfs", "--schedule-policy", policy])
    check_slo_args(args, emulation=None, on_cpu=True)
    assert args.schedule_policy == policy


def test_an_slo_policy_keeps_sglang_from_reordering() -> None:
    args = build_parser().parse_args(["--model-path", "m", "--slo-policy", "edf", "--schedule-policy", "hrrn"])
    check_slo_args(args, emulation=None, on_cpu=True)
    assert args.schedule_policy == "fcfs"
