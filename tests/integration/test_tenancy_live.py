"""Per-key SLO limits on a real worker reached directly (issue #45, finding 6): a key limited to
TTFT >= 1 s that asks for 0.001 ms is scheduled at 1000 ms and its SLO report says so, on the
native and the OpenAI routes; a reject key gets 403 naming the field; program ids are the key's.

One worker for the session (keyed_worker.py).
"""

from __future__ import annotations

import pytest
import requests

from server.process import ServerProcess
from tests.integration.keyed_worker import KEYS

LIMITED = "tenant-l"  # min_ttft_ms 1000, max_weight 2: clamped
LIMITED_KEY = KEYS[LIMITED]
STRICT_KEY = KEYS["tenant-s"]  # min_ttft_ms 1000, on_violation reject


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def worker(keyed_worker: ServerProcess) -> ServerProcess:
    """The session's worker with keys of every role (keyed_worker.py)."""
    return keyed_worker


def _generate(worker: ServerProcess, key: str, slo: dict) -> requests.Response:
    body = {"text": "the capital of france is", "sampling_params": {"max_new_tokens": 4, "temperature": 0}, "slo": slo}
    return requests.post(worker.url + "/generate", json=body, headers=_auth(key), timeout=120)


def test_a_limited_key_is_scheduled_at_its_minimum_and_told_so(worker: ServerProcess) -> None:
    resp = _generate(worker, LIMITED_KEY, {"ttft_ms": 0.001, "weight": 9})
    assert resp.status_code == 200, resp.text
    report = resp.json()["meta_info"]["slo"]
    assert report["spec"]["ttft_ms"] == 1000.0 and report["spec"]["weight"] == 2.0
    assert report["clamped"] == {
        "ttft_ms": {"asked": 0.001, "granted": 1000.0},
        "weight": {"asked": 9.0, "granted": 2.0},
    }
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 3, "slo": {"ttft_ms": 5}}
    openai = requests.post(worker.url + "/v1/completions", json=body, headers=_auth(LIMITED_KEY), timeout=120)
    assert openai.status_code == 200, openai.text
    assert openai.json()["slo"]["clamped"] == {"ttft_ms": {"asked": 5.0, "granted": 1000.0}}


def test_a_reject_key_gets_403_naming_the_field(worker: ServerProcess) -> None:
    resp = _generate(worker, STRICT_KEY, {"ttft_ms": 1})
    assert resp.status_code == 403 and resp.json()["error"]["param"] == "slo.ttft_ms", resp.text
    ok = _generate(worker, STRICT_KEY, {"ttft_ms": 2000})
    assert ok.status_code == 200 and "clamped" not in ok.json()["meta_info"]["slo"]


def test_program_ids_are_the_keys(worker: ServerProcess) -> None:
    resp = _generate(worker, LIMITED_KEY, {"deadline_ms": 60000, "program_id": "p1", "stage": 0})
    assert resp.status_code == 200, resp.text
    assert resp.json()["meta_info"]["slo"]["spec"]["program_id"] == f"{LIMITED}/p1"
