"""Analyzer artifacts load at server start: a saved length predictor bounds live requests, and
seed program patterns give compound stages their sub-deadlines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import requests

from scheduler.core.analyzer.base import LengthSample, save_predictor
from scheduler.core.analyzer.predictors import make_predictor
from scheduler.core.analyzer.spec import COLD_START
from server.process import ServerProcess
from tests.integration.test_policies_on_engine import assert_serves_mixed_workload


def _history_artifact(path: Path) -> Path:
    samples = [LengthSample(prompt_text=f"question {i}", prompt_len=5, output_len=20 + i) for i in range(30)]
    save_predictor(make_predictor("history").fit(samples), path)
    return path


MIXED_ON_ENGINE = ("sjf",)  # test_policies_on_engine's mixed workload runs for sjf here
PATTERNS = Path(__file__).resolve().parents[2].parent / "shared/data/jitserve-deepresearch/deepresearch_training.json"


def test_server_loads_predictor_and_uses_it(tmp_path: Path) -> None:
    artifact = _history_artifact(tmp_path / "history.pkl")
    patterns = ["--slo-program-patterns", str(PATTERNS)] if PATTERNS.is_file() else []
    with ServerProcess(
        "--model-path",
        "tiny",
        "--slo-policy",
        "sjf",
        "--max-running-requests",
        "4",
        "--slo-length-predictor",
        str(artifact),
        *patterns,
        name="sjf-pred",
    ) as server:
        for i in range(3):
            r = requests.post(
                server.url + "/generate",
                json={"text": f"question {i}", "sampling_params": {"max_new_tokens": 4}, "slo": {"deadline_ms": 9000}},
                timeout=60,
            )
            assert r.status_code == 200, r.text
        status = server.status_when(lambda s: (s["engine"].get("length_predictor") or {}).get("predictions", 0) >= 3)
        engine = status["engine"]
        assert engine["policy"] == "sjf"
        assert engine["length_predictor"]["name"] == "history"
        assert engine["length_predictor"]["predictions"] >= 3
        assert engine["plan_errors"] == 0
        if patterns:
            for stage in range(2):
                r = requests.post(
                    server.url + "/generate",
                    json={
                        "text": f"stage {stage}",
                        "sampling_params": {"max_new_tokens": 4},
                        "slo": {"deadline_ms": 60000, "program_id": "research-1", "stage": stage},
                    },
                    timeout=60,
                )
                assert r.status_code == 200, r.text
            compound = server.status_when(lambda s: s["engine"]["compound"]["stage_deadlines_matched"] >= 2)["engine"][
                "compound"
            ]
            assert compound["patterns"] >= 300  # the deep-research seed (394 jobs)
            assert compound["stage_deadlines_matched"] >= 2
        assert_serves_mixed_workload(server, "sjf")  # sjf's engine run of the policies' mixed workload


def test_unreadable_predictor_stops_start_up(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(b"not a predictor")
    proc = subprocess.run(
        [sys.executable, "-m", "launch_server", "--model-path", "tiny", "--slo-length-predictor", str(bad)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "--slo-length-predictor" in proc.stderr


def _ask_four_tokens(server: ServerProcess, n: int) -> None:
    for i in range(n):
        r = requests.post(
            server.url + "/generate",
            json={
                "text": f"question {i}",
                "sampling_params": {"max_new_tokens": 4, "ignore_eos": True},
                "slo": {"deadline_ms": 9000},
            },
            timeout=60,
        )
        assert r.status_code == 200, r.text


def test_a_default_server_bounds_from_its_first_request() -> None:
    """No flag: the trained:0.9 default bounds every request from the first (the bundled table),
    where the history alone leaves the first COLD_START answers to the client's cap (unscored)."""
    n = COLD_START + 3
    with ServerProcess("--model-path", "tiny", "--slo-policy", "sjf", name="sjf-trained-lengths") as server:
        _ask_four_tokens(server, n)
        status = server.status_when(lambda s: (s["engine"].get("predictor_accuracy") or {}).get("requests", 0) >= n)
        engine = status["engine"]
        assert engine["length_predictor"]["name"] == "trained"
        # every answer had a bound to score (SGLang's own warm-up request may be one more); the
        # history alone would have scored n - COLD_START of them
        assert engine["predictor_accuracy"]["requests"] >= n
        assert engine["length_predictor"]["bound"] == "table"  # the histories have too few answers scored yet


def test_a_history_server_learns_its_length_bounds_from_its_own_answers() -> None:
    """history:0.9 bounds nothing until COLD_START answers are in, then bounds each newcomer by
    what the answers before it took (all 4 tokens here: no error)."""
    with ServerProcess(
        "--model-path", "tiny", "--slo-policy", "sjf", "--slo-length-predictor", "history:0.9", name="sjf-history"
    ) as server:
        _ask_four_tokens(server, COLD_START + 3)
        status = server.status_when(lambda s: (s["engine"].get("predictor_accuracy") or {}).get("requests", 0) >= 3)
        engine = status["engine"]
        assert engine["length_predictor"]["name"] == "history"
        assert engine["predictor_accuracy"]["mae_tokens"] == 0.0  # learned: every answer took 4 tokens
        # bounds made before the cold start ended (none: the client's cap) are not scored
        assert engine["predictor_accuracy"]["requests"] < COLD_START + 3
