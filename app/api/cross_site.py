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

from app.errors import BrokerError, ErrorCode

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def cross_site(request: Request) -> bool:
    """Whether the request comes from a page of another site (Origin names another host, or is
    "null": a sandboxed or privacy-stripped page)."""
    origin = request.headers.get("origin")
    if origin is None:
        return False  # not a browser's write from another site (those always carry Origin)
    return origin == "null" or urlsplit(origin).netloc != request.headers.get("host", "")


async def refuse_cross_site_writes(request: Request) -> None:
    """The app's dependency: a write (any method but GET, HEAD, OPTIONS) from another site is refused
    before its route runs."""
    if request.method not in SAFE_METHODS and cross_site(request):
        raise BrokerError(
            ErrorCode.INVALID_REQUEST,
            f"this {request.method} {request.url.path[:200]} came from a page of another site "
            f"(Origin {request.headers['origin'][:200]!r}, this server is {request.headers.get('host', '')[:200]!r}) "
            f"and was refused: use the console's own pages, or call the API from a program (which sends no Origin)",
        )
