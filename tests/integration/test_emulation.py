"""The emulated GPU on the real server (tiny model, CPU): steps paced to the profile, the card's
KV capacity, requests ending at their hidden true length, and distortion reported when the
host cannot keep up. Bounds here are generous; benchmarks/emulation.py holds the real targets.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from benchmarks.emulation_shapes import Cell, drain, shape_load, shared_context
from scheduler.core.perf_model import load_perf_model, load_profile, profile_path
from server.emulation import resolve
from server.process import ServerProcess
from wire import ORACLE_HINT_PARAM

pytestmark = pytest.mark.paced  # asserts the engine's pace: runs alone (tests/conftest.py)

PROMPT = [5 + i % 500 for i in range(200)]  # ids inside the tiny model's 512-token vocabulary


def _generate(server: ServerProcess, hidden_len: int, cap: int = 300) -> tuple[dict, float]:
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": cap, "custom_params": {ORACLE_HINT_PARAM: hidden_len}},
    }
    started = time.perf_counter()
    r = requests.post(server.url + "/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"], time.perf_counter() - started


def _predicted_s(profile: Path, prompt: int, output: int) -> float:
    """Prefill, then one decode step per further token, as the profile times them."""
    model = load_perf_model(profile, kind="table")
    return model.step_time(prompt, 0, prompt) + sum(model.step_time(0, 1, prompt + i) for i in range(1, output))


def test_an_emulated_h100_keeps_the_profiles_time_and_the_cards_memory() -> None:
    with ServerProcess("--emulate-gpu", "h100", "--slo-policy", "edf", name="emu-h100") as server:
        _generate(server, 4)  # warm-up
        meta, elapsed = _generate(server, 60)
        assert meta["completion_tokens"] == 60  # the hidden true length ended it, not the cap of 300
        predicted = _predicted_s(profile_path("h100"), len(PROMPT), 60)
        # Never faster than the card (pacing accuracy is benchmarks/emulation.py's, not a timed test's).
        assert 0.9 * predicted <= elapsed, (elapsed, predicted)

        with ThreadPoolExecutor(4) as pool:
            metas = [m for m, _ in pool.map(lambda n: _generate(server, n), (10, 20, 30, 40))]
        assert [m["completion_tokens"] for m in metas] == [10, 20, 30, 40]

        emulation = server.status_when(
            lambda s: (s["engine"].get("emulation") or {}).get("steps", 0) >= 100, timeout=30
        )
        emulation = emulation["engine"]["emulation"]
        assert emulation["gpu_model"] == "h100/llama3-8b"
        assert emulation["kv_token_capacity"] == resolve("h100").kv_token_capacity
        assert emulation["steps"] >= 100 and emulation["median_abs_error"] <= 0.25, emulation
        assert emulation["unpaced_steps"] == 0, emulation  # every batch shape (prefills too) was paced


def test_a_profile_faster_than_the_host_is_reported_as_distortion(tmp_path: Path) -> None:
    profile = load_profile(profile_path("a40"))
    profile["table"]["time_s"] = [[t * 1e-4 for t in row] for row in profile["table"]["time_s"]]
    profile["kv_token_capacity"] = 50_000
    path = tmp_path / "impossible-gpu.json"
    path.write_text(json.dumps(profile))
    with ServerProcess("--emulate-gpu", str(path), "--slo-policy", "fcfs", name="emu-fast") as server:
        for _ in range(3):
            meta, _ = _generate(server, 50)
            assert meta["completion_tokens"] == 50
        status = server.status_when(lambda s: (s["engine"].get("emulation") or {}).get("steps", 0) >= 150, timeout=30)
        emulation = status["engine"]["emulation"]
        assert emulation["kv_token_capacity"] == 50_000
        assert emulation["late_share"] > 0.5 and emulation["mean_overrun_ms"] > 0, emulation
        deadline = time.monotonic() + 20
        while "emulation of a40/llama3-8b distorted" not in server.log_path.read_text(errors="replace"):
            assert time.monotonic() < deadline, "no distortion warning in the log"
            time.sleep(0.5)


SHAPE_SLOWDOWN = "20"  # generous: the stand-in's host work per step is a few ms, a decode step here 170 ms
SHAPE_RUNNING, SHAPE_CHUNK, SHAPE_CONTEXT = 64, 2048, 3072


def _shape_server(batching: str) -> ServerProcess:
    flags = ["--emulate-gpu", "h100", "--emulate-slowdown", SHAPE_SLOWDOWN, "--slo-policy", "fcfs"]
    flags += ["--chunked-prefill-size", str(SHAPE_CHUNK), "--max-running-requests", str(SHAPE_RUNNING + 8)]
    return ServerProcess(*flags, *(["--enable-mixed-chunk"] if batching == "mixed" else []), name=f"emu-{batching}")


async def _loads(servers: dict[str, ServerProcess], contexts: dict[str, list[int]]) -> None:
    await asyncio.gather(
        *(
            shape_load(s.url, Cell("h100", batching, SHAPE_CHUNK, SHAPE_RUNNING), contexts[batching], 15.0, 2048, 0)
            for batching, s in servers.items()
        )
    )


def test_mixed_and_separate_steps_keep_the_cards_pace_with_many_running_requests() -> None:
    """The emulator's on-time guarantee. A prefill chunk next to 64 decodes of 3k-token contexts
    made the tiny model's mixed steps overrun the card many times over (the torch_native extend
    path's attention is quadratic in each decode's context); emulated steps now skip the layers."""
    servers = {batching: _shape_server(batching) for batching in ("mixed", "separate")}
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: s.start(), servers.values()))
        contexts = {batching: shared_context(s.url, SHAPE_CONTEXT, seed=0) for batching, s in servers.items()}
        logprobs = {  # a logprob request takes SGLang's own logprob path through the stand-in (never mixed)
            "input_ids": contexts["mixed"][:40],
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": 2,
            "sampling_params": {"max_new_tokens": 5, "ignore_eos": True},
        }
        meta = requests.post(servers["mixed"].url + "/generate", json=logprobs, timeout=120).json()["meta_info"]
        assert len(meta["output_token_logprobs"]) == 5 and len(meta["output_top_logprobs"][0]) == 2
        assert len(meta["input_token_logprobs"]) == 40
        asyncio.run(_loads(servers, contexts))
        for batching, server in servers.items():
            drain(server.url)
            emulation = requests.get(server.url + "/slo/status", timeout=5).json()["engine"]["emulation"]
            assert emulation["stand_in_forward"] is True, emulation
            assert emulation["steps"] >= 12 and emulation["unpaced_steps"] == 0, (batching, emulation)
            assert emulation["late_share"] <= 0.1, (batching, emulation)  # one hiccup among few long steps
    finally:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: s.stop(), servers.values()))
