"""Tensor and data parallelism on SGLang's CPU engine with the tiny model. launch_server gives
each TP rank its own core (SGLANG_CPU_OMP_THREADS_BIND "0|1" on a 2-core machine; SGLang refuses
more ranks than NUMA nodes without it).

- TP=2 under slos, two running slots and a concurrent mixed-SLO workload: every request's tokens
  equal a TP=1 server's (greedy), and the ranks stay in step: the leading rank's plan (order,
  admission tier, batch levers) is applied verbatim by the other (a rank that dropped, ordered or
  preempted differently would hang the forward's collectives or diverge). One policy is enough:
  the plan crosses ranks the same way for every policy, and the LAS run below adds preemption.
- TP=2 with preemption for certain (LAS, test_preemption's scenario): the preempted requests
  resume token-identical to an un-preempted run.
- DP=2: two replicas, each publishing its scheduler status on its own address (one address for
  both made the second replica fail to start), merged into one engine status; every rank gets its
  own cores (SGLang counts dp x tp ranks against NUMA nodes), and a rank that dies at start-up
  stops the server with its error instead of leaving it hanging.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from server.process import ServerProcess
from tests.integration import test_preemption as preemption
from tests.integration.adapter_health import assert_policy_in_charge

PROMPTS = [[5 + (i * 11 + j * 3) % 500 for i in range(12 + 6 * j)] for j in range(8)]
SLOS = [
    {"ttft_ms": 20_000, "tpot_ms": 500},
    {"ttft_ms": 60_000, "tpot_ms": 2_000},
    {"deadline_ms": 120_000},
    {"class": "best_effort"},
]
NEW_TOKENS = 32


def _generate(url: str, ids: list[int], slo: dict | None = None, n: int = NEW_TOKENS) -> list[int]:
    body: dict = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
    if slo is not None:
        body["slo"] = slo
    resp = requests.post(url + "/generate", json=body, timeout=600)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["meta_info"]["completion_tokens"] == n
    return out["output_ids"]


@pytest.fixture(scope="module")
def reference(tiny_server: ServerProcess) -> dict[int, list[int]]:
    """TP=1 tokens of every prompt, one at a time (no contention)."""
    return {i: _generate(tiny_server.url, ids) for i, ids in enumerate(PROMPTS)}


@pytest.fixture(scope="module")
def tp2() -> Iterator[ServerProcess]:
    with ServerProcess(
        "--model-path", "tiny", "--tp-size", "2", "--slo-policy", "slos", "--max-running-requests", "2",
        name="tp2-slos",
    ) as server:  # fmt: skip
        yield server


def test_tp2_serves_the_tokens_of_tp1_under_contention(tp2: ServerProcess, reference: dict[int, list[int]]) -> None:
    server = tp2
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        futures = {i: pool.submit(_generate, server.url, ids, SLOS[i % len(SLOS)]) for i, ids in enumerate(PROMPTS)}
        outputs = {i: f.result(timeout=600) for i, f in futures.items()}
    for i, ids in outputs.items():
        assert ids == reference[i], f"slos, TP=2: prompt {i} diverged from TP=1"
    engine = server.status_when(lambda s: s["engine"].get("running") == 0 and s["engine"].get("steps", 0) > 0)["engine"]
    assert engine["running"] == 0 and engine["waiting"] == 0
    assert_policy_in_charge(engine)  # the leading rank's plans, not SGLang's fallback, ran the group
    assert requests.get(server.url + "/health", timeout=10).status_code == 200


@pytest.fixture(scope="module")
def las_tp2() -> Iterator[ServerProcess]:
    with ServerProcess(
        "--model-path", "tiny", "--tp-size", "2", "--slo-policy", "las",
        "--slo-policy-param", f"level_thresholds=[{preemption.LEVEL}]", "--slo-policy-param", "quantum_steps=1",
        "--slo-policy-param", "starvation_s=null", "--max-running-requests", "2", name="tp2-las",
    ) as server:  # fmt: skip
        yield server


def test_tp2_preempted_requests_resume_token_identical(las_tp2: ServerProcess) -> None:
    preemption.test_preempted_request_resumes_token_identical(las_tp2)


def test_dp2_replicas_publish_apart_and_are_merged(tiny_server: ServerProcess) -> None:
    with ServerProcess("--model-path", "tiny", "--dp-size", "2", "--slo-policy", "edf", name="dp2") as server:
        status = server.status_when(lambda s: (s["engine"].get("data_parallel") or {}).get("reporting") == 2, 30)
        engine = status["engine"]
        assert engine["data_parallel"] == {"replicas": 2, "reporting": 2}
        single = tiny_server.status_when(lambda s: bool(s["engine"]))["engine"]["kv_capacity_tokens"]
        assert engine["kv_capacity_tokens"] == 2 * single  # both replicas' caches, each its own
        with ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda ids: _generate(server.url, ids, n=8), PROMPTS[:4]))
        assert all(len(ids) == 8 for ids in outs)
        engine = server.status_when(lambda s: s["engine"].get("running") == 0 and s["engine"].get("steps", 0) > 0)
        assert_policy_in_charge(engine["engine"])  # both replicas' passes planned by EDF


def test_a_scheduler_rank_dying_at_start_up_stops_the_server_with_its_error() -> None:
    """One core list for two DP ranks: SGLang's second rank refuses to bind and dies. The server
    must exit with the error (SGLang alone left its other processes running and the server hung)."""
    import os

    env = {**os.environ, "SGLANG_CPU_OMP_THREADS_BIND": "0"}
    server = ServerProcess("--model-path", "tiny", "--dp-size", "2", name="dp2-dying-rank", env=env)
    with pytest.raises(RuntimeError, match="server exited with 1") as failed:
        server.start()
    assert "sglang-slo: the server failed: Rank" in str(failed.value)
    assert "SGLANG_CPU_OMP_THREADS_BIND" in server.log_path.read_text(errors="replace")  # the rank's own error
