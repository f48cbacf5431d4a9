"""Domain errors raised by services, and the one place that maps them to HTTP status codes."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


class DomainError(Exception):
    status_code = 400

    def __init__(self, message: str, *, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.headers = headers


class NotAuthenticated(DomainError):
    status_code = 401


class Forbidden(DomainError):
    status_code = 403


class NotFound(DomainError):
    status_code = 404


class Conflict(DomainError):
    status_code = 409


class PayloadTooLarge(DomainError):
    status_code = 413


class InvalidInput(DomainError):
    status_code = 422


class UnsupportedMediaType(DomainError):
    status_code = 415


class Overloaded(DomainError):
    status_code = 503

    def __init__(self, message: str, *, retry_after_s: int = 1):
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class TooManyRequests(DomainError):
    status_code = 429

    def __init__(self, message: str, *, retry_after_s: int = 1):
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def _domain(_: Request, exc: DomainError) -> JSONResponse:
        headers = dict(exc.headers or {})
        if isinstance(exc, NotAuthenticated):
            headers.setdefault("WWW-Authenticate", "Bearer")
        return JSONResponse({"detail": exc.message}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        # Pydantic's error list, made JSON-safe (it can carry the offending float('nan') itself).
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")} for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)
