"""`live_run`: a benchmark's record survives a failed run, and its servers are stopped."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks import _server


def _quiet(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Keep this process's signal handlers, and log what stop_all would have stopped."""
    stopped: list[str] = []
    monkeypatch.setattr(_server, "install_signal_handlers", lambda: None)
    monkeypatch.setattr(_server, "stop_all", lambda: stopped.append("all"))
    return stopped


def test_a_failed_run_keeps_what_it_measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stopped = _quiet(monkeypatch)
    args = argparse.Namespace(json=tmp_path / "run.json", seed=3)
    with pytest.raises(RuntimeError), _server.live_run(args) as out:
        out["cells"] = [{"gpu": "h100"}]
        raise RuntimeError("a worker died")
    record = json.loads(args.json.read_text())
    assert record["cells"] == [{"gpu": "h100"}]
    assert record["args"] == {"json": str(args.json), "seed": 3}
    assert stopped == ["all"]


def test_a_run_without_json_still_stops_its_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped = _quiet(monkeypatch)
    with _server.live_run(argparse.Namespace(json=None), cores=True) as out:
        out["cells"] = []
    assert out["machine"].endswith(" cores") and stopped == ["all"]
