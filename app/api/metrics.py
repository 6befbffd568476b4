"""Prometheus metrics: HTTP and Kafka requests, their latencies and errors, records in and out,
per-partition high watermarks, the request pool's saturation.

One scrape shows the node. The counters are this process's, or, under `serve --workers N`, where a
scrape reaches one worker, every worker's: there prometheus-client runs in multiprocess mode (the
supervisor sets PROMETHEUS_MULTIPROC_DIR, a folder per node: app/runtime/metrics_folder.py), each worker
writes its values to files of its own, and a scrape sums them all, so the node's counters never go
back (Prometheus reads any drop as a restart). The partitions' high watermarks and LSOs are read
from PostgreSQL at each scrape, never kept in a process; while PostgreSQL is away a scrape answers
the counters without them.

The request pool's gauges (connections in use and idle, the most it may open, requests waiting for
a connection) are each worker's own pool, summed over the node's live workers ("livesum": the
supervisor forgets a dead worker's, app/runtime/metrics_folder.py). asyncpg keeps them in memory
only, so each worker copies them into its metric files every POOL_SAMPLE_INTERVAL_S (sample_pool),
and the worker answering a scrape copies its own at the scrape: off the hot path, where the only
cost is the waiting requests' count (app/storage/database.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated

import asyncpg
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from app.api.auth import AUTH_REQUIRED, presented_token, token_principal, unknown_token
from app.api.deps import PoolDep
from app.coordinator import topic_admin
from app.coordinator.authorizer import ANONYMOUS, CLUSTER_RESOURCE, Operation, Principal, ResourceType, authorize
from app.coordinator.health import CONNECTION_ERRORS, PoolUsage, pool_usage
from app.runtime.metrics_folder import MULTIPROCESS_DIR_VARIABLE

# A counter's and a histogram's `_created` series (when its labels were first seen) exist only in
# one process: the multiprocess mode of `serve --workers N` has none. Left out everywhere, a scrape
# shows the same series whatever the number of workers, and half as many.
disable_created_metrics()

# How often each worker copies its pool's usage into its metric files (sample_pool): a scrape shows the
# other workers' as they were at most this long before.
POOL_SAMPLE_INTERVAL_S = 1.0
# How long a scrape waits for a pooled connection to read the partitions' gauges: with every one
# busy (when the pool's gauges matter most) it answers without them rather than wait its turn.
SCRAPE_CONNECTION_WAIT_S = 1.0
# With `auth` required, how long after this worker last found a scrape's API key valid the key is
# still believed when PostgreSQL cannot check it again within SCRAPE_CONNECTION_WAIT_S (it is away,
# or every pooled connection is busy): the scrape is then answered, as the counters matter most
# then, rather than 503 or a wait. A key revoked meanwhile is refused at the first scrape whose check
# PostgreSQL answers. Five minutes: an outage's length in the scrapes of a Prometheus that scrapes every 15 s.
SCRAPE_KEY_BELIEVED_S = 300.0
# The most keys a worker keeps for that (the scrapers of a node are few; an old key goes first).
SCRAPE_KEYS_KEPT = 64


class Metrics:
    """One registry per app, so several apps in one process (tests) do not share counters; `node`:
    what a scrape reports them from (this registry, or every worker's files)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        folder = os.environ.get(MULTIPROCESS_DIR_VARIABLE)
        # In multiprocess mode the values live in the folder's files (prometheus-client chose the
        # mode when imported, from the same variable), whatever registry holds the counters.
        self.node: Collector = self.registry if not folder else MultiProcessCollector(None, folder)
        self.requests = Counter(
            "txbroker_http_requests", "HTTP requests served", ["method", "route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "txbroker_http_request_seconds", "time to serve a request", ["route"], registry=self.registry
        )
        self.records_produced = Counter("txbroker_records_produced", "records appended", registry=self.registry)
        self.records_fetched = Counter(
            "txbroker_records_fetched", "records returned by fetches", registry=self.registry
        )
        self.fetches_read_ahead = Counter(
            "txbroker_kafka_fetches_read_ahead",
            "Kafka Fetch requests answered from a read made while the client parsed the answer before",
            registry=self.registry,
        )
        self.kafka_requests = Counter(
            "txbroker_kafka_requests",
            "Kafka requests served, by API (Kafka's name of it)",
            ["api"],
            registry=self.registry,
        )
        self.kafka_request_errors = Counter(
            "txbroker_kafka_request_errors",
            "error codes in the Kafka door's answers, one per occurrence, by API and Kafka's name of the "
            "code (NONE not counted); CONNECTION_CLOSED: a request answered by closing its connection",
            ["api", "error"],
            registry=self.registry,
        )
        self.kafka_latency = Histogram(
            "txbroker_kafka_request_seconds", "time to answer a Kafka request", ["api"], registry=self.registry
        )
        self.fetch_reads_ahead_unused = Counter(
            "txbroker_kafka_fetch_reads_ahead_unused",
            "reads made ahead for a Kafka connection's next Fetch that no Fetch took "
            "(another request came, or none in time)",
            registry=self.registry,
        )
        # Gauges of every live worker's pool, summed (the module docstring): the node's connections and
        # waiting requests; a worker that died has its values forgotten.
        self.pool_connections = Gauge(
            "txbroker_database_pool_connections",
            "connections of the request pools to PostgreSQL, by state (in_use, idle)",
            ["state"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.pool_max_connections = Gauge(
            "txbroker_database_pool_max_connections",
            "the most connections the request pools may open (database_pool_size per worker)",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.pool_waiting_requests = Gauge(
            "txbroker_database_pool_waiting_requests",
            "requests waiting for a connection of the request pools",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.scrape_keys = ScrapeKeys()

    def note_pool_usage(self, usage: PoolUsage) -> None:
        self.pool_connections.labels("in_use").set(usage.in_use)
        self.pool_connections.labels("idle").set(usage.idle)
        self.pool_max_connections.set(usage.max_size)
        self.pool_waiting_requests.set(usage.waiting)

    async def sample_pool(self, pool: asyncpg.Pool, interval_s: float = POOL_SAMPLE_INTERVAL_S) -> None:
        """Notes `pool`'s usage every `interval_s` until cancelled (the server stops)."""
        while True:
            self.note_pool_usage(pool_usage(pool))
            await asyncio.sleep(interval_s)

    def count_kafka_request(self, api: str, seconds: float, errors: Iterable[str]) -> None:
        """A request of the Kafka door (app/kafka/request_metrics.py): `api` Kafka's name of its API,
        `errors` Kafka's names of the error codes its answer carried."""
        self.kafka_requests.labels(api).inc()
        self.kafka_latency.labels(api).observe(seconds)
        for error in errors:
            self.kafka_request_errors.labels(api, error).inc()


class ScrapeKeys:
    """The API keys a worker lately found valid for a scrape (SCRAPE_KEY_BELIEVED_S), by their
    SHA-256: the key itself is not kept.

    Checks of one key may overlap (concurrent scrapes), and one that began before the key was
    revoked may end after another found it revoked: its "valid" is then older than that finding
    and must not make the key believed again (it did, and a revoked key was answered 200 while the
    pool was busy). So each check is a `KeyCheck` numbered at its start, and a key found invalid
    is remembered as refuted from then on while other checks of it are in flight; a valid finding
    of a check that began before that is not kept. Only keys being checked are remembered so (a
    flood of bad keys evicts none of the keys found valid)."""

    def __init__(self) -> None:
        self._checked: dict[bytes, tuple[Principal, float]] = {}
        self._started = 0  # the number of the latest check begun
        self._in_flight: dict[bytes, int] = {}  # by digest, how many checks of the key run
        self._refuted: dict[bytes, int] = {}  # by digest, the latest check begun when the key was found invalid

    @staticmethod
    def _digest(token: str) -> bytes:
        return hashlib.sha256(token.encode()).digest()

    def begin_check(self, token: str) -> KeyCheck:
        digest = self._digest(token)
        self._started += 1
        self._in_flight[digest] = self._in_flight.get(digest, 0) + 1
        return KeyCheck(digest, self._started)

    def found_valid(self, check: KeyCheck, principal: Principal, now_s: float) -> None:
        digest = check.digest
        if check.number <= self._refuted.get(digest, 0):
            return  # begun before a check that found the key invalid: that finding stands
        self._checked.pop(digest, None)  # moved to the end: the dict is in order of last check
        self._checked[digest] = (principal, now_s)
        while len(self._checked) > SCRAPE_KEYS_KEPT:
            del self._checked[next(iter(self._checked))]

    def found_invalid(self, check: KeyCheck) -> None:
        """PostgreSQL found the key unknown or revoked: checks of it begun until now find nothing."""
        self._checked.pop(check.digest, None)
        self._refuted[check.digest] = self._started

    def end_check(self, check: KeyCheck) -> None:
        """Every check ends so, whatever it found (a failed one found nothing, and changes nothing)."""
        digest = check.digest
        self._in_flight[digest] -= 1
        if not self._in_flight[digest]:
            del self._in_flight[digest]
            self._refuted.pop(digest, None)

    def believed(self, token: str, now_s: float) -> Principal | None:
        """The principal the key was found to belong to, if that was within SCRAPE_KEY_BELIEVED_S."""
        checked = self._checked.get(self._digest(token))
        return checked[0] if checked is not None and now_s - checked[1] <= SCRAPE_KEY_BELIEVED_S else None


@dataclass(frozen=True, slots=True)
class KeyCheck:
    digest: bytes
    number: int  # ScrapeKeys' count of checks begun, this one included


async def scrape_principal(request: Request) -> Principal:
    """Who scrapes: as for any request (app/api/auth.py), but with a bounded wait for PostgreSQL to
    check the key, and, when it cannot, the key believed if this worker found it valid lately
    (SCRAPE_KEY_BELIEVED_S). Before, a scrape with `auth` required waited its turn for a pooled
    connection, and answered 503 while PostgreSQL was away: no counters when they matter most."""
    if request.app.state.settings.auth != AUTH_REQUIRED:
        return ANONYMOUS
    token = presented_token(request)
    keys: ScrapeKeys = request.app.state.metrics.scrape_keys
    check = keys.begin_check(token)
    try:
        principal = await token_principal(request, token, wait_for_connection_s=SCRAPE_CONNECTION_WAIT_S)
    except CONNECTION_ERRORS:  # TimeoutError among them
        believed = keys.believed(token, time.monotonic())
        if believed is None:
            raise
        return believed
    else:
        if principal is None:
            keys.found_invalid(check)
            raise unknown_token()
        keys.found_valid(check, principal, time.monotonic())
        return principal
    finally:
        keys.end_check(check)


class _Scrape:
    """What one scrape shows: the node's counters, then the partitions' gauges as read just now."""

    def __init__(self, counters: Collector, gauges: list[GaugeMetricFamily]) -> None:
        self.counters = counters
        self.gauges = gauges

    def collect(self) -> Iterable:
        yield from self.counters.collect()
        yield from self.gauges


def route_label(route) -> str:
    """The route's template, as the label always had it: the group routes match their id with a
    convertor of their own (app/api/groups.py: it may hold "/"), which the label leaves out, so the
    group routes' labels stay what they were before it."""
    path = getattr(route, "path", None)
    return "unmatched" if path is None else path.replace(":group_id}", "}")


# The methods a label names; any other a client sends (HTTP lets it invent them: PROPFIND, FOO) is
# counted as OTHER_METHOD, as OpenTelemetry's http.request.method counts it, so that no client can
# add series at will.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
OTHER_METHOD = "_OTHER"


def method_label(method: str) -> str:
    return method if method in KNOWN_METHODS else OTHER_METHOD


class MetricsMiddleware:
    """Counts and times every request by route template (pure ASGI: no per-request task overhead)."""

    def __init__(self, app, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500
        counted = False

        def count() -> None:
            nonlocal counted
            if not counted:
                counted = True
                route = route_label(scope.get("route"))
                self.metrics.requests.labels(method_label(scope["method"]), route, str(status)).inc()
                self.metrics.latency.labels(route).observe(time.perf_counter() - started)

        async def counting_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                count()  # before the response's end leaves: a client that has it finds it counted
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            count()  # a request that ended without a whole response


router = APIRouter(tags=["observability"])


@router.get("/metrics", response_class=Response)
async def metrics_text(request: Request, pool: PoolDep, principal: Annotated[Principal, Depends(scrape_principal)]):
    """Prometheus text format. Needs Describe on the Cluster."""
    authorize(principal, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_RESOURCE)
    metrics: Metrics = request.app.state.metrics
    # This worker's pool as it is now, before the scrape waits for a connection of it itself.
    metrics.note_pool_usage(pool_usage(pool))
    try:
        found = await topic_admin.describe_topics(pool, wait_for_connection_s=SCRAPE_CONNECTION_WAIT_S)
    except CONNECTION_ERRORS:  # TimeoutError (no pooled connection free in time) among them: an OSError
        # PostgreSQL away, or every pooled connection busy: the counters, which are the node's own,
        # are answered all the same (the 503s and closed Kafka connections they are counting, and the
        # pool's saturation, are what an operator looks for then), the partitions' gauges left out
        # until a connection answers again.
        found = []
    # Built on each scrape, so deleted topics disappear and every worker answers the same.
    high_watermark = GaugeMetricFamily(
        "txbroker_partition_high_watermark", "next offset to be written", labels=["topic", "partition"]
    )
    last_stable_offset = GaugeMetricFamily(
        "txbroker_partition_last_stable_offset",
        "first offset of the earliest open transaction, or the HW",
        labels=["topic", "partition"],
    )
    for topic, states in found:
        for index, state in enumerate(states):
            high_watermark.add_metric([topic.name, str(index)], state.high_watermark)
            last_stable_offset.add_metric([topic.name, str(index)], state.last_stable_offset)
    scrape = _Scrape(metrics.node, [high_watermark, last_stable_offset])
    return Response(generate_latest(scrape), media_type=CONTENT_TYPE_LATEST)
