"""The console's pages: overview, topic, partition, transactions, one transaction (with the admin
abort), groups, one group and the audit log.

Each page reads what it shows through storage and coordinator functions, in one read-only
REPEATABLE READ snapshot so that the watermarks, producer states and transaction states on a page
agree with each other. Every list is a page of a keyset range. The one change the console makes is
the admin abort, a POST form that calls the coordinator's audited admin abort.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated
from urllib.parse import parse_qs

import asyncpg
from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParameter
from fastapi.responses import RedirectResponse

from app.api.auth import door_actor
from app.api.deps import CoordinatorDep, PoolDep
from app.api.schemas import INT32_MAX, INT64_MAX
from app.clock import now_ms
from app.console.formatting import transaction_url
from app.console.queries import (
    audit_trail,
    group_summaries,
    log_browser,
    partition_summary,
    transaction_health,
    transaction_history,
)
from app.console.rendering import FRAGMENT_HEADER, OPEN_STATES, render
from app.console.session import console_page
from app.console.throughput import meter_of
from app.console.visibility import HIDDEN_SKIP_READ, visibility, visible_page
from app.coordinator import classic_groups, consumer_groups, http_revocations, transaction_admin
from app.coordinator.audit import AuditSource
from app.coordinator.authorizer import CLUSTER_RESOURCE, Operation, ResourceType, authorize, is_allowed
from app.coordinator.transaction_states import TransactionState
from app.errors import BrokerError, ErrorCode, invalid_request
from app.storage.database import NO_IDLE_IN_TRANSACTION_TIMEOUT_SQL
from app.storage.groups import group_offsets, groups
from app.storage.lifecycle import cleanup_progress
from app.storage.log import partition_log, topics
from app.storage.log.topics import TRANSACTION_STATE_TOPIC
from app.storage.security import principals
from app.storage.transactions.producer_ids import ProducerIdAndEpoch

router = APIRouter()

PAGE_SIZE = 50
PARTITION_PAGE_SIZE = 100
LOG_WINDOW = 50
HISTORY_PAGE = 50
HISTORY_SCAN_BUDGET = 20_000  # __transaction_state batches one history page may read
HANGING_FRACTION = 0.5  # an open transaction older than this part of its timeout is flagged
WARNINGS_SHOWN = 10
MARKERS_SHOWN = 500  # of the transactions on one history page
HEADERS_SHOWN = 20  # of a record, each previewed: a record's headers are otherwise unbounded

STATE_FILTERS = {"open": OPEN_STATES, **{s.value: [s.value] for s in TransactionState if s != TransactionState.DEAD}}
AGE_FILTERS = {"": None, "10s": 10_000, "1m": 60_000, "5m": 300_000, "15m": 900_000, "1h": 3_600_000, "1d": 86_400_000}


@asynccontextmanager
async def snapshot(pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Connection]:
    """One connection in a read-only REPEATABLE READ transaction: a page's reads agree. Exempt from
    the request pool's idle-in-transaction timeout: a page decodes batches between its reads (a
    window inside a batch of a million records takes seconds), and the transaction locks no row."""
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        await conn.execute(NO_IDLE_IN_TRANSACTION_TIMEOUT_SQL)
        yield conn


@router.get("")
@console_page
async def overview(request: Request, pool: PoolDep, after: str | None = None, internal: bool = False):
    """Topics with their watermarks, open transactions, and what needs attention."""
    moment = now_ms()
    view = visibility(request)
    async with snapshot(pool) as conn:
        totals = await partition_summary.totals(conn)
        shown, has_more = await visible_page(
            lambda after, limit: partition_summary.topic_page(conn, after, limit, internal),
            after,
            PAGE_SIZE,
            lambda t: view.topic(t.name),
            lambda t: t.name,
        )
        states = await transaction_health.counts_by_state(conn)
        # A principal that sees part of the cluster gets the first warnings among those it may see:
        # read more of them, so that hidden ones ahead do not take their places.
        read = WARNINGS_SHOWN if view.principal.is_super_user else HIDDEN_SKIP_READ
        overdue = view.overdue(await transaction_health.overdue(conn, OPEN_STATES, moment, HANGING_FRACTION, read))
        pins = view.pins(await transaction_health.lso_pins(conn, OPEN_STATES, read))
    meter, at_s = meter_of(request), time.monotonic()
    rates = {t.topic_id: meter.rate(("topic", t.topic_id), t.high_watermark, at_s) for t in shown}
    total_rate = meter.rate("all-user-topics", totals.high_watermark, at_s)
    return render(
        request,
        "overview.html",
        now=moment,
        nav="overview",
        totals=totals,
        topics=shown,
        next_after=shown[-1].name if has_more else None,
        after=after,
        internal=internal,
        rates=rates,
        total_rate=total_rate,
        states=states,
        open_count=sum(states.get(s, 0) for s in OPEN_STATES),
        overdue=dataclasses.replace(overdue, transactions=overdue.transactions[:WARNINGS_SHOWN]),
        pins=pins[:WARNINGS_SHOWN],
        hanging_fraction=HANGING_FRACTION,
    )


@router.get("/topics/{topic}")
@console_page
async def topic_page(
    request: Request, topic: str, pool: PoolDep, after: Annotated[int, Query(ge=-1, le=INT32_MAX)] = -1
):
    """One topic's partitions, a page at a time."""
    visibility(request).require(Operation.DESCRIBE, ResourceType.TOPIC, topic)
    async with snapshot(pool) as conn:
        info = await topics.get_topic(conn, topic)
        summary = await partition_summary.topic_summary(conn, info.topic_id)
        rows = await partition_summary.partition_page(conn, info.topic_id, after, PARTITION_PAGE_SIZE + 1)
    shown, has_more = rows[:PARTITION_PAGE_SIZE], len(rows) > PARTITION_PAGE_SIZE
    rate = meter_of(request).rate(("topic", info.topic_id), summary.high_watermark, time.monotonic())
    return render(
        request,
        "topic.html",
        nav="overview",
        topic=info,
        topic_id=topics.kafka_topic_id(info.topic_uuid),
        summary=summary,
        partitions=shown,
        rate=rate,
        after=after,
        next_after=shown[-1].partition if has_more else None,
    )


