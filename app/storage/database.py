"""The asyncpg connection pool every storage module works through."""

from __future__ import annotations

import asyncpg
import orjson

# Raised by asyncpg when PostgreSQL cannot be reached or drops the connection; the API layer maps
# these to COORDINATOR_NOT_AVAILABLE (503, retriable).
CONNECTION_ERRORS = (
    OSError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.ConnectionFailureError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.InterfaceError,
)


async def _init_connection(connection: asyncpg.Connection) -> None:
    await connection.set_type_codec(
        "jsonb",
        schema="pg_catalog",
        format="text",
        encoder=lambda value: orjson.dumps(value).decode(),
        decoder=orjson.loads,
    )


async def is_reachable(pool: asyncpg.Pool, timeout_s: float = 2) -> bool:
    """Whether PostgreSQL answers a trivial query within the timeout (for /v1/health)."""
    try:
        async with pool.acquire(timeout=timeout_s) as conn:
            await conn.fetchval("SELECT 1", timeout=timeout_s)
        return True
    except Exception:
        return False


async def _keep_session(_connection: asyncpg.Connection) -> None:
    """Pooled connections never change session state (no SET, LISTEN or session-level locks), so
    the default reset query (UNLISTEN, RESET ALL, advisory unlock: one more round trip per request)
    is not needed; asyncpg still rolls back a transaction left open."""


async def create_pool(database_url: str, size: int) -> asyncpg.Pool:
    return await asyncpg.create_pool(
        database_url,
        min_size=1,
        max_size=size,
        init=_init_connection,
        reset=_keep_session,
        # Statements are prepared per connection and reused: the hot paths are a handful of fixed
        # statements, so planning them once matters.
        max_inactive_connection_lifetime=300,
        # Every statement here is a fixed OLTP statement on keys and array parameters (unnest), for
        # which PostgreSQL's automatic choice kept planning a custom plan on every execution (bind
        # then costs the backend about as much CPU as the statement itself). A generic plan is
        # planned once per connection, which shortens every request; `python -m bench.transactions
        # --sections 1 --producers 1` measures it (docs/performance.md).
        server_settings={"plan_cache_mode": "force_generic_plan"},
    )


async def connect(database_url: str) -> asyncpg.Connection:
    """A single connection set up like the pool's (for workers that need their own, and tests)."""
    connection = await asyncpg.connect(database_url)
    await _init_connection(connection)
    return connection
