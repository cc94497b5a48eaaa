"""SLOs for SGLang frontend programs (`sgl.function` + `RuntimeEndpoint`).

SGLang's frontend sends no extra request fields, so this backend adds the SLO to each call's
`sampling_params.custom_params`, which the server reads like a top-level `slo` object:

    backend = SloRuntimeEndpoint("http://127.0.0.1:30000", slo={"deadline_ms": 20000})
    my_program.run(question="...", backend=backend)
    my_program.run(question="...", backend=backend.with_slo({"ttft_ms": 500, "tpot_ms": 100}))
"""

from __future__ import annotations

import copy
import dataclasses
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


class SloRuntimeEndpoint(RuntimeEndpoint):
    def __init__(self, *args: Any, slo: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if slo is not None:
            parse_slo(slo)  # fail here, not on the server, for a malformed SLO
        self.slo = slo
        super().__init__(*args, **kwargs)

    def with_slo(self, slo: dict[str, Any] | None) -> SloRuntimeEndpoint:
        """The same endpoint with another SLO (no new connection or model-info request)."""
        if slo is not None:
            parse_slo(slo)
        clone = copy.copy(self)
        clone.slo = slo
        return clone

    def _with_slo(self, params: SglSamplingParams) -> SglSamplingParams:
        fields = {f.name: getattr(params, f.name) for f in dataclasses.fields(SglSamplingParams)}
        return _SloSamplingParams(**fields, slo=self.slo)

    def generate(self, s: Any, sampling_params: SglSamplingParams) -> Any:
        return super().generate(s, self._with_slo(sampling_params))

    def generate_stream(self, s: Any, sampling_params: SglSamplingParams) -> Any:
        return super().generate_stream(s, self._with_slo(sampling_params))

    def _generate_http_request(self, s: Any, data: dict[str, Any]) -> Any:
        if self.slo is not None and "slo" not in data:
            data = {**data, "slo": self.slo}
        return super()._generate_http_request(s, data)