@router.get("/topics/{topic}/partitions/{partition}")
@console_page
async def partition_page(
    request: Request,
    topic: str,
    partition: Annotated[int, PathParameter(ge=0, le=INT32_MAX)],
    pool: PoolDep,
    offset: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
    producers_after: Annotated[int, Query(ge=-1, le=INT64_MAX)] = -1,
    markers_before: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
):
    """A window of the partition's log with each record's transactional status, its producers and
    its markers (Read on the topic: its records, as the API's reads of them)."""
    view = visibility(request)
    view.require(Operation.READ, ResourceType.TOPIC, topic)
    async with snapshot(pool) as conn:
        info = await topics.get_topic(conn, topic)
        state = await partition_log.partition_state(conn, info, partition)
        # A window holds LOG_WINDOW stored offsets: on a log the cleaner left sparse it spans the gaps.
        start = (
            await log_browser.window_start_before(
                conn, info.topic_id, partition, state.high_watermark, LOG_WINDOW, state.log_start_offset
            )
            if offset is None
            else min(max(offset, state.log_start_offset), state.high_watermark)
        )
        end = await log_browser.window_end(conn, info.topic_id, partition, start, LOG_WINDOW, state.high_watermark)
        older = (
            await log_browser.window_start_before(
                conn, info.topic_id, partition, start, LOG_WINDOW, state.log_start_offset
            )
            if start > state.log_start_offset
            else None
        )
        entries = await log_browser.read_window(conn, info.topic_id, partition, start, end)
        cleanup = await cleanup_progress.cleanup_status(conn, info.topic_id, partition)
        producers = await log_browser.producers(conn, info.topic_id, partition, producers_after, PAGE_SIZE + 1)
        marker_rows = await log_browser.markers_before(
            conn,
            info.topic_id,
            partition,
            state.high_watermark if markers_before is None else markers_before,
            PAGE_SIZE + 1,
        )
    return render(
        request,
        "partition.html",
        nav="overview",
        topic=info,
        partition=partition,
        state=state,
        cleanup=cleanup,
        start=start,
        end=end,
        older=older,
        entries=entries,
        headers_shown=HEADERS_SHOWN,
        follow_tail=offset is None,
        producers=view.ids_shown(producers[:PAGE_SIZE]),
        producers_after=producers_after,
        next_producers_after=producers[PAGE_SIZE - 1].producer_id if len(producers) > PAGE_SIZE else None,
        markers=view.ids_shown(marker_rows[:PAGE_SIZE]),
        markers_before=markers_before,
        next_markers_before=marker_rows[PAGE_SIZE - 1].offset if len(marker_rows) > PAGE_SIZE else None,
    )


