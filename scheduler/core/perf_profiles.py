"""Perf profile files: the JSON a profiled card's step times are shipped in (format documented
in scheduler/profiles/README.md), where the shipped ones live, and the samples they hold."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scheduler.core.step_time import Sample

PROFILE_FORMAT = "sglang-slo-perf-profile/1"
PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles"


def profile_path(gpu: str, model: str = "llama3-8b") -> Path:
    """Where a shipped profile lives, e.g. profile_path("h100") → .../profiles/h100-llama3-8b.json."""
    return PROFILE_DIR / f"{gpu.lower()}-{model.lower()}.json"


def load_profile(path: str | Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        profile = json.load(fh)
    if not isinstance(profile, dict) or profile.get("format") != PROFILE_FORMAT:
        raise ValueError(f"{path}: not a perf profile (expected format {PROFILE_FORMAT!r})")
    return profile


def save_profile(profile: Mapping[str, Any], path: str | Path) -> None:
    data = {"format": PROFILE_FORMAT, **profile}
    Path(path).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def samples_from_profile(profile: Mapping[str, Any]) -> list[Sample]:
    return [
        Sample(
            int(s["prefill_tokens"]),
            int(s["decode_reqs"]),
            int(s["kv_tokens"]),
            int(s.get("spec_tokens", 0)),
            float(s["time_s"]),
        )
        for s in profile.get("samples", [])
    ]


def as_profile(profile: Mapping[str, Any] | str | Path) -> Mapping[str, Any]:
    return load_profile(profile) if isinstance(profile, (str, Path)) else profile
