"""Soft admission on the real engine (SLOs-Serve §4.1): a burst larger than capacity leaves the
admitted requests within their SLO, and the declined ones still finish, in the best-effort tier.

Admission depends on the performance model, and this CPU's iteration times are noisy, so the
server gets a fixed profile that predicts several times slower iterations than the tiny model
really takes (20 ms + 2 ms per batch token, against a few ms here). What "capacity" means is
then deterministic: the DP declines what the profile says cannot meet its deadline, and what it
admits really has the margin to meet it.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from server.process import ServerProcess

pytestmark = pytest.mark.paced  # asserts the engine's pace: runs alone (tests/conftest.py)

BURST = 20
OUTPUT_TOKENS = 24
DEADLINE_MS = 1000.0
SLOW_PROFILE = {
    "format": "sglang-slo-perf-profile/1",
    "roofline": {"terms": [{"b": 0.02, "k_tokens": 2e-3, "k_kv": 0.0, "k_spec": 0.0}]},
}


def _send(server: ServerProcess, i: int, slo: dict | None) -> dict:
    body = {
        "text": f"burst request {i} " * 3,
        "sampling_params": {"max_new_tokens": OUTPUT_TOKENS, "ignore_eos": True},
    }
    if slo is not None:
        body["slo"] = slo
    r = requests.post(server.url + "/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def test_a_burst_beyond_capacity_keeps_the_admitted_within_slo(tmp_path: Path) -> None:
    profile = tmp_path / "slow-profile.json"
    profile.write_text(json.dumps(SLOW_PROFILE))
    args = ["--model-path", "tiny", "--slo-policy", "slos", "--slo-perf-profile", str(profile)]
    with ServerProcess(*args, name="admission") as server:
        _send(server, -1, None)  # warm the engine before timing anything
        barrier = threading.Barrier(BURST)

        def one(i: int) -> dict:
            barrier.wait()
            return _send(server, i, {"deadline_ms": DEADLINE_MS})

        with ThreadPoolExecutor(BURST) as pool:
            metas = list(pool.map(one, range(BURST)))

        assert all(m["completion_tokens"] == OUTPUT_TOKENS for m in metas), "a declined request was lost"
        admitted = [m["slo"] for m in metas if m["slo"]["tier"] == "admitted"]
        declined = [m["slo"] for m in metas if m["slo"]["tier"] == "best_effort"]
        assert admitted and declined, [m["slo"]["tier"] for m in metas]
        late = [(s["e2e_ms"], s["attained"]) for s in admitted if not s["attained"]["overall"]]
        assert not late, f"admitted requests missed their deadline: {late}"

        status = server.status_when(lambda s: sum(t["total"] for t in s["tiers"].values()) >= BURST + 1)
        assert status["tiers"]["best_effort"]["total"] == len(declined)
        assert status["tiers"]["admitted"]["missed"] == 0
        assert sum(t["dropped"] for t in status["tiers"].values()) == 0
        assert status["engine"]["mixed_batching"] is False  # CPU default; the DP still plans per step
        assert status["engine"]["plan_errors"] == 0
