"""The web console (/console): server-rendered pages for people, readable without JavaScript and
refreshed live with it.

Each page reads what it shows through storage and coordinator functions, in one read-only
REPEATABLE READ snapshot so that the watermarks, producer states and transaction states on a page
agree with each other, and renders a Jinja2 template (autoescaped: everything users wrote, from
record values to transactional and group ids, is shown as text). The console's script asks for a
page's live region only (header X-Console-Fragment: live) every few seconds, and for the abort
confirmation as a dialog (X-Console-Fragment: dialog). Every list is a page of a keyset range.

The one change the console makes is the admin abort, a POST form that calls the coordinator's
admin_abort. It refuses cross-site requests (an Origin header naming another site), and the
Content-Security-Policy allows no inline script at all.

Who may look: the console shows cluster-wide state (every topic, transaction and group), so with
`auth` required it needs a principal allowed to Describe the Cluster. A browser cannot send a bearer
header, so the console's sign-in page takes an API key and keeps it in an HttpOnly, SameSite=Strict
cookie scoped to /console; every request authenticates it again, so a revoked key stops working at
once. The abort needs what the API's admin abort needs (Alter on the Cluster or Write on the
TransactionalId) and is audited like it. With `auth` off every caller is the anonymous super user.
"""

from __future__ import annotations

import functools
import hashlib
import mimetypes
import re
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated
from urllib.parse import parse_qs, quote, urlsplit

import asyncpg
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from app.api.auth import AUTH_REQUIRED, token_principal
from app.api.deps import CoordinatorDep, PoolDep
from app.api.schemas import INT64_MAX
from app.coordinator.authorizer import (
    ANONYMOUS,
    CLUSTER_RESOURCE,
    Operation,
    Principal,
    ResourceType,
    authorize,
    is_allowed,
)
from app.coordinator.transaction_states import TransactionState
from app.errors import BrokerError, ErrorCode, invalid_request
from app.storage import (
    cleanup_progress,
    group_summaries,
    groups,
    log_browser,
    partition_log,
    partition_summary,
    principals,
    topics,
    transaction_health,
    transaction_history,
)
from app.storage.producer_ids import ProducerIdAndEpoch
from app.storage.topics import TRANSACTION_STATE_TOPIC

router = APIRouter(prefix="/console", include_in_schema=False)

WEB_DIR = Path(__file__).resolve().parents[2] / "web"
FRAGMENT_HEADER = "x-console-fragment"
KEY_COOKIE = "txbroker_console_key"
PAGE_SIZE = 50
PARTITION_PAGE_SIZE = 100
LOG_WINDOW = 50
HISTORY_PAGE = 50
HISTORY_SCAN_BUDGET = 20_000  # __transaction_state batches one history page may read
HANGING_FRACTION = 0.5  # an open transaction older than this part of its timeout is flagged
WARNINGS_SHOWN = 10
MARKERS_SHOWN = 500  # of the transactions on one history page

OPEN_STATES = [s.value for s in TransactionState if s.is_open]
ABORTABLE_STATES = {TransactionState.ONGOING.value, TransactionState.PREPARED.value}
STATE_FILTERS = {"open": OPEN_STATES, **{s.value: [s.value] for s in TransactionState if s != TransactionState.DEAD}}
AGE_FILTERS = {"": None, "10s": 10_000, "1m": 60_000, "5m": 300_000, "15m": 900_000, "1h": 3_600_000,
               "1d": 86_400_000}

# No inline script or style anywhere: an injected tag could not run even if escaping ever failed.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "Vary": "X-Console-Fragment",
}


def now_ms() -> int:
    return int(time.time() * 1000)


# ---- assets

class StaticAssets:
    """web/static, read once; URLs carry a content hash so browsers may cache them for good."""

    def __init__(self, directory: Path) -> None:
        self.files: dict[str, tuple[bytes, str, str]] = {}
        for path in sorted(directory.iterdir()):
            if path.is_file() and not path.name.startswith("."):
                body = path.read_bytes()
                media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
                self.files[path.name] = (body, media_type, hashlib.sha256(body).hexdigest()[:12])

    def url(self, name: str) -> str:
        return f"/console/static/{name}?v={self.files[name][2]}"


assets = StaticAssets(WEB_DIR / "static")


