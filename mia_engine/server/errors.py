"""OpenAI-style error bodies, shared by every HTTP route.

Every route raises ``APIError`` (or a subclass) for bad input; the app turns it into
``{"error": {"message", "type", "param", "code"}}`` with the matching status, so a client of the
official ``openai`` package gets the exception class it expects (BadRequestError, NotFoundError, ...).
"""

from __future__ import annotations

import msgspec
from starlette.responses import Response


class ErrorDetail(msgspec.Struct, omit_defaults=False):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(msgspec.Struct):
    error: ErrorDetail


class APIError(Exception):
    """An error the client caused or must know about; never a 500."""

    status = 400
    type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    def to_response(self) -> Response:
        body = ErrorBody(ErrorDetail(self.message, self.type, self.param, self.code))
        return Response(msgspec.json.encode(body), status_code=self.status, media_type="application/json",
                        headers=self.headers)


class BadRequest(APIError):
    status = 400


class Unauthorized(APIError):
    status = 401
    type = "authentication_error"


class Forbidden(APIError):
    status = 403
    type = "permission_error"


class NotFound(APIError):
    status = 404
    type = "not_found_error"


class Conflict(APIError):
    status = 409
    type = "conflict_error"


class PayloadTooLarge(APIError):
    status = 413


class UnsupportedMediaType(APIError):
    status = 415


class TooManyRequests(APIError):
    """Admission control: the bound is reached; the client should retry after ``Retry-After`` seconds."""

    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: int, param: str | None = None) -> None:
        super().__init__(message, param=param, code="too_many_requests",
                         headers={"Retry-After": str(retry_after_s)})


class Unavailable(APIError):
    status = 503
    type = "service_unavailable"
