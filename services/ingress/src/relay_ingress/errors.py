"""The API's error shape: `{"error": CODE, "detail": text}` for every failure (API.md, Errors).

Invariant: every response with status >= 400, including framework ones (unknown route, bad
method, validation), carries one of the API's codes; nothing answers with another shape.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from relay_bus.bus import BusUnavailableError

CODES_BY_STATUS = {
    400: "BAD_REQUEST",
    401: "AUTH",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    413: "TOO_LARGE",
    431: "TOO_LARGE",
    429: "QUOTA",
    503: "UNAVAILABLE",
    504: "INDETERMINATE",
}


class ErrorBody(BaseModel):
    error: str
    """One of the API's codes (see `CODES_BY_STATUS`, and RATE_LIMITED on the WebSocket)."""
    detail: str


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the error statuses a router's endpoints may answer."""
    return {
        status: {"model": ErrorBody, "description": CODES_BY_STATUS[status]} for status in statuses
    }


class ApiError(Exception):
    """Raised by handlers; rendered as the API's error object."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


def error_response(status: int, code: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status)


def rendered(error: ApiError | BusUnavailableError) -> JSONResponse:
    """A handler's refusal, or the bus's unavailability, as the API's error."""
    if isinstance(error, BusUnavailableError):
        return error_response(503, "UNAVAILABLE", "Kafka is not answering; retry later")
    return error_response(error.status, error.code, error.detail)


def install(app: FastAPI) -> None:
    async def raised(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError | BusUnavailableError)
        return rendered(exc)

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = CODES_BY_STATUS.get(
            exc.status_code, "BAD_REQUEST" if exc.status_code < 500 else "UNAVAILABLE"
        )
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        return error_response(exc.status_code, code, detail)

    async def validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(part) for part in first.get("loc", ()))
        return error_response(400, "BAD_REQUEST", f"{where}: {first.get('msg')}")

    app.add_exception_handler(ApiError, raised)
    app.add_exception_handler(BusUnavailableError, raised)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
