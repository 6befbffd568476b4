"""Rendering console pages: the Jinja2 environment (autoescaped: everything users wrote, from record
values to transactional and group ids, is shown as text), whole pages or one live block of them,
and the security headers every page carries."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from app.api.auth import AUTH_REQUIRED
from app.clock import now_ms
from app.console.assets import WEB_DIR, assets
from app.console.formatting import (
    LATEST_DATED_MS,
    format_compact,
    format_duration,
    format_iso,
    format_number,
    format_utc,
    group_url,
    partition_url,
    preview,
    topic_url,
    transaction_url,
)
from app.coordinator.transaction_states import TransactionState
from app.errors import BrokerError

# The console's script asks for one block of a page with this header ("live" every few seconds,
# "dialog" for the abort confirmation).
FRAGMENT_HEADER = "x-console-fragment"

OPEN_STATES = [s.value for s in TransactionState if s.is_open]
ABORTABLE_STATES = {TransactionState.ONGOING.value, TransactionState.PREPARED.value}

# No inline script or style anywhere: an injected tag could not run even if escaping ever failed.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "Vary": "X-Console-Fragment",
}

templates = Environment(
    loader=FileSystemLoader(WEB_DIR / "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
templates.filters.update(
    num=format_number, compact=format_compact, duration=format_duration, utc=format_utc, iso=format_iso, preview=preview
)
templates.globals.update(
    transaction_url=transaction_url,
    group_url=group_url,
    topic_url=topic_url,
    partition_url=partition_url,
    static_url=assets.url,
    latest_dated_ms=LATEST_DATED_MS,
    abortable_states=ABORTABLE_STATES,
    open_states=OPEN_STATES,
)
# Macros as a global, so a block rendered alone (a live fragment) sees them too.
templates.globals["ui"] = templates.get_template("_macros.html").module


def auth_required(request: Request) -> bool:
    return request.app.state.settings.auth == AUTH_REQUIRED


def _page_url(request: Request):
    def page_url(**changes) -> str:
        """This page's URL with some query parameters changed (None removes one)."""
        url = request.url.remove_query_params([name for name, value in changes.items() if value is None])
        kept = {name: value for name, value in changes.items() if value is not None}
        if kept:
            url = url.include_query_params(**kept)
        return url.path + (f"?{url.query}" if url.query else "")

    return page_url


def render(request: Request, template_name: str, status_code: int = 200, **context) -> HTMLResponse:
    """The whole page, or only one of its blocks when the console's script asks for a fragment."""
    template = templates.get_template(template_name)
    moment = context.pop("now", None) or now_ms()
    values = {
        "request": request,
        "now": moment,
        "nav": "",
        "page_url": _page_url(request),
        "base_url": str(request.base_url).rstrip("/"),
        "signed_in": getattr(request.state, "console_principal", None) if auth_required(request) else None,
        "curl_auth": " -H 'Authorization: Bearer $TXBROKER_API_KEY'" if auth_required(request) else "",
        **context,
    }
    fragment = request.headers.get(FRAGMENT_HEADER)
    if fragment and fragment in template.blocks:
        html = "".join(template.blocks[fragment](template.new_context(values)))
    else:
        html = template.render(values)
    return HTMLResponse(html, status_code, headers={**SECURITY_HEADERS, "X-Server-Time-Ms": str(moment)})


# How often a page that met PostgreSQL away (503) loads itself again.
UNAVAILABLE_RETRY_S = 5


def error_page(request: Request, error: BrokerError) -> HTMLResponse:
    # PostgreSQL away, as the API's answer says: worth another try soon. A page someone opened (a GET,
    # not the live block the script asks for, which retries on its own) loads itself again until the
    # server answers, instead of waiting for a reload; a POST is never sent again by it.
    unavailable = error.http_status == 503
    retry_s = UNAVAILABLE_RETRY_S if unavailable and request.method == "GET" else None
    response = render(request, "error.html", error.http_status, error=error, retry_s=retry_s)
    if unavailable:
        response.headers["Retry-After"] = "1"
    return response
