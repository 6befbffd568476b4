"""Prometheus metrics: requests, latencies, records in and out, per-partition high watermarks."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from app.api.auth import PrincipalDep
from app.api.deps import PoolDep
from app.coordinator import topic_admin
from app.coordinator.authorizer import CLUSTER_RESOURCE, Operation, ResourceType, authorize


class Metrics:
    """One registry per app, so several apps in one process (tests) do not share counters."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
        self.high_watermark = Gauge(
            "txbroker_partition_high_watermark",
            "next offset to be written",
            ["topic", "partition"],
            registry=self.registry,
        )
        self.last_stable_offset = Gauge(
            "txbroker_partition_last_stable_offset",
            "first offset of the earliest open transaction, or the HW",
            ["topic", "partition"],
            registry=self.registry,
        )


class MetricsMiddleware:
    """Counts and times every request by route template (pure ASGI: no per-request task overhead)."""

    def __init__(self, app, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = [500]

        async def record_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(scope["method"], route, str(status[0])).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - started)


router = APIRouter(tags=["observability"])


@router.get("/metrics", response_class=Response)
async def metrics_text(request: Request, pool: PoolDep, principal: PrincipalDep):
    """Prometheus text format. Needs Describe on the Cluster."""
    authorize(principal, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_RESOURCE)
    metrics: Metrics = request.app.state.metrics
    found = await topic_admin.describe_topics(pool)
    # Rebuilt on each scrape so deleted topics disappear.
    metrics.high_watermark.clear()
    metrics.last_stable_offset.clear()
    for topic, states in found:
        for index, state in enumerate(states):
            metrics.high_watermark.labels(topic.name, str(index)).set(state.high_watermark)
            metrics.last_stable_offset.labels(topic.name, str(index)).set(state.last_stable_offset)
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