def _parse_state_filter(state: str) -> list[str] | None:
    if not state:
        return None
    if state in STATE_FILTERS:
        return STATE_FILTERS[state]
    try:
        return [TransactionState.parse(name.strip()).value for name in state.split(",") if name.strip()]
    except ValueError:
        raise invalid_request(
            f"state={state!r} is not a state filter: expected 'open' or a comma-separated list "
            f"of {[s.value for s in TransactionState]}"
        ) from None


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
async def transactions_page(
    request: Request,
    pool: PoolDep,
    coordinator: CoordinatorDep,
    state: str = "",
    prefix: str = "",
    older_than: str = "",
    after: str | None = None,
):
    """Every transactional id the principal may Describe, filtered by state, prefix and age, a page
    at a time."""
    states = _parse_state_filter(state)
    min_age_ms = _parse_age(older_than)
    view = visibility(request)
    found = await transaction_admin.list_transactions(
        coordinator,
        transaction_admin.TransactionFilter(states, prefix or None, None, min_age_ms),
        view.transactional_id,
        PAGE_SIZE + 1,
        after,
    )
    async with snapshot(pool) as conn:
        counts = await transaction_health.counts_by_state(conn)
    shown, has_more = [view.transaction(meta) for meta in found[:PAGE_SIZE]], len(found) > PAGE_SIZE
    return render(
        request,
        "transactions.html",
        nav="transactions",
        transactions=shown,
        counts=counts,
        state=state,
        prefix=prefix,
        older_than=older_than,
        after=after,
        next_after=shown[-1].transactional_id if has_more else None,
        state_filters=list(STATE_FILTERS),
        age_filters=list(AGE_FILTERS),
    )


def _id_from(path_id: str, request: Request) -> str:
    return path_id or request.query_params.get("id", "")


@router.get("/transactions/{transactional_id:path}")
@console_page
async def transaction_page(
    request: Request,
    transactional_id: str,
    pool: PoolDep,
    coordinator: CoordinatorDep,
    before: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
    confirm: str = "",
    aborted: bool = False,
):
    """One transactional id: its state, its history from __transaction_state, the markers its
    transactions wrote and its producer epochs."""
    transactional_id = _id_from(transactional_id, request)
    if not transactional_id:
        return RedirectResponse("/console/transactions", 303)
    view = visibility(request)
    view.require(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id)
    try:
        meta = view.transaction(await coordinator.describe(transactional_id))
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
        history = await transaction_history.transitions(
            conn, log_topic, transactional_id, before, HISTORY_PAGE, HISTORY_SCAN_BUDGET
        )
        written = await transaction_history.markers_written(conn, history.transitions, MARKERS_SHOWN)
    if meta is None and not history.transitions and before is None:
        raise transaction_not_found(transactional_id)
    return render(
        request,
        "transaction.html",
        nav="transactions",
        txn=meta,
        transactional_id=transactional_id,
        history=view.history(history),
        markers=view.markers(written),
        epochs=transaction_history.epoch_history(history.transitions),
        marker_limit=MARKERS_SHOWN,
        before=before,
        confirm=confirm == "abort",
        aborted=aborted,
    )


def transaction_not_found(transactional_id: str) -> BrokerError:
    return BrokerError(
        ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
        f"transactional id {transactional_id!r} is unknown: never initialized, or expired "
        f"and no longer in the transaction log",
    )


CONFIRMED_FIELDS = ("producer_id", "producer_epoch", "start_time_ms")


async def _confirmed_transaction(request: Request) -> tuple[ProducerIdAndEpoch, int]:
    """The producer id and epoch, and the transaction's start time, the confirmation showed (its
    hidden form fields). All three are required: without one the abort would no longer be of the
    transaction the operator saw (with Kafka's clients the producer id and epoch carry over to the
    producer's next transaction), so a form that lacks one, or sends one that is not a number, aborts
    nothing."""
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    values = {name: form.get(name, [""])[0].strip() for name in CONFIRMED_FIELDS}
    if not all(re.fullmatch(r"-?\d{1,19}", value) for value in values.values()):
        raise invalid_request(
            f"the abort's confirmation must name the transaction it confirms, as numbers {list(CONFIRMED_FIELDS)}; "
            f"received { ({name: value[:40] for name, value in values.items()})!r}: nothing was aborted, open the "
            f"transaction's page and confirm again"
        )
    numbers = {name: int(value) for name, value in values.items()}
    return ProducerIdAndEpoch(numbers["producer_id"], numbers["producer_epoch"]), numbers["start_time_ms"]


