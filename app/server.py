"""The app factory: the FastAPI application and its lifespan (database, workers, readiness)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import RedirectResponse

from app.api.cross_site import CrossSiteWrites
from app.api.error_handlers import UnexpectedErrors, install_error_handlers
from app.api.loopback_hosts import LoopbackHostsOnly
from app.api.main import api_routers
from app.api.metrics import Metrics, MetricsMiddleware
from app.api.request_bodies import JsonBodies
from app.api.request_limits import LongPollSlots
from app.clock import now_ms
from app.console import error_page_of as console_error_page
from app.console import router as console_router
from app.coordinator.batched_writes import BatchedWrites
from app.coordinator.classic_groups import SessionTimeoutBounds
from app.coordinator.group_coordinator import GroupCoordinator
from app.coordinator.health import ReachabilityProbe
from app.coordinator.transaction_coordinator import TransactionCoordinator
from app.coordinator.workers import BackgroundWorkers
from app.kafka.broker_calls import BrokerCalls
from app.kafka.listener import KafkaListeners
from app.kafka.listener_addresses import node_listeners
from app.settings import Settings
from app.storage.database import CONNECTION_ERRORS, create_pool
from app.storage.log import topics
from app.storage.log.append_notifier import AppendNotifier
from app.storage.migrations import is_at_head, upgrade_to_head
from app.storage.replication_barrier import ReplicationBarrier
from app.storage.security import principals

log = logging.getLogger("txbroker")

# TXBROKER_ADMIN_TOKEN makes this principal a super user with that token.
BOOTSTRAP_SUPER_USER = "admin"


async def _migrate_once_reachable(database_url: str) -> None:
    """The migrations, as soon as PostgreSQL answers: a node started while it is unreachable (a
    failover under way, the database machine still booting) waits for it instead of exiting, as a
    running node rides out an outage. Any other failure (a refused password, a broken migration)
    still stops the start. A database already at this code's revision (a restart) is left alone
    without loading alembic."""
    while True:
        try:
            if not await is_at_head(database_url):
                await asyncio.to_thread(upgrade_to_head, database_url)
            return
        except CONNECTION_ERRORS as error:
            log.warning("PostgreSQL is unreachable (%s); starting once it answers", error)
            await asyncio.sleep(1)


async def _become_ready(app: FastAPI, settings: Settings) -> None:
    """What must be done before /v1/health answers 200, retried until PostgreSQL cooperates."""
    while True:
        try:
            async with app.state.pool.acquire() as conn:
                await topics.ensure_internal_topics(
                    conn, settings.transaction_log_partitions, settings.offsets_partitions
                )
                if settings.admin_token:
                    _log_admin_token(
                        await principals.bootstrap_super_user(
                            conn, BOOTSTRAP_SUPER_USER, settings.admin_token, now_ms()
                        )
                    )
            # After a crash: finish every transaction whose outcome was decided before serving.
            finished = await app.state.coordinator.recover_pending()
            if finished:
                log.info("recovered %d transactions left PrepareCommit/PrepareAbort", finished)
            app.state.workers.start()
            if app.state.kafka_listeners is not None:
                await app.state.kafka_listeners.start()
            app.state.ready = True
            log.info("txbroker is ready on %s", settings.public_url())
            if app.state.on_ready is not None:
                app.state.on_ready()
            return
        except Exception as error:
            log.warning("not ready yet (%s); retrying", error)
            await asyncio.sleep(1)


def _log_admin_token(found: principals.BootstrapKey) -> None:
    if found is principals.BootstrapKey.REVOKED:
        log.warning(
            "admin_token (TXBROKER_ADMIN_TOKEN) is an API key that was revoked, or replaced by a newer admin "
            "token: it stays revoked and this node bootstraps nothing; set the admin token in force, or unset it"
        )
    elif found is principals.BootstrapKey.ANOTHER_KEY:
        log.warning(
            "admin_token (TXBROKER_ADMIN_TOKEN) is the token of an API key added through the API, not of the "
            "bootstrap key: it is left as it is; give the node a token of its own, or unset it"
        )


async def _node_ready(app: FastAPI, wait_for_every_worker: Callable[[], Awaitable[None]]) -> None:
    await wait_for_every_worker()
    app.state.node_ready = True


def _kafka_listeners(app: FastAPI, settings: Settings) -> KafkaListeners | None:
    """The Kafka listeners (app/kafka), bound now so that a port in use fails the start; they serve
    once the server is ready (_become_ready). `serve` refused settings kafka_listeners refuses
    before anything started (cli.listening_refusal); an app created otherwise raises the same."""
    listeners = node_listeners(settings)
    if not listeners:
        return None
    bound = KafkaListeners(BrokerCalls(app.state), listeners)
    bound.bind()
    return bound


def create_app(
    settings: Settings,
    database_url: str,
    serve_before_ready: bool = True,
    on_ready: Callable[[], None] | None = None,
    wait_for_every_worker: Callable[[], Awaitable[None]] | None = None,
) -> FastAPI:
    """`serve_before_ready`: accept requests while starting, answering 503 until ready (a single
    server, or the first of several workers); False: start accepting only once ready (the other
    workers of `serve --workers N`, see app/runtime/worker_processes.py). `on_ready` is called once ready.
    `wait_for_every_worker` (each worker of several): /v1/health answers 503 until it returns."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.ready = False
        app.state.kafka_listeners = _kafka_listeners(app, settings)  # bound first, beside the ports `serve` holds
        await _migrate_once_reachable(database_url)
        app.state.pool = await create_pool(
            database_url, settings.database_pool_size, settings.database_idle_in_transaction_timeout_ms
        )
        app.state.reachability_probe = ReachabilityProbe(database_url)  # /v1/health's, connected when first asked
        app.state.database_url = database_url  # the Kafka listener's presence connection (node_presence.py)
        app.state.replication_barrier = ReplicationBarrier(app.state.pool)
        app.state.coordinator = TransactionCoordinator(app.state.pool, settings, app.state.replication_barrier)
        app.state.batched_writes = BatchedWrites(app.state.coordinator, settings.max_records_per_request)
        app.state.group_coordinator = GroupCoordinator(
            app.state.pool,
            app.state.coordinator,
            settings.group_initial_rebalance_delay_ms,
            SessionTimeoutBounds(settings.group_min_session_timeout_ms, settings.group_max_session_timeout_ms),
            app.state.replication_barrier,
            settings.group_consumer_session_timeout_ms,
            settings.group_consumer_heartbeat_interval_ms,
        )
        app.state.workers = BackgroundWorkers(app.state.coordinator, app.state.group_coordinator, settings)
        app.state.notifier = AppendNotifier(database_url, settings.long_poll_fallback_ms / 1000)
        app.state.group_coordinator.classic.listen_for_changes(app.state.notifier)
        await app.state.replication_barrier.start()
        await app.state.notifier.start()
        pool_sampler = asyncio.create_task(app.state.metrics.sample_pool(app.state.pool), name="pool-sampler")
        readiness = asyncio.create_task(_become_ready(app, settings), name="become-ready")
        node = None if wait_for_every_worker is None else asyncio.create_task(_node_ready(app, wait_for_every_worker))
        try:
            if not serve_before_ready:
                await readiness
            yield
        finally:
            for task in (readiness, node, pool_sampler):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if app.state.kafka_listeners is not None:
                await app.state.kafka_listeners.stop()
            await app.state.workers.stop()
            await app.state.notifier.stop()
            await app.state.replication_barrier.stop()
            await app.state.reachability_probe.close()
            await app.state.pool.close()

    app = FastAPI(
        title="txbroker",
        version="1",
        summary="Apache Kafka's transactional messaging (KIP-98) over HTTP, on PostgreSQL",
        description='The HTTP contract v1 (docs/api.md). Errors: {"error": {"code", "message", "retriable"}}.',
        lifespan=lifespan,
        # FastAPI's OpenTelemetry bridge asks the global providers whether they are configured on
        # every request, CPU spent for nothing (`python -m bench.partition_log` measures fetches);
        # txbroker's metrics are its own (/metrics).
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.ready = False
    app.state.kafka_listeners = None
    app.state.node_ready = wait_for_every_worker is None
    app.state.on_ready = on_ready
    app.state.metrics = Metrics()
    app.state.long_poll_slots = LongPollSlots(settings)
    install_error_handlers(app, console_error_page)
    for router in api_routers:
        app.include_router(router)
    app.include_router(console_router)  # the web console (HTML for people, under /console)

    @app.get("/", include_in_schema=False)
    async def root():
        return RedirectResponse("/console")

    app.add_middleware(UnexpectedErrors)
    app.add_middleware(JsonBodies, max_bytes=settings.max_request_bytes)
    app.add_middleware(CrossSiteWrites)
    if settings.auth != "required" and not settings.allow_anonymous:  # loopback only: its names only
        app.add_middleware(LoopbackHostsOnly)
    # Outermost (the last added): every request is counted, those the two checks above refuse too.
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app
