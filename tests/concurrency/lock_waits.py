"""Deterministic interleavings: a test parks requests at a PostgreSQL lock its own session holds,
and waits until they are parked there before it lets them go (never a sleep)."""

from __future__ import annotations

import asyncio
import time

import asyncpg

LOCK_WAIT_TIMEOUT_S = 30


async def wait_for_lock_waits(observer: asyncpg.Connection, count: int) -> None:
    """Until `count` sessions of the test's database wait for a lock (heavyweight: a row, an insert
    of a key being inserted, an advisory lock)."""
    deadline = time.monotonic() + LOCK_WAIT_TIMEOUT_S
    while (
        await observer.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        < count
    ):
        assert time.monotonic() < deadline, f"fewer than {count} sessions reached the lock they were to wait for"
        await asyncio.sleep(0.005)