@router.post("/transactions/{transactional_id:path}/abort")
@console_page
async def abort_transaction(request: Request, transactional_id: str, coordinator: CoordinatorDep):
    """The admin abort: fences the producer (epoch bump) and aborts its open transaction. Allowed
    as the API's admin abort is, and audited like it."""
    transactional_id = _id_from(transactional_id, request)
    principal = request.state.console_principal
    if not is_allowed(principal, Operation.ALTER, ResourceType.CLUSTER, CLUSTER_RESOURCE):
        authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
    producer, start_ms = await _confirmed_transaction(request)
    await coordinator.admin_abort(
        transactional_id,
        producer,
        expected_start_ms=start_ms,
        actor=door_actor(principal, AuditSource.CONSOLE, request),
    )
    return RedirectResponse(transaction_url(transactional_id, query="aborted=1"), 303)


@router.get("/groups")
@console_page
async def groups_page(request: Request, pool: PoolDep, after: str | None = None, prefix: str = ""):
    view = visibility(request)
    async with snapshot(pool) as conn:
        shown, has_more = await visible_page(
            lambda after, limit: group_summaries.group_page(conn, after, prefix or None, limit),
            after,
            PAGE_SIZE,
            lambda g: view.group(g.group_id),
            lambda g: g.group_id,
        )
    return render(
        request,
        "groups.html",
        nav="groups",
        markers_counted=group_offsets.MARKERS_COUNTED,
        groups=shown,
        # Each group's state by the rule the group page, HTTP and Kafka's ListGroups apply.
        states={g.group_id: classic_groups.kind_of(g.classic, g.members)[1] for g in shown},
        after=after,
        prefix=prefix,
        next_after=shown[-1].group_id if has_more else None,
    )


def _parse_key(name: str, value: str | None, shape: str) -> tuple | None:
    """A keyset position of the group page, `topic:partition[:producer id]` (topic names have no ':')."""
    if not value:
        return None
    parts = value.split(":")
    if len(parts) != shape.count(":") + 1 or not all(part.lstrip("-").isdigit() for part in parts[1:]):
        raise invalid_request(f"{name}={value[:300]!r}: expected {shape}")
    numbers = [int(part) for part in parts[1:]]
    # The partition is a 32-bit integer, a producer id a 64-bit one.
    if not all(-1 <= n <= (INT32_MAX if index == 0 else INT64_MAX) for index, n in enumerate(numbers)):
        raise invalid_request(
            f"{name}={value[:300]!r}: a number is out of range (a partition is 0 to {INT32_MAX}, "
            f"a producer id 0 to {INT64_MAX})"
        )
    return (parts[0], *numbers)


