"""Every policy of the core runs inside the real SGLang scheduler (tiny model, CPU).

A tiny server costs ~38 s to start and stop, the mixed workload ~1 s, so policies with a server
in another module anyway run the workload there (RUN_ELSEWHERE); the rest get one here each.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from scheduler.core.policies import POLICIES
from server.process import ServerProcess

MIXED = [
    *({"ttft_ms": 20_000, "tpot_ms": 2_000} for _ in range(4)),
    *({"deadline_ms": 30_000} for _ in range(2)),
    *({"deadline_ms": 60_000, "program_id": "prog", "stage": s} for s in range(2)),
    *(None for _ in range(2)),
]
ORACLE_COVERED = "its base policy runs here; the oracle hint is unit-tested"
# policy -> where its mixed-workload engine run happens instead of on a server of its own here
RUN_ELSEWHERE = {
    "edf": "test_scheduling_order.py, on edf_one_slot",
    "fcfs": "test_scheduling_order.py, on fcfs_one_slot",
    "las": "test_preemption.py, on las_two_slots (overlap and no-overlap)",
    "sjf": "test_length_predictor.py, on sjf-pred (with its length predictor)",
    # This workload sends no oracle hint, so an oracle variant only passes requests to its base
    # policy (tempo, gmax, slos: run here); the hint path is unit-tested (tests/unit/scheduler/test_hidden_length.py,
    # tests/unit/core/test_oracle_policies.py). The variants are benchmark-only.
    "gmax_oracle": ORACLE_COVERED,
    "tempo_oracle": ORACLE_COVERED,
    "slos_oracle": ORACLE_COVERED,
}
ON_OWN_SERVER = sorted(set(POLICIES) - set(RUN_ELSEWHERE))


def _send(server: ServerProcess, i: int, slo: dict | None, max_new: int = 12) -> dict:
    body = {"text": f"request {i} " * (1 + i % 5), "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True}}
    if slo is not None:
        body["slo"] = slo
    r = requests.post(server.url + "/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def _attainment_sum(status: dict, key: str) -> int:
    return sum(c[key] for c in status["attainment"].values())


def assert_serves_mixed_workload(server: ServerProcess, policy: str) -> None:
    """MIXED on `server` (running `policy`): nothing lost, every request scored. Counts are
    deltas, so the server may have served other tests before (all of their requests answered)."""
    before = server.status_when(lambda s: True)
    with ThreadPoolExecutor(len(MIXED)) as pool:
        metas = list(pool.map(lambda a: _send(server, *a), enumerate(MIXED)))
    assert all(m["completion_tokens"] == 12 for m in metas)
    assert all(m["slo"]["output_tokens"] == 12 and m["slo"]["attained"]["overall"] is not None for m in metas)
    total_before = _attainment_sum(before, "total")
    status = server.status_when(lambda s: _attainment_sum(s, "total") >= total_before + len(MIXED))
    assert _attainment_sum(status, "total") - total_before == len(MIXED)
    assert _attainment_sum(status, "dropped") - _attainment_sum(before, "dropped") == 0
    assert status["engine"]["plan_errors"] == 0
    assert status["engine"]["policy"] == policy
    assert status["engine"]["mixed_batching"] is False  # --slo-batching auto: separate on CPU


@pytest.mark.parametrize("policy", ON_OWN_SERVER)
def test_policy_serves_a_mixed_workload_without_losing_requests(policy: str) -> None:
    with ServerProcess(
        "--model-path", "tiny", "--slo-policy", policy, "--max-running-requests", "4", name=f"mix-{policy}"
    ) as server:
        assert_serves_mixed_workload(server, policy)


def test_every_policy_gets_a_mixed_workload_engine_run() -> None:
    """No policy silently loses its engine run: each runs here or in a module that says so."""
    from tests.integration.test_length_predictor import MIXED_ON_ENGINE as on_predictor_server
    from tests.integration.test_preemption import MIXED_ON_ENGINE as on_las_servers
    from tests.integration.test_scheduling_order import MIXED_ON_ENGINE as on_one_slot_servers

    assert set(ON_OWN_SERVER) | set(RUN_ELSEWHERE) == set(POLICIES), set(RUN_ELSEWHERE) - set(POLICIES)
    oracles = {p for p, where in RUN_ELSEWHERE.items() if where == ORACLE_COVERED}
    assert {*on_one_slot_servers, *on_las_servers, *on_predictor_server, *oracles} == set(RUN_ELSEWHERE)
    assert {p.removesuffix("_oracle") for p in oracles} <= set(ON_OWN_SERVER)  # each base policy runs here


def _burst(server: ServerProcess, slo: dict, n: int = 12) -> None:
    barrier = threading.Barrier(n)

    def one(i: int) -> None:
        barrier.wait()
        _send(server, i, slo, max_new=24)

    with ThreadPoolExecutor(n) as pool:
        list(pool.map(one, range(n)))


def test_batch_cap_and_chunk_follow_the_slo_mix() -> None:
    """With a given profile (the H100 one: deterministic predictions, unlike this CPU's timing)."""
    profile = Path(__file__).resolve().parents[2] / "scheduler/profiles/h100-llama3-8b.json"
    args = ["--model-path", "tiny", "--slo-policy", "edf", "--chunked-prefill-size", "256", "--slo-batching", "mixed"]
    args += ["--slo-policy-param", "slo_levers=true"]  # plain edf keeps SGLang's batch shape
    with ServerProcess(*args, "--slo-perf-profile", str(profile), name="levers") as server:
        status = server.status_when(lambda s: "perf_model" in s["engine"], timeout=10)
        assert status["engine"]["perf_model"]["ready"], status["engine"]["perf_model"]
        decode_ms = status["engine"]["perf_model"]["predicted_decode_ms"]
        assert decode_ms["32"] > decode_ms["1"]
        tight_ms = (decode_ms["1"] + decode_ms["32"]) / 2  # one request meets it, 32 do not
        _burst(server, {"ttft_ms": 60_000, "tpot_ms": 60_000})
        loose = server.status_when(lambda s: s["engine"]["batch_cap"] is not None)["engine"]
        _burst(server, {"ttft_ms": 60_000, "tpot_ms": tight_ms})
        tight = server.status_when(lambda s: s["engine"]["batch_cap"] != loose["batch_cap"])["engine"]
        assert loose["batch_cap"] > tight["batch_cap"] >= 1, (decode_ms, loose, tight)
        # The chunk follows the running requests' banked slack (a 60 s TTFT banks plenty here; the
        # sizing itself is tests/unit/core/test_batch_levers.py): here, that the engine applies
        # the plan's prefill budget within the start-up chunk it sized its buffers on.
        assert loose["startup_chunk_size"] == 256
        if tight["prefill_tokens"] is None:  # the plan left prefill to SGLang: its start-up chunk
            assert tight["chunk_size"] == 256
        else:
            assert 1 <= tight["prefill_tokens"] <= 256 and tight["chunk_size"] <= 256
