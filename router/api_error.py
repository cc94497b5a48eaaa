"""The router's refusals: an HTTP status, the field at fault and, for what a client may retry,
the reason and when; one shape on every route, as the workers' SLO middleware answers."""

from __future__ import annotations

from typing import Any

from scheduler.core.shed_wire import Shed
from wire import RETRY_AFTER_HEADER, RETRY_AFTER_KEY, SHED_REASON_KEY


class ApiError(Exception):
    """A request the router refuses; `field` is the offending field (None: not one field's fault).
    A shed request (`shed`) answers with the shed's reason, Retry-After and predicted wait too;
    another refusal the client may retry (no worker, a worker failed, a timeout) with its
    `reason` and `retry_after_s`."""

    def __init__(
        self,
        status: int,
        message: str,
        field: str | None = None,
        kind: str | None = None,
        shed: Shed | None = None,
        reason: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.status = status
        self.message = message
        self.field = field
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")
        self.shed = shed
        self.reason = reason
        self.retry_after_s = retry_after_s

    @classmethod
    def from_shed(cls, shed: Shed, where: str = "") -> ApiError:
        return cls(shed.status, shed.message + where, kind=shed.body()["error"]["type"], shed=shed)

    def body(self) -> dict[str, Any]:
        """The JSON error shape of server.asgi_io.error_body (OpenAI-style)."""
        error = {
            "message": f"{self.field}: {self.message}" if self.field else self.message,
            "type": self.kind,
            "param": self.field,
            "code": self.status,
        }
        if self.shed is not None:
            error.update(self.shed.fields())
        elif self.reason is not None:
            error.update({SHED_REASON_KEY: self.reason, RETRY_AFTER_KEY: self.retry_after_s})
        return {"error": error}

    def headers(self) -> dict[str, str]:
        if self.shed is not None:
            return self.shed.headers()
        return {} if self.retry_after_s is None else {RETRY_AFTER_HEADER: str(self.retry_after_s)}


def bad(field: str, message: str) -> ApiError:
    return ApiError(400, message, field)