@router.get("/groups/{group_id:path}")
@console_page
async def group_page(
    request: Request,
    group_id: str,
    pool: PoolDep,
    members_after: str | None = None,
    offsets_after: str | None = None,
    pending_after: str | None = None,
):
    """One consumer group: members and their assignment, committed offsets with lag, and pending
    transactional offsets."""
    group_id = _id_from(group_id, request)
    if not group_id:
        return RedirectResponse("/console/groups", 303)
    view = visibility(request)
    view.require(Operation.DESCRIBE, ResourceType.GROUP, group_id)
    offsets_key = _parse_key("offsets_after", offsets_after, "topic:partition")
    pending_key = _parse_key("pending_after", pending_after, "topic:partition:producer_id")
    async with snapshot(pool) as conn:
        group = await groups.get(conn, group_id)
        if group is None:
            raise BrokerError(
                ErrorCode.GROUP_ID_NOT_FOUND,
                f"group {group_id!r} does not exist: a group exists once a member heartbeats or "
                f"offsets are committed for it",
            )
        members = await group_summaries.member_page(conn, group_id, members_after, PAGE_SIZE + 1)
        # The offsets and pending offsets of the topics the principal may Describe, as the API's.
        offsets, more_offsets = await visible_page(
            lambda after, limit: group_summaries.offset_page(conn, group_id, after, limit),
            offsets_key,
            PAGE_SIZE,
            lambda o: view.topic(o.topic),
            lambda o: (o.topic, o.partition),
        )
        pending, more_pending = await visible_page(
            lambda after, limit: group_summaries.pending_offsets(conn, group_id, after, limit),
            pending_key,
            PAGE_SIZE,
            lambda q: view.topic(q.topic),
            lambda q: (q.topic, q.partition, q.producer_id),
        )
    more_members = len(members) > PAGE_SIZE
    # A Kafka group's rebalance state, the protocol its members chose and its leader, as Kafka's
    # DescribeGroups shows them; an HTTP group's are the server's range assignment.
    protocol_type, state, protocol = classic_groups.group_kind(group, len(members))
    classic = classic_groups.classic_state(group) or {}
    kafka_members = classic.get("members", {})
    # A KIP-848 consumer group's members: their epochs, clients and partitions still being revoked.
    consumer = consumer_groups.consumer_state(group) or {}
    consumer_members = {
        member_id: {
            "member_epoch": m["member_epoch"],
            "client_id": m.get("client_id", ""),
            "client_host": m.get("client_host", ""),
            "group_instance_id": m.get("instance_id"),
            "revoking": {topic: parts for topic, parts in m["revoking"].items() if view.topic(topic)},
        }
        for member_id, m in consumer.get("members", {}).items()
    }
    # An HTTP group's members: the partitions they have still to revoke, and those of their
    # assignment another member has still to revoke (the revocation barrier, http_revocations).
    http_members = {}
    for m in members[:PAGE_SIZE]:
        barrier = http_revocations.member_barrier(group.assignment, m.member_id)
        if barrier is not None:
            http_members[m.member_id] = {
                name: {topic: parts for topic, parts in partitions.items() if view.topic(topic)}
                for name, partitions in zip(("revoking", "awaiting"), barrier)
            }
    group, members = view.group_members(group, members[:PAGE_SIZE])
    return render(
        request,
        "group.html",
        nav="groups",
        group=group,
        state=state,
        protocol_type=protocol_type,
        protocol=protocol,
        leader=classic.get("leader") if kafka_members else None,
        kafka_members=kafka_members,
        consumer_members=consumer_members,
        http_members=http_members,
        assignment_epoch=consumer.get("assignment_epoch") if consumer_members else None,
        members=members,
        offsets=offsets,
        lag_total=sum(o.lag or 0 for o in offsets),
        lag_bounded=any(o.lag_bounded for o in offsets),
        markers_counted=group_offsets.MARKERS_COUNTED,
        pending=view.ids_shown(pending),
        members_after=members_after,
        offsets_after=offsets_after,
        pending_after=pending_after,
        next_members_after=members[-1].member_id if more_members else None,
        next_offsets_after=f"{offsets[-1].topic}:{offsets[-1].partition}" if more_offsets else None,
        next_pending_after=(
            f"{pending[-1].topic}:{pending[-1].partition}:{pending[-1].producer_id}" if more_pending else None
        ),
    )


# The doors an audit entry may name, and the node's own entries.
AUDIT_SOURCES = (*(source.value for source in AuditSource), principals.SERVER_SOURCE)
AUDIT_SCAN_BUDGET = 10_000  # audit entries one filtered page may read


@router.get("/audit")
@console_page
async def audit_page(
    request: Request,
    pool: PoolDep,
    before: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
    source: str = "",
    principal: str = "",
    action: str = "",
):
    """The audit log, newest first (what GET /v1/audit shows, with its Describe on the Cluster), by
    door, principal or action."""
    visibility(request).require(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_RESOURCE)
    if source and source not in AUDIT_SOURCES:
        raise invalid_request(f"source={source[:100]!r} is not a door: expected one of {list(AUDIT_SOURCES)}")
    async with snapshot(pool) as conn:
        found = await audit_trail.audit_page(
            conn, before, source or None, principal or None, action or None, PAGE_SIZE, AUDIT_SCAN_BUDGET
        )
    return render(
        request,
        "audit.html",
        nav="audit",
        page=found,
        before=before,
        source=source,
        principal=principal,
        action=action,
        sources=AUDIT_SOURCES,
        scan_budget=AUDIT_SCAN_BUDGET,
    )


@router.get("/{rest:path}")
@console_page
async def not_found(request: Request, rest: str):
    """Any other console address: a page (not the API's JSON) that leads back."""
    if not rest:
        return RedirectResponse("/console", 308)
    raise BrokerError(ErrorCode.NOT_FOUND, f"the console has no page at {request.url.path}: start from the overview")
