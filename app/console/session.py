"""Who may look at the console, and signing in.

The console shows cluster-wide state, so with `auth` required it needs a principal allowed to
Describe the Cluster; within it each page shows what the principal may Describe (`visibility`). A
browser cannot send a bearer header, so the sign-in page takes an API key and keeps it in an
HttpOnly, SameSite=Strict cookie scoped to /console; every request authenticates it again, so a
revoked key stops working at once. POSTs from another site are refused before they get here
(app/api/cross_site.py). With `auth` off every caller is the anonymous super user.
"""

from __future__ import annotations

import functools
import time
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.api.auth import token_principal
from app.console.rendering import FRAGMENT_HEADER, SECURITY_HEADERS, auth_required, error_page, render
from app.coordinator.authorizer import ANONYMOUS, CLUSTER_RESOURCE, Operation, Principal, ResourceType, authorize
from app.coordinator.confirmed_reads import reads_confirmed_by_the_standby
from app.errors import BrokerError

KEY_COOKIE = "txbroker_console_key"

router = APIRouter()


async def console_principal(request: Request) -> Principal | None:
    """The caller: anonymous with auth off; else the owner of the bearer token or of the API key
    the sign-in page stored in the console's cookie (None when neither is valid)."""
    if not auth_required(request):
        return ANONYMOUS
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else request.cookies.get(KEY_COOKIE, "")
    return await token_principal(request, token) if token else None


def _local_target(target: str | None) -> str:
    """Where to go after signing in: a console page of this server, never another site."""
    if target and target.startswith("/console") and not target.startswith("//"):
        return target
    return "/console"


def _page_to_return_to(request: Request) -> str:
    """The page to show once signed in: the one asked for; for a form's POST (an abort whose sign-in
    lapsed) the page the form was on, as its Referer names it, not the POST's address, which as a
    GET would be another page (the abort of id "x" read as the page of id "x/abort")."""
    if request.method == "GET":
        return request.url.path + (f"?{request.url.query}" if request.url.query else "")
    referer = urlsplit(request.headers.get("referer", ""))
    if referer.netloc != request.headers.get("host"):
        return "/console"
    return _local_target(referer.path + (f"?{referer.query}" if referer.query else ""))


def console_page(handler):
    """Wraps a page handler: a starting server answers a page that reloads itself; a caller who is
    not signed in is sent to the sign-in page; one who may not Describe the Cluster, and any
    expected error (unknown topic, invalid filter, ...), gets a page with the error's HTTP status."""

    @functools.wraps(handler)
    async def page(request: Request, *args, **kwargs):
        started = time.perf_counter()
        response = await _serve_page(handler, request, *args, **kwargs)
        # Reads and rendering, as browsers' developer tools show it (and the scale test reports).
        response.headers["Server-Timing"] = f"page;dur={(time.perf_counter() - started) * 1000:.1f}"
        return response

    return page


async def _serve_page(handler, request: Request, *args, **kwargs) -> Response:
    if not request.app.state.ready:
        response = render(request, "starting.html", 503)
        response.headers["Retry-After"] = "1"
        return response
    try:
        principal = await console_principal(request)
        if principal is None:
            if request.headers.get(FRAGMENT_HEADER):
                return HTMLResponse("", 401, headers=SECURITY_HEADERS)
            return RedirectResponse(f"/console/login?next={quote(_page_to_return_to(request), safe='')}", 303)
        request.state.console_principal = principal
        authorize(principal, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_RESOURCE)
        if request.method != "GET":  # a POST, the abort, is a write that waits for the standby anyway
            return await handler(request, *args, **kwargs)
        # Once per page, after all its reads, whether it shows them or an error found in them: a page
        # must not show a transaction committed, a record or a watermark that a failover then takes
        # back, nor a topic not found whose deletion it brings back. Unconfirmed, the 503 page loads
        # itself again (error_page).
        async with reads_confirmed_by_the_standby(request.app.state.replication_barrier, "what this page shows"):
            return await handler(request, *args, **kwargs)
    except BrokerError as error:
        return error_page(request, error)


@router.get("/login")
async def login_page(request: Request, next: str | None = None):
    """The sign-in form (auth required only): an API key, kept in an HttpOnly cookie."""
    if not auth_required(request):
        return RedirectResponse(_local_target(next), 303)
    return render(request, "login.html", target=_local_target(next), failed=False)


@router.post("/login")
async def sign_in(request: Request):
    if not auth_required(request):
        return RedirectResponse("/console", 303)
    # A form body (every body is declared JSON by the JsonBodies middleware, so it is parsed here).
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    key = form.get("api_key", [""])[0].strip()
    target = _local_target(form.get("next", [""])[0])
    principal = await token_principal(request, key) if key else None
    if principal is None:
        return render(request, "login.html", 401, target=target, failed=True)
    response = RedirectResponse(target, 303)
    response.set_cookie(
        KEY_COOKIE, key, path="/console", httponly=True, samesite="strict", secure=request.url.scheme == "https"
    )
    return response


@router.post("/logout")
async def sign_out(request: Request):
    response = RedirectResponse("/console/login" if auth_required(request) else "/console", 303)
    response.delete_cookie(KEY_COOKIE, path="/console", httponly=True, samesite="strict")
    return response
