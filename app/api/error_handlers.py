"""The one place where anything raised while serving a request becomes the contract's error body
(or, at an address of the console, its error page: `install_error_handlers`' `error_pages`)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

import asyncpg
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.responses import error_response
from app.api.schemas import MAX_IDENTIFIER_BYTES
from app.coordinator.health import CONNECTION_ERRORS, unavailable
from app.errors import BrokerError, ErrorCode, invalid_request

# Another door under the same app (the console's HTML pages) may answer an error its own way: given
# the request and the error, it returns its response, or None for the contract's JSON body.
ErrorPages = Callable[[Request, BrokerError], Response | None]

log = logging.getLogger("txbroker.api")


def _field_path(location: tuple) -> str:
    parts = [str(part) for part in location if part != "body"]
    path = ""
    for part in parts:
        path += f"[{part}]" if part.isdigit() else (f".{part}" if path else part)
    return path or "body"


def describe_validation_errors(errors: list[dict]) -> str:
    """'partitions[0].offset: Input should be greater than or equal to 0 (received -5); ...'"""
    described = []
    for error in errors[:5]:
        if error["type"] == "json_invalid":
            described.append(f"the body is not valid JSON ({error.get('ctx', {}).get('error', error['msg'])})")
            continue
        received = error.get("input")
        text = f"{_field_path(error['loc'])}: {error['msg']}"
        if error["type"] != "missing" and not isinstance(received, (dict, list)):
            text += f" (received {received!r:.80})"
        described.append(text)
    more = f"; and {len(errors) - 5} more" if len(errors) > 5 else ""
    return "; ".join(described) + more + ". See /docs for the request's schema."


def _is_unstorable_text(error: Exception) -> bool:
    """PostgreSQL text cannot hold NUL, and a lone surrogate has no UTF-8 encoding: asyncpg reports
    these as the errors below. Anything else of these classes is a bug, not bad input."""
    if isinstance(
        error, (asyncpg.exceptions.CharacterNotInRepertoireError, asyncpg.exceptions.UntranslatableCharacterError)
    ):
        return True
    return isinstance(error, asyncpg.exceptions.DataError) and "surrogate" in str(error)


def _is_bad_query_argument(error: Exception) -> bool:
    """asyncpg's own check of a query argument (e.g. a number out of a column's range), made before
    anything reaches PostgreSQL."""
    return isinstance(error, asyncpg.exceptions.DataError) and str(error).startswith("invalid input for query argument")


def install_error_handlers(app: FastAPI, error_pages: ErrorPages | None = None) -> None:
    def respond(request: Request, error: BrokerError) -> Response:
        page = error_pages(request, error) if error_pages is not None else None
        return page if page is not None else error_response(error)

    @app.exception_handler(BrokerError)
    async def broker_error(request: Request, error: BrokerError):
        return respond(request, error)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError):
        return respond(request, invalid_request(describe_validation_errors(list(error.errors()))))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        if error.status_code == 405:
            return respond(
                request,
                BrokerError(
                    ErrorCode.METHOD_NOT_ALLOWED,
                    f"{request.method} is not allowed on {request.url.path}: see /docs for the methods of each route",
                ),
            )
        if error.status_code == 404:
            return respond(
                request,
                BrokerError(
                    ErrorCode.NOT_FOUND, f"no route {request.method} {request.url.path}: see /docs for the API"
                ),
            )
        if error.status_code == 400:  # a body FastAPI could not parse: say why
            cause = error.__cause__
            if isinstance(cause, BrokerError):
                return respond(request, cause)
            reason = f" ({type(cause).__name__}: {str(cause)[:200]})" if cause is not None else ""
            return respond(
                request,
                invalid_request(
                    f"the body could not be parsed as JSON{reason}: send a UTF-8 JSON object, "
                    'as section "Conventions" of the txbroker HTTP API reference describes'
                ),
            )
        return respond(request, BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, str(error.detail)))

    async def database_unavailable(request: Request, error: Exception):
        log.warning("PostgreSQL unavailable: %s", error)
        return respond(request, unavailable(error))

    async def beyond_postgres_limits(request: Request, error: Exception):
        # The last line of defence behind the schemas' limits (MAX_IDENTIFIER_BYTES, integer
        # bounds): a value PostgreSQL cannot index (program limit, e.g. an index row over ~2.7 kB)
        # or accept as a parameter is the request's fault, and nothing was changed (the statement
        # failed, so its PostgreSQL transaction rolled back).
        return respond(
            request,
            invalid_request(
                f"a value in the request is beyond what the server can store ({str(error)[:300]}): identifiers are at "
                f"most {MAX_IDENTIFIER_BYTES} bytes in UTF-8, numbers 64-bit integers (partitions 32-bit)"
            ),
        )

    async def unstorable_text(request: Request, error: Exception):
        if _is_bad_query_argument(error):
            return await beyond_postgres_limits(request, error)
        if not _is_unstorable_text(error):
            raise error
        return respond(
            request,
            invalid_request(
                "a text field (an id, a name or metadata) contains a character that cannot be stored: the NUL "
                "character or a lone UTF-16 surrogate; remove it"
            ),
        )

    async def number_out_of_range(request: Request, error: OverflowError):
        # Values reach PostgreSQL as 64-bit integers; a bound the schema missed must not be a 500.
        return respond(
            request,
            invalid_request(
                f"a number in the request is outside the range PostgreSQL stores ({error}): "
                f"offsets, ids and times are 64-bit integers"
            ),
        )

    app.add_exception_handler(asyncpg.exceptions.ProgramLimitExceededError, beyond_postgres_limits)
    app.add_exception_handler(asyncpg.exceptions.InvalidParameterValueError, beyond_postgres_limits)
    app.add_exception_handler(OverflowError, number_out_of_range)
    app.add_exception_handler(asyncpg.exceptions.CharacterNotInRepertoireError, unstorable_text)
    app.add_exception_handler(asyncpg.exceptions.UntranslatableCharacterError, unstorable_text)
    app.add_exception_handler(asyncpg.exceptions.DataError, unstorable_text)

    for connection_error in CONNECTION_ERRORS:
        app.add_exception_handler(connection_error, database_unavailable)


class UnexpectedErrors:
    """Pure ASGI middleware: an exception no handler above knew is a bug. It is logged with a
    request id and answered UNKNOWN_SERVER_ERROR, and not re-raised (Starlette's own last-resort
    handler would re-raise, and the server would then drop the client's keep-alive connection)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracking_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as error:
            request_id = uuid.uuid4().hex[:16]
            log.error(
                "request %s %s failed with a bug (request id %s)",
                scope["method"],
                scope["path"],
                request_id,
                exc_info=error,
            )
            if started:
                raise
            response = error_response(
                BrokerError(
                    ErrorCode.UNKNOWN_SERVER_ERROR,
                    f"the server failed with a bug (request id {request_id}, in its log); the request may be "
                    f"retried, and please report it",
                )
            )
            await response(scope, receive, send)
