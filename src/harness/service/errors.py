"""Errors the HTTP layer answers with: one JSON shape, `{"error": code, "detail": message}`.

Library errors are translated here, at the edge (SPEC U2): a caller's mistake is a clear 4xx, an
unknown id or another tenant's Run is a 404 (so ids do not leak), and nothing a caller sends is a 500.
A database that is down, drops connections or refuses writes is a 503 `database_unavailable` with
Retry-After; anything unexpected is a 500 in the same JSON shape (and logged with its traceback),
never the framework's plain-text page.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from harness.domain.errors import (
    BacklogFullError,
    BadInputError,
    CancelRefusedError,
    ConflictError,
    ForbiddenError,
    HarnessError,
    IdempotencyConflictError,
    InvalidTransitionError,
    RequestTooLargeError,
    UnknownRunError,
)
from harness.policy.hitl import UnknownRequestError
from harness.stores import DatabaseError, is_outage

log = logging.getLogger("harness.service")
#: seconds a client should wait before retrying when the database is unavailable
DATABASE_RETRY_AFTER_S = 5


class ApiError(Exception):
    """An answer other than success, with its HTTP status and a stable machine-readable code."""

    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers
        #: more fields of the error body (e.g. where an archived Run is)
        self.extra = extra or {}


def not_found(what: str, ident: str) -> ApiError:
    """The 404 for an id that is unknown or belongs to another tenant (the two look the same)."""
    return ApiError(404, "not_found", f"no {what} with id {ident!r}")


def _body(code: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {"error": code, "detail": detail, **extra}


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def install(app: FastAPI) -> None:
    """Register the handlers that give every failure the same JSON shape."""

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(_body(exc.code, exc.detail, **exc.extra), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))} for e in exc.errors()[:20]]
        return JSONResponse(
            _body("invalid_request", _validation_message(exc), errors=errors), status_code=422
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if (
            exc.status_code == 400
        ):  # a body the framework could not even parse: malformed input, like any other
            return JSONResponse(_body("invalid_request", str(exc.detail)), status_code=422)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(
            _body(code, str(exc.detail)), status_code=exc.status_code, headers=getattr(exc, "headers", None)
        )

    @app.exception_handler(UnknownRunError)
    async def _unknown_run(_request: Request, exc: UnknownRunError) -> JSONResponse:
        return JSONResponse(_body("not_found", str(exc)), status_code=404)

    @app.exception_handler(UnknownRequestError)
    async def _unknown_request(_request: Request, exc: UnknownRequestError) -> JSONResponse:
        return JSONResponse(_body("not_found", str(exc)), status_code=404)

    @app.exception_handler(RequestTooLargeError)
    async def _too_large(_request: Request, exc: RequestTooLargeError) -> JSONResponse:
        return JSONResponse(_body("request_too_large", str(exc)), status_code=413)

    @app.exception_handler(IdempotencyConflictError)
    async def _idempotency_conflict(_request: Request, exc: IdempotencyConflictError) -> JSONResponse:
        return JSONResponse(_body("idempotency_conflict", str(exc), run_id=exc.run_id), status_code=409)

    @app.exception_handler(BacklogFullError)
    async def _backlog_full(_request: Request, exc: BacklogFullError) -> JSONResponse:
        return JSONResponse(_body("backlog_full", str(exc), backlog=exc.backlog, bound=exc.bound,
                                  retry_after_s=exc.retry_after_s),
                            status_code=429, headers={"Retry-After": str(exc.retry_after_s)})

    @app.exception_handler(BadInputError)
    async def _bad_input(_request: Request, exc: BadInputError) -> JSONResponse:
        return JSONResponse(_body("invalid_request", str(exc)), status_code=422)

    @app.exception_handler(ForbiddenError)
    async def _forbidden(_request: Request, exc: ForbiddenError) -> JSONResponse:
        return JSONResponse(_body("forbidden", str(exc)), status_code=403)

    @app.exception_handler(ConflictError)
    async def _lost_race(_request: Request, exc: ConflictError) -> JSONResponse:
        extra = {"state": exc.state} if isinstance(exc, CancelRefusedError) else {}
        return JSONResponse(_body("conflict", str(exc), **extra), status_code=409)

    @app.exception_handler(InvalidTransitionError)
    async def _conflict(_request: Request, exc: InvalidTransitionError) -> JSONResponse:
        return JSONResponse(_body("conflict", str(exc)), status_code=409)

    @app.exception_handler(HarnessError)
    async def _harness(_request: Request, exc: HarnessError) -> JSONResponse:
        log.error("harness error", exc_info=exc)
        return JSONResponse(_body("unavailable", f"{type(exc).__name__}: {exc}"), status_code=503)

    @app.exception_handler(DatabaseError)
    async def _database(request: Request, exc: DatabaseError) -> JSONResponse:
        return database_error(request, exc)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette calls this from its outermost middleware and re-raises afterwards, so the server
        # still logs the traceback; the client gets the documented shape instead of plain text
        return JSONResponse(_body("internal_error", f"unexpected {type(exc).__name__}; the service logged it"),
                            status_code=500)


def database_error(request: Request | None, exc: BaseException) -> JSONResponse:
    """The answer to a database failure: 503 with Retry-After when the database is unavailable (it is
    down, dropped the connection, refuses connections or writes), else a logged 500."""
    where = f"{request.method} {request.url.path}" if request is not None else "request"
    if is_outage(exc):
        log.warning("database unavailable during %s: %s", where, _first_line(exc))
        return JSONResponse(_body("database_unavailable", f"the database is unavailable: {_first_line(exc)}"),
                            status_code=503, headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)})
    log.error("database error during %s", where, exc_info=exc)
    return JSONResponse(_body("internal_error", f"database error: {type(exc).__name__}; the service logged it"),
                        status_code=500)


def _first_line(exc: BaseException) -> str:
    """The driver's message without SQLAlchemy's statement dump and background link."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip().splitlines()
    return f"{type(orig or exc).__name__}: {text[0] if text else ''}"[:300]
