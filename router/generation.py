"""One request's output as its client sees it, whatever route formats it: token ids, text (made
by the router's detokenizer), the time each token reached the router, the final meta_info and
the router-side SLO report, scored exactly once however the request ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from router.flight import StreamChunk
from router.monitoring import RouterReports
from router.service import GenerateCall
from router.tokenizer import IncrementalDetokenizer

# Worker meta_info keys the router replaces with its own view of the whole request.
ROUTER_META = (
    "id",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "e2e_latency",
    "slo",
    "workers",
    "prefill_workers",
)
WORKER_ONLY_META = ("response_sent_to_client_ts",)  # the worker's clock and client: meaningless here


class Generation:
    """Absorbs a request's StreamChunks; `finish_reason` and `report` are set once it has ended."""

    def __init__(
        self,
        call: GenerateCall,
        detok: IncrementalDetokenizer,
        reports: RouterReports,
        workers: Callable[[], tuple[str, ...]] = tuple,
        prefill_workers: Callable[[], tuple[str, ...]] = tuple,  # PD: the prefill halves
        wall: Callable[[], float] = time.time,
        on_finished: Callable[[GenerateCall, int], None] | None = None,
    ) -> None:
        self.call = call
        self.on_finished = on_finished  # learns output lengths (the router's history predictor)
        self.detok = detok
        self.reports = reports
        self.workers = workers
        self.prefill_workers = prefill_workers
        self.wall = wall
        self.output_ids: list[int] = []
        self.token_times: list[float] = []
        self.finish_reason: dict[str, Any] | None = None
        self.worker_meta: dict[str, Any] = {}
        self.report: dict[str, Any] | None = None
        self.end_unix: float | None = None

    @property
    def text(self) -> str:
        return self.detok.text

    @property
    def prompt_tokens(self) -> int:
        return len(self.call.input_ids)

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def ended(self) -> bool:
        return self.report is not None

    def absorb(self, chunk: StreamChunk) -> str:
        """Take a chunk; returns the text it adds (what a delta-streaming client is sent).

        Streaming requests are detokenized as they go; others once, at the end.
        """
        now = self.wall()
        if chunk.restart:  # the request starts over on another worker (never when streamed): drop its past
            self.output_ids.clear()
            self.token_times.clear()
            return ""
        ids = chunk.token_ids
        self.output_ids.extend(ids)
        self.token_times.extend([now] * len(ids))
        if chunk.finish_reason is None:
            return self.detok.push(ids) if self.call.stream else ""
        if not self.call.stream:  # decoded once at the end, so a stop string is trimmed wholly, as SGLang does
            ids = tuple(self.output_ids)
        reason = self._finish_reason(chunk)
        matched = reason.get("matched")
        no_trim = bool(self.call.sampling_params.get("no_stop_trim"))
        text_ids = ids
        if isinstance(matched, int) and not isinstance(matched, bool) and not no_trim and ids and ids[-1] == matched:
            text_ids = ids[:-1]  # SGLang leaves a matched stop token out of the text (not out of output_ids)
        delta = self.detok.finish(text_ids, matched if isinstance(matched, str) else None, no_trim)
        self.finish_reason = reason
        self.worker_meta = dict(chunk.meta or {})
        worker_slo = self.worker_meta.get("slo")
        tier = worker_slo.get("tier") if isinstance(worker_slo, dict) else None
        finished = reason.get("type") != "abort"
        self._score(finished=finished, tier=tier, now=now)
        if finished and self.on_finished is not None:
            self.on_finished(self.call, self.completion_tokens)
        return delta

    def fail(self) -> None:
        """The request ended without finishing (error, client gone, shutdown): score it as dropped."""
        if not self.ended:
            self._score(finished=False, tier=None, now=self.wall())

    def _score(self, finished: bool, tier: str | None, now: float) -> None:
        self.end_unix = now
        call = self.call
        report = self.reports.finish(
            call.rid, call.slo, call.arrival_unix, self.token_times, finished=finished, tier=tier, now=now
        )
        if call.slo_clamped:  # the key's limits changed the SLO: the client sees what it asked and got
            report = {**report, "clamped": call.slo_clamped}
        self.report = report

    def _finish_reason(self, chunk: StreamChunk) -> dict[str, Any]:
        """The worker's SGLang finish_reason, corrected for the whole request; a bare type otherwise."""
        kind = chunk.finish_reason
        meta_reason = (chunk.meta or {}).get("finish_reason")
        reason = (
            dict(meta_reason) if isinstance(meta_reason, dict) and meta_reason.get("type") == kind else {"type": kind}
        )
        if kind == "length":  # a resumed worker only knew its share of max_new_tokens
            cap = self.call.max_new_tokens
            reason["length"] = cap if cap is not None else self.completion_tokens
        return reason

    def meta_info(self) -> dict[str, Any]:
        """SGLang's meta_info: the basic counts while streaming, everything once ended."""
        base = {
            "id": self.call.rid,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }
        if self.finish_reason is None:
            return base
        worker = {k: v for k, v in self.worker_meta.items() if k not in ROUTER_META and k not in WORKER_ONLY_META}
        meta = {"cached_tokens": 0, **worker, **base}
        end = self.end_unix if self.end_unix is not None else self.wall()
        meta["e2e_latency"] = max(0.0, end - self.call.arrival_unix)
        meta["slo"] = self.report
        meta["workers"] = list(self.workers())
        if prefill := self.prefill_workers():
            meta["prefill_workers"] = list(prefill)
        if "slo" in self.worker_meta:
            meta["worker_slo"] = self.worker_meta["slo"]  # the last worker's view of its part
        return meta
