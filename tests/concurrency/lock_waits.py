"""Deterministic interleavings: a test parks requests at a PostgreSQL lock its own session holds,
and waits until they are parked there before it lets them go (never a sleep)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

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


async def parked_in_turn(database_url: str, lock_sql: str, lock_args: tuple, *calls: Callable[[], Any]) -> list[Any]:
    """Each of `calls` (blocking: each runs in a thread of its own) started in turn while the test
    holds the lock `lock_sql` takes, the next one once the one before waits for a lock; once all
    wait, the lock is let go. Their answers, in their order."""
    observer = await asyncpg.connect(database_url)
    holder = await asyncpg.connect(database_url)
    try:
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute(lock_sql, *lock_args)
        started = []
        for waiting, call in enumerate(calls, start=1):
            started.append(asyncio.create_task(asyncio.to_thread(call)))
            await wait_for_lock_waits(observer, waiting)
        await transaction.rollback()
        return [await answer for answer in started]
    finally:
        await holder.close()
        await observer.close()


async def in_a_deadlock(
    database_url: str, held: tuple[str, tuple], closing: tuple[str, tuple], call: Callable[[], Any]
) -> Any:
    """`call` (blocking: run in a thread) started while the test holds the lock `held` takes (a
    statement and its arguments), and once it waits for that lock, the cycle closed by the test's
    asking for the lock `closing` takes, which `call` holds: PostgreSQL rolls `call`'s PostgreSQL
    transaction back, never the test's (whose session never checks for a deadlock). The test then
    lets both locks go. `call`'s answer."""
    observer = await asyncpg.connect(database_url)
    holder = await asyncpg.connect(database_url)
    try:
        await holder.execute("SET deadlock_timeout = '1h'")
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute(held[0], *held[1])
        answer = asyncio.create_task(asyncio.to_thread(call))
        await wait_for_lock_waits(observer, 1)
        await holder.execute(closing[0], *closing[1])  # granted once PostgreSQL has rolled `call` back
        await transaction.rollback()
        return await answer
    finally:
        await holder.close()
        await observer.close()
