"""The SLO API on the real server (tiny model, CPU): every route reports against the SLO."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
import requests

from server.process import ServerProcess


def _generate(server: ServerProcess, **body: object) -> requests.Response:
    payload = {"text": "the capital of france is", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    payload.update(body)
    return requests.post(server.url + "/generate", json=payload, timeout=60)


def test_native_generate_reports_the_slo(tiny_server: ServerProcess) -> None:
    r = _generate(tiny_server, slo={"ttft_ms": 5000, "tpot_ms": 1000})
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    report = meta["slo"]
    assert report["spec"] == {"class": "latency", "weight": 1.0, "ttft_ms": 5000.0, "tpot_ms": 1000.0}
    assert report["output_tokens"] == meta["completion_tokens"] == 6
    assert 0 < report["ttft_ms"] <= report["e2e_ms"]
    assert report["attained"] == {"ttft": True, "tpot": True, "deadline": None, "overall": True}
    assert report["worst_token_lateness_ms"] < 0
    assert "slo_token_ts" not in meta  # raw stamps are consumed, not leaked


def test_unmeetable_slo_is_reported_missed(tiny_server: ServerProcess) -> None:
    r = _generate(tiny_server, slo={"deadline_ms": 0.001}, sampling_params={"max_new_tokens": 4})
    report = r.json()["meta_info"]["slo"]
    assert report["spec"]["class"] == "deadline"
    assert report["attained"]["deadline"] is False and report["attained"]["overall"] is False


def test_request_without_slo_is_best_effort(tiny_server: ServerProcess) -> None:
    report = _generate(tiny_server).json()["meta_info"]["slo"]
    assert report["spec"]["class"] == "best_effort"
    assert report["attained"]["overall"] is True


def test_native_streaming_final_chunk_carries_the_report(tiny_server: ServerProcess) -> None:
    body = {
        "text": "hello",
        "sampling_params": {"max_new_tokens": 5, "temperature": 0},
        "stream": True,
        "slo": {"ttft_ms": 4000},
    }
    chunks = []
    with requests.post(tiny_server.url + "/generate", json=body, stream=True, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert len(chunks) >= 2
    assert "slo" not in chunks[0]["meta_info"]
    final = chunks[-1]["meta_info"]
    assert final["finish_reason"] is not None
    assert final["slo"]["output_tokens"] == 5 and final["slo"]["attained"]["ttft"] is True


def _chat(server: ServerProcess, **kwargs: Any) -> Any:
    """One "hello" chat through the OpenAI client; `kwargs` are the request's other fields."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}], **kwargs)


def test_openai_chat_with_slo_body_and_headers(tiny_server: ServerProcess) -> None:
    resp = _chat(
        tiny_server,
        max_tokens=5,
        temperature=0,
        extra_body={"slo": {"tpot_ms": 800}},
        extra_headers={"x-slo-ttft-ms": "3000"},
    )
    report = resp.model_extra["slo"]
    assert report["spec"]["ttft_ms"] == 3000.0 and report["spec"]["tpot_ms"] == 800.0
    assert report["spec"]["class"] == "latency"
    assert report["output_tokens"] == resp.usage.completion_tokens


def test_openai_streaming_chat_reports_on_the_finishing_chunk(tiny_server: ServerProcess) -> None:
    stream = _chat(tiny_server, max_tokens=4, stream=True, extra_body={"slo": {"deadline_ms": 20000}})
    reports = [c.model_extra.get("slo") for c in stream]
    assert reports[-1] is None or reports[-1]["spec"]["class"] == "deadline"
    carried = [r for r in reports if r is not None]
    assert len(carried) == 1 and carried[0]["attained"]["deadline"] is True


