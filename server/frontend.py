"""SLOs for SGLang frontend programs (`sgl.function` + `RuntimeEndpoint`).

SGLang's frontend sends no extra request fields, so this backend adds the SLO to each call's
`sampling_params.custom_params`, which the server reads like a top-level `slo` object. When the
SLO has a deadline and names no program, every run of a program (its forks and joins included)
automatically becomes one compound program with a fresh `program_id`, so its deadline covers
the whole run:

    backend = SloRuntimeEndpoint("http://127.0.0.1:30000", slo={"deadline_ms": 20000})
    my_program.run(question="...", backend=backend)
    my_program.run(question="...", backend=backend.with_slo({"ttft_ms": 500, "tpot_ms": 100}))
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import os
import threading
from collections import OrderedDict
from typing import Any

from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint
from sglang.lang.ir import SglSamplingParams

from scheduler.core.slo import parse_slo


@dataclasses.dataclass
class _SloSamplingParams(SglSamplingParams):
    slo: dict[str, Any] | None = None

    def to_srt_kwargs(self) -> dict[str, Any]:
        kwargs = super().to_srt_kwargs()
        if self.slo is not None:
            kwargs["custom_params"] = {"slo": self.slo}
        return kwargs


class _ProgramIds:
    """One id per program run. A run's forks share its `arguments` dict object; the map keeps
    that dict alive while it holds its id, so a recycled id() can never alias two runs."""

    def __init__(self, capacity: int = 4096) -> None:
        self._runs: OrderedDict[int, tuple[dict, str]] = OrderedDict()
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._capacity = capacity

    def of(self, arguments: dict) -> str:
        with self._lock:
            entry = self._runs.get(id(arguments))
            if entry is None or entry[0] is not arguments:
                entry = (arguments, f"sgl-{os.getpid()}-{next(self._counter)}")
                self._runs[id(arguments)] = entry
                while len(self._runs) > self._capacity:
                    self._runs.popitem(last=False)
            return entry[1]


def _wants_program(slo: dict[str, Any] | None) -> bool:
    return bool(slo) and "deadline_ms" in slo and "program_id" not in slo and slo.get("class") in (None, "compound")


class SloRuntimeEndpoint(RuntimeEndpoint):
    def __init__(self, *args: Any, slo: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if slo is not None:
            parse_slo(slo)  # fail here, not on the server, for a malformed SLO
        self.slo = slo
        self._programs = _ProgramIds()
        super().__init__(*args, **kwargs)

    def _slo_for(self, s: Any) -> dict[str, Any] | None:
        if not _wants_program(self.slo):
            return self.slo
        return {**self.slo, "class": "compound", "program_id": self._programs.of(s.arguments)}

    def with_slo(self, slo: dict[str, Any] | None) -> SloRuntimeEndpoint:
        """The same endpoint with another SLO (no new connection or model-info request)."""
        if slo is not None:
            parse_slo(slo)
        clone = copy.copy(self)
        clone.slo = slo
        clone._programs = _ProgramIds()
        return clone

    def _with_slo(self, s: Any, params: SglSamplingParams) -> SglSamplingParams:
        fields = {f.name: getattr(params, f.name) for f in dataclasses.fields(SglSamplingParams)}
        return _SloSamplingParams(**fields, slo=self._slo_for(s))

    def generate(self, s: Any, sampling_params: SglSamplingParams) -> Any:
        return super().generate(s, self._with_slo(s, sampling_params))

    def generate_stream(self, s: Any, sampling_params: SglSamplingParams) -> Any:
        return super().generate_stream(s, self._with_slo(s, sampling_params))

    def _generate_http_request(self, s: Any, data: dict[str, Any]) -> Any:
        if self.slo is not None and "slo" not in data:
            data = {**data, "slo": self._slo_for(s)}
        return super()._generate_http_request(s, data)
