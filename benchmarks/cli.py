"""What the benchmark commands share on their command line: --help from the module docstring,
and `--policy-param POLICY:KEY=VALUE` parsed once, so the routing and the simulated goodput
benchmarks take a policy's parameters the way the server's `--slo-policy-param` does (a value
that is not JSON stays a string); and the head of a run's --json record."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
from collections.abc import Collection
from pathlib import Path
from typing import Any


def policy_overrides(items: list[str], known: Collection[str]) -> dict[str, dict[str, Any]]:
    """`POLICY:KEY=JSON` items as {policy: {key: value}}; an unknown policy is a ValueError."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        head, sep, raw = item.partition("=")
        policy, colon, key = head.partition(":")
        if not (sep and colon and policy and key):
            raise ValueError(f"--policy-param takes POLICY:KEY=VALUE, got {item!r}")
        if policy not in known:
            raise ValueError(f"--policy-param: unknown policy {policy!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out.setdefault(policy, {})[key] = value
    return out


def doc_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """A benchmark's parser whose --help is its module docstring: the first paragraph as the
    description, the rest (how to run it, what it writes) as the epilog."""
    description, epilog = doc.split("\n\n", 1)
    return argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=epilog
    )


def run_header(args: argparse.Namespace, *, cores: bool = False) -> dict[str, Any]:
    """When, on which machine (with its core count when `cores`) and with which flags a benchmark
    ran: the head of its --json record, so a result can be traced to its run."""
    machine = f"{platform.node()} {platform.machine()}"
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{machine} {os.cpu_count()} cores" if cores else machine,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