def test_openai_completions_route(tiny_server: ServerProcess) -> None:
    r = requests.post(
        tiny_server.url + "/v1/completions",
        json={"model": "tiny", "prompt": "one two", "max_tokens": 3, "slo": {"deadline_ms": 9000, "weight": 2}},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["slo"]["spec"] == {"class": "deadline", "weight": 2.0, "deadline_ms": 9000.0}


def _fork_join_program(fork_reports: list[dict]) -> Any:
    """An SGLang frontend program: a prompt, two forks, their join, then an answer (what the
    frontend sends as one compound program); each fork's SLO report goes into `fork_reports`."""
    import sglang as sgl

    @sgl.function
    def fork_join(s, question):  # noqa: ANN001
        s += question
        forks = s.fork(2)
        for f in forks:
            f += sgl.gen("part", max_tokens=3, temperature=0)
        forks.join()
        fork_reports.extend(f.get_meta_info("part")["slo"] for f in forks)
        s += sgl.gen("answer", max_tokens=4, temperature=0)

    return fork_join


def test_frontend_program_carries_its_slo(tiny_server: ServerProcess) -> None:
    from server.frontend import SloRuntimeEndpoint

    two_answers = _fork_join_program([])
    backend = SloRuntimeEndpoint(tiny_server.url, slo={"deadline_ms": 30000, "program_id": "prog-1"})
    state = two_answers.run(question="why is the sky blue", backend=backend)
    report = state.get_meta_info("answer")["slo"]
    assert report["spec"]["class"] == "compound" and report["spec"]["program_id"] == "prog-1"
    status = requests.get(tiny_server.url + "/slo/status", timeout=10).json()
    assert status["attainment"]["compound"]["total"] >= 3  # two forks + the join call

    other = backend.with_slo({"ttft_ms": 2500})
    state = two_answers.run(question="hi", backend=other)
    assert state.get_meta_info("answer")["slo"]["spec"]["ttft_ms"] == 2500.0


def test_frontend_program_runs_become_one_compound_program_each(tiny_server: ServerProcess) -> None:
    from server.frontend import SloRuntimeEndpoint

    fork_reports: list[dict] = []
    fan_out = _fork_join_program(fork_reports)
    backend = SloRuntimeEndpoint(tiny_server.url, slo={"deadline_ms": 30000})
    first = fan_out.run(question="rivers", backend=backend).get_meta_info("answer")["slo"]["spec"]
    second = fan_out.run(question="lakes", backend=backend).get_meta_info("answer")["slo"]["spec"]
    assert first["class"] == second["class"] == "compound"
    assert first["program_id"] != second["program_id"]
    assert {r["spec"]["program_id"] for r in fork_reports[:2]} == {first["program_id"]}
    assert {r["spec"]["program_id"] for r in fork_reports[2:]} == {second["program_id"]}


def test_status_and_metrics_count_outcomes(tiny_server: ServerProcess) -> None:
    before = requests.get(tiny_server.url + "/slo/status", timeout=10).json()
    latency_before = before["attainment"].get("latency", {}).get("total", 0)
    for _ in range(2):
        assert _generate(tiny_server, slo={"ttft_ms": 5000}).status_code == 200
    # The scheduler publishes its part periodically: wait for a snapshot taken after the answers.
    status = tiny_server.status_when(lambda s: s["queue"]["waiting"] == 0, timeout=30)
    assert status["policy"] == "edf"
    assert status["attainment"]["latency"]["total"] == latency_before + 2
    assert status["queue"]["waiting"] == 0
    assert status["engine"]["plan_errors"] == 0
    # Every request reached the scheduler after the edge stamped it, and the status says how late
    # (the engine's part is published every few hundred ms: wait for one that counts both).
    intake = tiny_server.status_when(
        lambda s: (s["engine"].get("intake_lag") or {}).get("requests", 0) >= 2, timeout=30
    )
    intake = intake["engine"]["intake_lag"]
    assert intake["requests"] >= 2 and 0.0 <= intake["p50_ms"] <= intake["max_ms"], intake
    metrics = requests.get(tiny_server.url + "/metrics", timeout=10).text
    line = next(
        ln
        for ln in metrics.splitlines()
        if ln.startswith('sglang_slo_requests_total{result="attained",slo_class="latency"}')
    )
    assert float(line.split()[-1]) >= latency_before + 2
    assert "sglang_slo_goodput_tokens_total" in metrics


BAD_SLOS = [
    ({"ttft_ms": -5}, "slo.ttft_ms"),
    ({"tpot_ms": "fast", "ttft_ms": 100}, "slo.tpot_ms"),
    ({"ttft_ms": True}, "slo.ttft_ms"),
    ({"ttft_ms": 100, "colour": "red"}, "slo.colour"),
    ({"class": "urgent", "deadline_ms": 100}, "slo.class"),
    ({"class": "deadline"}, "slo.deadline_ms"),
    ({"class": "compound", "deadline_ms": 1000}, "slo.program_id"),
    ({"class": "best_effort", "ttft_ms": 100}, "slo.ttft_ms"),
    ({"ttft_ms": 500, "deadline_ms": 100}, "slo.deadline_ms"),
    ({"stage": 1, "deadline_ms": 100}, "slo.stage"),
    ({"weight": 0, "deadline_ms": 100}, "slo.weight"),
    ({"max_queue_ms": "soon"}, "slo.max_queue_ms"),
    ({"tpot_ms": 50}, "slo.ttft_ms"),
    ([1, 2], "slo"),
]


@pytest.mark.parametrize(("slo", "field"), BAD_SLOS, ids=[f for _, f in BAD_SLOS])
def test_bad_slo_is_a_400_naming_the_field(tiny_server: ServerProcess, slo: object, field: str) -> None:
    r = _generate(tiny_server, slo=slo)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
    assert field in r.json()["error"]["message"]
    assert _generate(tiny_server, slo={"ttft_ms": 5000}).status_code == 200  # others unaffected


def test_bad_header_and_openai_body_are_400s(tiny_server: ServerProcess) -> None:
    r = requests.post(
        tiny_server.url + "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers={"x-slo-ttft-ms": "soon"},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-slo-ttft-ms"
    r = requests.post(
        tiny_server.url + "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "slo": {"deadline_ms": -1}},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "slo.deadline_ms"
    r = _generate(tiny_server, sampling_params={"max_new_tokens": 2, "custom_params": {"slo": {"ttft_ms": 0}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.custom_params.slo.ttft_ms"
    assert requests.get(tiny_server.url + "/health", timeout=10).status_code == 200


def test_a_token_id_outside_the_vocabulary_is_a_400_not_a_crash(tiny_server: ServerProcess) -> None:
    for ids in ([5, 6, 100_000], [[5, 6], [7, -1]]):
        r = requests.post(
            tiny_server.url + "/generate",
            json={"input_ids": ids, "sampling_params": {"max_new_tokens": 2}},
            timeout=30,
        )
        assert r.status_code == 400, r.text
        assert "input_ids" in r.text
    r = requests.post(
        tiny_server.url + "/generate", json={"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}}, timeout=60
    )
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 2
