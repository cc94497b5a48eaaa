"""The embedded default model (SmolLM2-135M-Instruct, converted from the PyPI GGUF) answers
sensibly through the SLO server."""

from __future__ import annotations

import openai

from server.process import ServerProcess


def test_default_model_answers_with_an_slo_report(default_server: ServerProcess) -> None:
    server = default_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    resp = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=20,
        temperature=0,
        extra_body={"slo": {"ttft_ms": 30000, "tpot_ms": 5000}},
    )
    assert "Paris" in resp.choices[0].message.content
    report = resp.model_extra["slo"]
    assert report["attained"]["overall"] is True
    print(f"SmolLM2 server start-up: {server.startup_s:.1f} s")
