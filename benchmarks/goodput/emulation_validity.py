"""Whether a run on emulated GPUs counts: every emulated worker must have kept its card's pace.

A figure measured on an emulated GPU holds only when the emulator kept the card's time. Every
benchmark that runs emulated workers records, per run and per worker, the share of steps that
ran late (two reads of the worker's /slo/status pacing counters, before and after the run), and
marks the run invalid when any worker's share exceeds MAX_LATE_SHARE: a policy's advantage that
appears only when steps run late is an artifact of the emulator, not a result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import requests

MAX_LATE_SHARE = 0.02


def emulation_counters(url: str) -> dict[str, Any] | None:
    """A worker's cumulative pacing counters; None when it is not emulated or cannot be read."""
    try:
        return requests.get(url + "/slo/status", timeout=5).json()["engine"]["emulation"]
    except (requests.RequestException, ValueError, KeyError, TypeError):
        return None


def pacing_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """One window's pacing on one worker, from two reads of its cumulative counters: the steps
    that ran late and by how much, and how long the card sat idle waiting for the host between
    back-to-back steps. (The error quantiles are the pacer's recent window, not this one's.)"""
    if not before or not after:
        return None

    def grew(key: str) -> float:
        return (after.get(key) or 0) - (before.get(key) or 0)

    steps, late = grew("steps"), grew("late_steps")
    gap, back_to_back = grew("host_gap_s"), grew("back_to_back_s")

    def late_mean(key: str) -> float:  # the counters hold means over late steps so far
        grown = (after.get(key) or 0.0) * after["late_steps"] - (before.get(key) or 0.0) * before["late_steps"]
        return grown / late if late else 0.0

    return {
        "gpu_model": after.get("gpu_model"),
        "steps": steps,
        "late_steps": late,
        "late_share": late / steps if steps else 0.0,
        "mean_overrun_ms": late_mean("mean_overrun_ms"),
        "mean_overrun_share": late_mean("mean_overrun_share"),
        "host_gap_share": gap / (gap + back_to_back) if back_to_back > 0 else 0.0,
        "unpaced_steps": grew("unpaced_steps"),
        "median_abs_error": after.get("median_abs_error"),
        "p95_abs_error": after.get("p95_abs_error"),
    }


def verdict(pacing: Mapping[str, dict[str, Any] | None] | None) -> dict[str, Any]:
    """`valid` is None when no worker was emulated (nothing to judge), else whether every
    worker stayed within MAX_LATE_SHARE; `late_workers` names those that did not."""
    shares = {name: p["late_share"] for name, p in (pacing or {}).items() if p}
    if not shares:
        return {"valid": None, "worst_late_share": None, "late_workers": []}
    late = sorted(name for name, share in shares.items() if share > MAX_LATE_SHARE)
    return {"valid": not late, "worst_late_share": max(shares.values()), "late_workers": late}


def late_cell(pacing: Mapping[str, dict[str, Any] | None] | None) -> str:
    """The worst worker's late share for a table, flagged when the run does not count."""
    v = verdict(pacing)
    if v["valid"] is None:
        return "-"
    return f"{v['worst_late_share']:.1%}" + ("" if v["valid"] else " INVALID")


def invalid_note(runs: list[dict[str, Any]]) -> str:
    """A line under a results table naming the runs that do not count, or "" when all do."""
    bad = [r for r in runs if verdict((r.get("config") or {}).get("pacing"))["valid"] is False]
    if not bad:
        return ""
    names = ", ".join(f"{r['label']} @ {r.get('rate')}" for r in bad)
    return (
        f"INVALID (an emulated worker ran more than {MAX_LATE_SHARE:.0%} of its steps late, so the "
        f"emulation did not keep the card's pace): {names}"
    )
