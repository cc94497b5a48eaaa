"""Engine views shared by SLOs-Serve's tests."""

from __future__ import annotations

from scheduler.core.perf_model import linear_model
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import EngineView, RequestView


def chat_beside_a_deadline(deadline_ms: float) -> EngineView:
    """Ten chat decoders (50 ms TPOT) far ahead of their schedule, a running deadline request
    with 195 tokens left at 0.1 s, and a waiting chat prompt; 10 ms + 0.1 ms a token (PACED)."""
    chat = SloSpec(ttft_ms=500, tpot_ms=50, slo_class=SloClass.LATENCY)
    deadline = SloSpec(deadline_ms=deadline_ms, slo_class=SloClass.DEADLINE)
    running = [RequestView(f"c{i}", chat, 0.0, 100, generated=5, first_token_time=0.2) for i in range(10)]
    running.append(RequestView("dl", deadline, 0.0, 100, generated=5, predicted_output_len=200, first_token_time=0.2))
    return EngineView(0.1, [RequestView("w", chat, 0.09, 300)], running, 256, 8192, 10**6, 10**6)


PACED = linear_model(base_s=0.01, per_token_s=1e-4)
