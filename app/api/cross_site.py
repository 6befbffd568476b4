"""Browsers' cross-site writes, refused on every route (the API's and the console's).

A page of any site can make the browser of whoever visits it send a POST to this server (a form, or
a fetch without CORS), and the server cannot tell it from the visitor's own: with `auth` off (the
loopback default) nothing else stops it, so any page the operator opened could abort transactions,
create topics or produce records through the API; with `auth` required the console's cookie is
SameSite=Strict and the API's key a header no other site can set, and this is a second fence.
Browsers name the page a write comes from in Origin; programs (curl, the SDK, Kafka's tools through
the Kafka door) send none, and the console's own pages are of this server.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import Request

from app.api.responses import error_response
from app.errors import BrokerError, ErrorCode

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The console refuses them with its error page (the console router's dependency, `refuse_cross_site_writes`).
CONSOLE_PREFIX = "/console"


def _cross_site(origin: str | None, host: str) -> bool:
    """Whether a request with this Origin comes from a page of another site (Origin names another
    host than Host, or is "null": a sandboxed or privacy-stripped page). No Origin: not a browser's
    write from another site (those always carry it)."""
    if origin is None:
        return False
    return origin == "null" or urlsplit(origin).netloc != host


def _refusal(method: str, path: str, origin: str, host: str) -> BrokerError:
    return BrokerError(
        ErrorCode.INVALID_REQUEST,
        f"this {method} {path[:200]} came from a page of another site (Origin {origin[:200]!r}, this server is "
        f"{host[:200]!r}) and was refused: use the console's own pages, or call the API from a program (which "
        f"sends no Origin)",
    )


async def refuse_cross_site_writes(request: Request) -> None:
    """The console router's dependency: a write (any method but GET, HEAD, OPTIONS) from another site
    is refused before its page runs (the console's error handler renders it as a page)."""
    origin, host = request.headers.get("origin"), request.headers.get("host", "")
    if request.method not in SAFE_METHODS and _cross_site(origin, host):
        raise _refusal(request.method, request.url.path, origin, host)


class CrossSiteWrites:
    """Pure ASGI middleware: a write from another site to any address but the console's (which
    refuses it itself, with a page) is refused before it is routed, fast paths included: 400
    INVALID_REQUEST, nothing done. As a middleware it costs a look at the headers, where a FastAPI
    dependency of the whole app cost every request its dependency solving."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if (
            scope["type"] == "http"
            and scope["method"] not in SAFE_METHODS
            and not scope["path"].startswith(CONSOLE_PREFIX)
        ):
            origin, host = None, ""
            for name, value in scope["headers"]:
                if name == b"origin":
                    origin = value.decode("latin-1")
                elif name == b"host":
                    host = value.decode("latin-1")
            if _cross_site(origin, host):
                refusal = error_response(_refusal(scope["method"], scope["path"], origin, host))
                return await refusal(scope, receive, send)
        await self.app(scope, receive, send)
