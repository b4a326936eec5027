"""OpenAI-style errors: the JSON body clients parse, and the HTTP status of each refusal.

Every refusal the gateway makes is an `ApiError`; the app turns it into
`{"error": {"message", "type", "param", "code"}}` with its HTTP status (and `Retry-After` for
429), the shape the official OpenAI clients raise typed exceptions from. A Meshnet `Status`
from the tracker or a hop maps by its code (`from_status`).
"""

from __future__ import annotations

from typing import Optional

from meshnet.wire.status import Status, StatusCode

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error",
          500: "server_error", 503: "service_unavailable", 504: "timeout"}

# Meshnet status code -> HTTP status (anything else is a 500: a failure the user cannot fix).
_HTTP = {
    StatusCode.INVALID_ARGUMENT: 400,
    StatusCode.NOT_FOUND: 404,
    StatusCode.PERMISSION_DENIED: 403,
    StatusCode.UNAUTHENTICATED: 401,
    StatusCode.RESOURCE_EXHAUSTED: 429,
    StatusCode.UNAVAILABLE: 503,
    StatusCode.DEADLINE_EXCEEDED: 504,
}

RETRY_AFTER_SECONDS = 1


class ApiError(Exception):
    def __init__(self, http_status: int, message: str, *, param: Optional[str] = None,
                 code: Optional[str] = None, retry_after: Optional[int] = None) -> None:
        super().__init__(message)
        self.http_status, self.message, self.param, self.code = http_status, message, param, code
        self.retry_after = retry_after if retry_after is not None or http_status != 429 else RETRY_AFTER_SECONDS

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.http_status, "server_error"),
                          "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}


def from_status(status: Status, *, model: str = "") -> ApiError:
    """The refusal for a failed Meshnet status (an unknown model is 404 naming it)."""
    http = _HTTP.get(status.code, 500)
    code = status.code.name.lower()
    if http == 404 and model:
        return ApiError(404, f"The model {model!r} does not exist: {status.message}", param="model",
                        code="model_not_found")
    return ApiError(http, status.message or status.code.name, code=code)


def bad_request(message: str, param: Optional[str] = None) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_request")
