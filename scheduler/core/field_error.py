"""The one shape of every refusal that names a field: the edges answer it with the field in the
error body (400 for a bad value, 403 for an SLO the key may not ask for)."""

from __future__ import annotations


class FieldError(ValueError):
    """A value refused; `field` names it (e.g. `slo.ttft_ms`, `sampling_params.top_k`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