# ---- formatting for templates

def format_number(value: int | float | None) -> str:
    return "—" if value is None else f"{value:,}"


def format_compact(value: int | float | None) -> str:
    if value is None:
        return "—"
    for limit, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.1f}".rstrip("0").rstrip(".") + suffix
    return f"{value:,}" if isinstance(value, int) else f"{value:.1f}"


def format_duration(ms: int | None) -> str:
    if ms is None or ms < 0:
        return "—"
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{int(seconds)} s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{hours // 24} d {hours % 24} h"


def format_utc(ms: int | None) -> str:
    if ms is None or ms < 0:
        return "—"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def format_iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def preview(text: str | None, length: int = 80) -> str:
    if text is None:
        return ""
    flat = " ".join(text.split()) if len(text) < 10 * length else " ".join(text[:10 * length].split())
    return flat if len(flat) <= length else flat[:length - 1] + "…"


def _path_segment(value: str) -> str:
    return quote(value, safe="")


def transaction_url(transactional_id: str, suffix: str = "") -> str:
    # "." and ".." would be dot segments that browsers resolve away: they travel in the query.
    if transactional_id in (".", ".."):
        return f"/console/transactions/{suffix}?id={_path_segment(transactional_id)}"
    return f"/console/transactions/{_path_segment(transactional_id)}{suffix}"


def group_url(group_id: str) -> str:
    if group_id in (".", ".."):
        return f"/console/groups/?id={_path_segment(group_id)}"
    return f"/console/groups/{_path_segment(group_id)}"


def topic_url(topic: str) -> str:
    return f"/console/topics/{_path_segment(topic)}"


def partition_url(topic: str, partition: int) -> str:
    return f"{topic_url(topic)}/partitions/{partition}"


templates = Environment(loader=FileSystemLoader(WEB_DIR / "templates"), autoescape=True,
                        undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
templates.filters.update(num=format_number, compact=format_compact, duration=format_duration, utc=format_utc,
                         iso=format_iso, preview=preview)
templates.globals.update(transaction_url=transaction_url, group_url=group_url, topic_url=topic_url,
                         partition_url=partition_url, static_url=assets.url, abortable_states=ABORTABLE_STATES,
                         open_states=OPEN_STATES)
# Macros as a global, so a block rendered alone (a live fragment) sees them too.
templates.globals["ui"] = templates.get_template("_macros.html").module


# ---- throughput

class ThroughputMeter:
    """Offsets appended per second, from a topic's summed high watermarks sampled whenever a page
    shows them (kept in memory: a display aid, nothing depends on it). The rate is taken against the
    oldest sample of the last `window_s` seconds, so it needs two looks at least `min_span_s` apart."""

    def __init__(self, window_s: float = 60, min_span_s: float = 2, max_keys: int = 10_000) -> None:
        self.window_s = window_s
        self.min_span_s = min_span_s
        self.max_keys = max_keys
        self.samples: dict[object, deque[tuple[float, int]]] = {}

    def rate(self, key: object, high_watermark: int, at_s: float) -> float | None:
        samples = self.samples.get(key)
        if samples is None:
            if len(self.samples) >= self.max_keys:
                self.samples.clear()
            samples = self.samples[key] = deque()
        while samples and (at_s - samples[0][0] > self.window_s or samples[0][1] > high_watermark):
            samples.popleft()  # too old, or the topic was re-created with a lower watermark
        if not samples or at_s - samples[-1][0] >= 1:
            samples.append((at_s, high_watermark))
        first_at, first_hw = samples[0]
        if at_s - first_at < self.min_span_s:
            return None
        return (high_watermark - first_hw) / (at_s - first_at)


def _meter(request: Request) -> ThroughputMeter:
    state = request.app.state
    if not hasattr(state, "console_throughput"):
        state.console_throughput = ThroughputMeter()
    return state.console_throughput


# ---- rendering

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
    values = {"request": request, "now": moment, "nav": "", "page_url": _page_url(request),
              "base_url": str(request.base_url).rstrip("/"),
              "signed_in": getattr(request.state, "console_principal", None) if _auth_required(request) else None,
              "curl_auth": " -H 'Authorization: Bearer $TXBROKER_API_KEY'" if _auth_required(request) else "",
              **context}
    fragment = request.headers.get(FRAGMENT_HEADER)
    if fragment and fragment in template.blocks:
        html = "".join(template.blocks[fragment](template.new_context(values)))
    else:
        html = template.render(values)
    return HTMLResponse(html, status_code, headers={**SECURITY_HEADERS, "X-Server-Time-Ms": str(moment)})


def _error_page(request: Request, error: BrokerError) -> HTMLResponse:
    return render(request, "error.html", error.http_status, error=error)


def _auth_required(request: Request) -> bool:
    return request.app.state.settings.auth == AUTH_REQUIRED


async def console_principal(request: Request) -> Principal | None:
    """The caller: anonymous with auth off; else the owner of the bearer token or of the API key
    the sign-in page stored in the console's cookie (None when neither is valid)."""
    if not _auth_required(request):
        return ANONYMOUS
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else request.cookies.get(KEY_COOKIE, "")
    return await token_principal(request, token) if token else None


def _local_target(target: str | None) -> str:
    """Where to go after signing in: a console page of this server, never another site."""
    if target and target.startswith("/console") and not target.startswith("//"):
        return target
    return "/console"


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
            here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/console/login?next={quote(here, safe='')}", 303)
        request.state.console_principal = principal
        authorize(principal, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_RESOURCE)
        return await handler(request, *args, **kwargs)
    except BrokerError as error:
        return _error_page(request, error)


@asynccontextmanager
async def snapshot(pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Connection]:
    """One connection in a read-only REPEATABLE READ transaction: a page's reads agree."""
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        yield conn


# ---- pages

@router.get("")
@console_page
async def overview(request: Request, pool: PoolDep, after: str | None = None, internal: bool = False):
    """Topics with their watermarks, open transactions, and what needs attention."""
    moment = now_ms()
    async with snapshot(pool) as conn:
        totals = await partition_summary.totals(conn)
        topic_rows = await partition_summary.topic_page(conn, after, PAGE_SIZE + 1, internal)
        states = await transaction_health.counts_by_state(conn)
        overdue = await transaction_health.overdue(conn, OPEN_STATES, moment, HANGING_FRACTION, WARNINGS_SHOWN)
        pins = await transaction_health.lso_pins(conn, OPEN_STATES, WARNINGS_SHOWN)
    shown, has_more = topic_rows[:PAGE_SIZE], len(topic_rows) > PAGE_SIZE
    meter, at_s = _meter(request), time.monotonic()
    rates = {t.topic_id: meter.rate(("topic", t.topic_id), t.high_watermark, at_s) for t in shown}
    total_rate = meter.rate("all-user-topics", totals.high_watermark, at_s)
    return render(request, "overview.html", now=moment, nav="overview", totals=totals, topics=shown,
                  next_after=shown[-1].name if has_more else None, after=after, internal=internal, rates=rates,
                  total_rate=total_rate, states=states, open_count=sum(states.get(s, 0) for s in OPEN_STATES),
                  overdue=overdue, pins=pins, hanging_fraction=HANGING_FRACTION)


@router.get("/topics/{topic}")
@console_page
async def topic_page(request: Request, topic: str, pool: PoolDep,
                     after: Annotated[int, Query(ge=-1)] = -1):
    """One topic's partitions, a page at a time."""
    async with snapshot(pool) as conn:
        info = await topics.get_topic(conn, topic)
        summary = await partition_summary.topic_summary(conn, info.topic_id)
        rows = await partition_summary.partition_page(conn, info.topic_id, after, PARTITION_PAGE_SIZE + 1)
    shown, has_more = rows[:PARTITION_PAGE_SIZE], len(rows) > PARTITION_PAGE_SIZE
    rate = _meter(request).rate(("topic", info.topic_id), summary.high_watermark, time.monotonic())
    return render(request, "topic.html", nav="overview", topic=info, summary=summary, partitions=shown, rate=rate,
                  after=after, next_after=shown[-1].partition if has_more else None)


@router.get("/topics/{topic}/partitions/{partition}")
@console_page
async def partition_page(request: Request, topic: str, partition: int, pool: PoolDep,
                         offset: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
                         producers_after: Annotated[int, Query(ge=-1, le=INT64_MAX)] = -1,
                         markers_before: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None):
    """A window of the partition's log with each record's transactional status, its producers and
    its markers."""
    async with snapshot(pool) as conn:
        info = await topics.get_topic(conn, topic)
        state = await partition_log.partition_state(conn, info, partition)
        start = (max(state.log_start_offset, state.high_watermark - LOG_WINDOW) if offset is None
                 else min(max(offset, state.log_start_offset), state.high_watermark))
        end = min(start + LOG_WINDOW, state.high_watermark)
        entries = await log_browser.read_window(conn, info.topic_id, partition, start, end)
        cleanup = await cleanup_progress.cleanup_status(conn, info.topic_id, partition)
        producers = await log_browser.producers(conn, info.topic_id, partition, producers_after, PAGE_SIZE + 1)
        marker_rows = await log_browser.markers_before(
            conn, info.topic_id, partition, state.high_watermark if markers_before is None else markers_before,
            PAGE_SIZE + 1)
    return render(request, "partition.html", nav="overview", topic=info, partition=partition, state=state, cleanup=cleanup,
                  start=start, end=end, window=LOG_WINDOW, entries=entries, follow_tail=offset is None,
                  producers=producers[:PAGE_SIZE], producers_after=producers_after,
                  next_producers_after=producers[PAGE_SIZE - 1].producer_id if len(producers) > PAGE_SIZE else None,
                  markers=marker_rows[:PAGE_SIZE], markers_before=markers_before,
                  next_markers_before=marker_rows[PAGE_SIZE - 1].offset if len(marker_rows) > PAGE_SIZE else None)


def _parse_state_filter(state: str) -> list[str] | None:
    if not state:
        return None
    if state in STATE_FILTERS:
        return STATE_FILTERS[state]
    try:
        return [TransactionState.parse(name.strip()).value for name in state.split(",") if name.strip()]
    except ValueError:
        raise invalid_request(f"state={state!r} is not a state filter: expected 'open' or a comma-separated list "
                              f"of {[s.value for s in TransactionState]}") from None


def _parse_age(older_than: str) -> int | None:
    if older_than in AGE_FILTERS:
        return AGE_FILTERS[older_than]
    match = re.fullmatch(r"(\d{1,9})\s*(ms|s|m|h|d)?", older_than.strip())
    if match is None:
        raise invalid_request(f"older_than={older_than!r} is not a duration: expected e.g. 30s, 5m, 2h or 1d")
    unit = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}[match.group(2) or "s"]
    return int(match.group(1)) * unit


@router.get("/transactions")
@console_page
async def transactions_page(request: Request, pool: PoolDep, coordinator: CoordinatorDep, state: str = "",
                            prefix: str = "", older_than: str = "", after: str | None = None):
    """Every transactional id, filtered by state, prefix and age, a page at a time."""
    states = _parse_state_filter(state)
    min_age_ms = _parse_age(older_than)
    found = await coordinator.list(states, prefix or None, None, min_age_ms, PAGE_SIZE + 1, after)
    async with snapshot(pool) as conn:
        counts = await transaction_health.counts_by_state(conn)
    shown, has_more = found[:PAGE_SIZE], len(found) > PAGE_SIZE
    return render(request, "transactions.html", nav="transactions", transactions=shown, counts=counts,
                  state=state, prefix=prefix, older_than=older_than, after=after,
                  next_after=shown[-1].transactional_id if has_more else None,
                  state_filters=list(STATE_FILTERS), age_filters=list(AGE_FILTERS))


def _id_from(path_id: str, request: Request) -> str:
    return path_id or request.query_params.get("id", "")


@router.get("/transactions/{transactional_id:path}")
@console_page
async def transaction_page(request: Request, transactional_id: str, pool: PoolDep, coordinator: CoordinatorDep,
                           before: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None, confirm: str = "",
                           aborted: bool = False):
    """One transactional id: its state, its history from __transaction_state, the markers its
    transactions wrote and its producer epochs."""
    transactional_id = _id_from(transactional_id, request)
    if not transactional_id:
        return RedirectResponse("/console/transactions", 303)
    try:
        meta = await coordinator.describe(transactional_id)
    except BrokerError as error:
        if error.code != ErrorCode.TRANSACTIONAL_ID_NOT_FOUND:
            raise
        meta = None  # expired or never initialized: its history may still be in the log
    if request.headers.get(FRAGMENT_HEADER) == "dialog":
        if meta is None:
            raise transaction_not_found(transactional_id)
        return render(request, "transaction.html", nav="transactions", txn=meta, transactional_id=transactional_id)
    async with snapshot(pool) as conn:
        log_topic = await topics.get_topic(conn, TRANSACTION_STATE_TOPIC)
        history = await transaction_history.transitions(conn, log_topic, transactional_id, before, HISTORY_PAGE,
                                                        HISTORY_SCAN_BUDGET)
        written = await transaction_history.markers_written(conn, history.transitions, MARKERS_SHOWN)
    if meta is None and not history.transitions and before is None:
        raise transaction_not_found(transactional_id)
    return render(request, "transaction.html", nav="transactions", txn=meta, transactional_id=transactional_id,
                  history=history, markers=written, epochs=transaction_history.epoch_history(history.transitions),
                  marker_limit=MARKERS_SHOWN, before=before, confirm=confirm == "abort", aborted=aborted)


def transaction_not_found(transactional_id: str) -> BrokerError:
    return BrokerError(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
                       f"transactional id {transactional_id!r} is unknown: never initialized, or expired "
                       f"and no longer in the transaction log")


def _cross_site_refused(action: str) -> BrokerError:
    return BrokerError(ErrorCode.INVALID_REQUEST, f"this {action} came from a page of another site and was refused: "
                                                  f"use the console's own page")


def _cross_site(request: Request) -> bool:
    """A browser names the page a POST comes from in Origin; refuse one from another site."""
    origin = request.headers.get("origin")
    if origin is None:
        return False  # not a browser form from another site (those always carry Origin)
    host = request.headers.get("host", "")
    return origin == "null" or urlsplit(origin).netloc != host


async def _confirmed_producer(request: Request) -> ProducerIdAndEpoch | None:
    """The producer id and epoch the confirmation showed (hidden form fields), if sent."""
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    try:
        return ProducerIdAndEpoch(int(form["producer_id"][0]), int(form["producer_epoch"][0]))
    except (KeyError, ValueError):
        return None


@router.post("/transactions/{transactional_id:path}/abort")
@console_page
async def abort_transaction(request: Request, transactional_id: str, pool: PoolDep, coordinator: CoordinatorDep):
    """The admin abort: fences the producer (epoch bump) and aborts its open transaction. Allowed
    as the API's admin abort is, and audited like it."""
    transactional_id = _id_from(transactional_id, request)
    if _cross_site(request):
        raise _cross_site_refused("abort")
    principal = request.state.console_principal
    if not is_allowed(principal, Operation.ALTER, ResourceType.CLUSTER, CLUSTER_RESOURCE):
        authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
    result = await coordinator.admin_abort(transactional_id, await _confirmed_producer(request))
    async with pool.acquire() as conn:
        await principals.audit(conn, now_ms(), principal.name, "abort transaction", transactional_id,
                               f"from the console; fenced: now producer {result.producer_id} "
                               f"epoch {result.producer_epoch}")
    separator = "&" if "?" in transaction_url(transactional_id) else "?"
    return RedirectResponse(f"{transaction_url(transactional_id)}{separator}aborted=1", 303)


@router.get("/groups")
@console_page
async def groups_page(request: Request, pool: PoolDep, after: str | None = None, prefix: str = ""):
    async with snapshot(pool) as conn:
        rows = await group_summaries.group_page(conn, after, prefix or None, PAGE_SIZE + 1)
    shown, has_more = rows[:PAGE_SIZE], len(rows) > PAGE_SIZE
    return render(request, "groups.html", nav="groups", groups=shown, after=after, prefix=prefix,
                  next_after=shown[-1].group_id if has_more else None)


def _parse_key(name: str, value: str | None, shape: str) -> tuple | None:
    """A keyset position of the group page, `topic:partition[:producer id]` (topic names have no ':')."""
    if not value:
        return None
    parts = value.split(":")
    if len(parts) != shape.count(":") + 1 or not all(part.lstrip("-").isdigit() for part in parts[1:]):
        raise invalid_request(f"{name}={value!r}: expected {shape}")
    return (parts[0], *(int(part) for part in parts[1:]))


@router.get("/groups/{group_id:path}")
@console_page
async def group_page(request: Request, group_id: str, pool: PoolDep, members_after: str | None = None,
                     offsets_after: str | None = None, pending_after: str | None = None):
    """One consumer group: members and their assignment, committed offsets with lag, and pending
    transactional offsets."""
    group_id = _id_from(group_id, request)
    if not group_id:
        return RedirectResponse("/console/groups", 303)
    offsets_key = _parse_key("offsets_after", offsets_after, "topic:partition")
    pending_key = _parse_key("pending_after", pending_after, "topic:partition:producer_id")
    async with snapshot(pool) as conn:
        group = await groups.get(conn, group_id)
        if group is None:
            raise BrokerError(ErrorCode.GROUP_ID_NOT_FOUND,
                              f"group {group_id!r} does not exist: a group exists once a member heartbeats or "
                              f"offsets are committed for it")
        members = await group_summaries.member_page(conn, group_id, members_after, PAGE_SIZE + 1)
        offsets = await group_summaries.offset_page(conn, group_id, offsets_key, PAGE_SIZE + 1)
        pending = await group_summaries.pending_offsets(conn, group_id, pending_key, PAGE_SIZE + 1)
    more = {name: len(rows) > PAGE_SIZE for name, rows in (("members", members), ("offsets", offsets),
                                                           ("pending", pending))}
    members, offsets, pending = members[:PAGE_SIZE], offsets[:PAGE_SIZE], pending[:PAGE_SIZE]
    return render(request, "group.html", nav="groups", group=group, members=members, offsets=offsets,
                  lag_total=sum(o.lag or 0 for o in offsets), pending=pending, members_after=members_after,
                  offsets_after=offsets_after, pending_after=pending_after,
                  next_members_after=members[-1].member_id if more["members"] else None,
                  next_offsets_after=f"{offsets[-1].topic}:{offsets[-1].partition}" if more["offsets"] else None,
                  next_pending_after=(f"{pending[-1].topic}:{pending[-1].partition}:{pending[-1].producer_id}"
                                      if more["pending"] else None))


@router.get("/login")
async def login_page(request: Request, next: str | None = None):
    """The sign-in form (auth required only): an API key, kept in an HttpOnly cookie."""
    if not _auth_required(request):
        return RedirectResponse(_local_target(next), 303)
    return render(request, "login.html", target=_local_target(next), failed=False)


@router.post("/login")
async def sign_in(request: Request):
    if not _auth_required(request):
        return RedirectResponse("/console", 303)
    if _cross_site(request):
        return _error_page(request, _cross_site_refused("sign-in"))
    # A form body (every body is declared JSON by the JsonBodies middleware, so it is parsed here).
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    key = form.get("api_key", [""])[0].strip()
    target = _local_target(form.get("next", [""])[0])
    principal = await token_principal(request, key) if key else None
    if principal is None:
        return render(request, "login.html", 401, target=target, failed=True)
    response = RedirectResponse(target, 303)
    response.set_cookie(KEY_COOKIE, key, path="/console", httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
    return response


@router.post("/logout")
async def sign_out(request: Request):
    if _cross_site(request):
        return _error_page(request, _cross_site_refused("sign-out"))
    response = RedirectResponse("/console/login" if _auth_required(request) else "/console", 303)
    response.delete_cookie(KEY_COOKIE, path="/console", httponly=True, samesite="strict")
    return response


@router.get("/static/{name}")
async def static_asset(name: str, v: str | None = None):
    found = assets.files.get(name)
    if found is None:
        return Response("not found", 404, media_type="text/plain")
    body, media_type, digest = found
    cache = "public, max-age=31536000, immutable" if v == digest else "no-cache"
    return Response(body, media_type=media_type, headers={"Cache-Control": cache, "ETag": f'"{digest}"',
                                                          "X-Content-Type-Options": "nosniff"})


@router.get("/{rest:path}")
@console_page
async def not_found(request: Request, rest: str):
    """Any other console address: a page (not the API's JSON) that leads back."""
    if not rest:
        return RedirectResponse("/console", 308)
    raise BrokerError(ErrorCode.NOT_FOUND, f"the console has no page at {request.url.path}: start from the overview")
