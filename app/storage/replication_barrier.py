"""Reads answer only what the synchronous standby has (docs/operations-high-availability.md).

With a synchronous standby, PostgreSQL's COMMIT returns once the standby has the transaction's WAL,
and until then other sessions do not see it. But a transaction whose wait for the standby ends
otherwise becomes visible on the primary without being on the standby: its session cancelled
(`pg_cancel_backend`, asyncpg cancelling the query of a cancelled task) or terminated
(`pg_terminate_backend`, a fast shutdown), or the primary restarted after a crash (its recovery
replays every commit of its own WAL). A reader could then act on records that a failover to the
standby loses, and whose offsets it gives to other records. Kafka never shows a consumer what not
every in-sync replica has: its high watermark stays below.

The barrier: after a read, a tiny transaction that writes WAL commits, and its COMMIT returns
(waiting for the standby, like any write's) only once the standby has its WAL, which comes after
the commit record of every transaction the read saw. So once it returns normally, the standby has
everything the read saw, and the read may be answered. It needs no table and no privilege:
`pg_logical_emit_message` (transactional) writes a WAL record that a standby ignores, and takes the
transaction id that makes its COMMIT wait. A barrier's COMMIT whose wait was cancelled also returns
normally, but with a WARNING (which the pool's connections note: database.py): such a barrier
confirms nothing, and the next one is committed.

One barrier serves every read of a server process that ended before it began: the reads that end
while one is committed wait for the next, which starts when it returns. Without a synchronous
standby (`synchronous_standby_names` empty, or `synchronous_commit` local or off, the embedded
PostgreSQL's case) there is nothing to wait for, and no barrier is committed; the settings are
read again every RECHECK_INTERVAL_S, since a failover tool changes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol, TypeVar

import asyncpg

from app.storage.database import CONNECTION_ERRORS

log = logging.getLogger(__name__)

# How often whether the server has synchronous standbys is read again (Patroni, pg_auto_failover
# change synchronous_standby_names as standbys come and go).
RECHECK_INTERVAL_S = 10.0

# How long a read with no time left to wait (a max_wait of 0, or spent; ListOffsets) still waits for
# its barrier: a standby that confirms within it is not mistaken for one that is away.
READ_WAIT_MIN_S = 1.0

_SYNCHRONOUS_SQL = """
SELECT current_setting('synchronous_standby_names') <> ''
   AND current_setting('synchronous_commit') NOT IN ('local', 'off')
"""
# In a transaction of its own (one statement outside a transaction block): its COMMIT waits.
_BARRIER_SQL = "SELECT pg_logical_emit_message(true, 'txbroker.replication_barrier', '')"


async def commit_waits_for_the_standby(conn: asyncpg.Connection) -> None:
    """Makes the caller's PostgreSQL transaction (open on `conn`, a pooled connection) commit as a
    write does: its COMMIT returns once the synchronous standby has its WAL, which comes after every
    commit it read. For a transaction that answers "done" from what it read and wrote nothing: a
    retry that finds its earlier attempt's work done. That attempt's COMMIT may have returned without
    the standby's confirmation (answered a retriable error: database.py), and a transaction that only
    read has no transaction id, so PostgreSQL lets its COMMIT return at once: the retry would
    acknowledge what a failover loses. (Most such retries need nothing of this: a row they lock
    gives their transaction an id and a WAL record, and their COMMIT waits anyway.) A cancelled wait
    is noted like any COMMIT's, and the block raises CommitNotReplicated. Without a synchronous
    standby it costs its transaction a small WAL record and a transaction id: meant for paths off the
    hot ones."""
    await conn.execute(_BARRIER_SQL)


class ReadResult(Protocol):
    def leave_out_unconfirmed(self) -> None:
        """Drops what was read past the reader's position (its records, its watermarks beyond)."""


Result = TypeVar("Result", bound=ReadResult)


class ReplicationBarrier:
    """A server process's barrier, over its pool (one connection while a barrier commits)."""

    def __init__(self, pool: asyncpg.Pool, recheck_interval_s: float = RECHECK_INTERVAL_S) -> None:
        self._pool = pool
        self._recheck_interval_s = recheck_interval_s
        self._synchronous: bool | None = None  # None: not known yet
        self._checked_at = 0.0
        self._check: asyncio.Task | None = None
        self._next: asyncio.Future | None = None  # the barrier that reads ended since the last began wait for
        self._committing: asyncio.Task | None = None
        self.committed = 0  # barriers that confirmed (the tests count them)

    async def confirm(self, wait_s: float) -> bool:
        """True once the synchronous standby has everything that reads ended before this call saw
        (at once without a synchronous standby); False when it has not confirmed within wait_s. A
        lost connection (a failover) is raised: nothing read before it is confirmed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        if not await self._synchronous_now(deadline):
            return True
        if self._next is None:
            self._next = loop.create_future()
            self._next.add_done_callback(_retrieved)
            if self._committing is None:
                self._committing = asyncio.create_task(self._commit_barriers(), name="replication-barrier")
        try:
            await asyncio.wait_for(asyncio.shield(self._next), max(deadline - loop.time(), 0))
        except TimeoutError:
            return False
        return True

    async def answer(self, results: list[Result], deadline: float) -> list[Result]:
        """A fetch's results, once the synchronous standby has what they were read from, waiting
        until the fetch's deadline (the loop's time), and at least READ_WAIT_MIN_S; past it, each
        result leaves out what it read past its position: the answer of a reader caught up."""
        if not await self.confirm(max(deadline - asyncio.get_running_loop().time(), READ_WAIT_MIN_S)):
            for result in results:
                result.leave_out_unconfirmed()
        return results

    async def start(self) -> None:
        """Reads whether the server has a synchronous standby, before the first read needs to know
        (it would otherwise wait for a connection of the pool to ask). A database away now is asked
        again by the first read."""
        try:
            await self._read_settings()
        except CONNECTION_ERRORS as error:
            log.warning("whether PostgreSQL has a synchronous standby is not known yet (%s)", error)

    async def stop(self) -> None:
        """Ends the barrier being committed, if any (the server stops): the pool's close waits for
        its connection, which a standby away would hold for good. Its COMMIT, its wait cancelled,
        commits on the primary alone, which costs nothing: it carries no data."""
        for task in (self._committing, self._check):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _synchronous_now(self, deadline: float) -> bool:
        """Whether barriers are needed: the settings as last read, read again in the background
        once they are RECHECK_INTERVAL_S old; the first read is awaited (within the deadline: a
        server too slow to say is assumed to have a synchronous standby)."""
        loop = asyncio.get_running_loop()
        due = loop.time() >= self._checked_at + self._recheck_interval_s
        if due and self._check is None:
            self._check = asyncio.create_task(self._read_settings(), name="replication-barrier-check")
            self._check.add_done_callback(_retrieved)
        if self._synchronous is not None or self._check is None:
            return bool(self._synchronous)
        try:
            return await asyncio.wait_for(asyncio.shield(self._check), max(deadline - loop.time(), 0))
        except TimeoutError:
            return True

    async def _read_settings(self) -> bool:
        try:
            async with self._pool.acquire() as conn:
                synchronous = bool(await conn.fetchval(_SYNCHRONOUS_SQL))
        finally:
            self._check = None
        if synchronous != self._synchronous:
            log.info(
                "replication barrier %s: the server has %s synchronous standby",
                "on" if synchronous else "off",
                "a" if synchronous else "no",
            )
        self._synchronous = synchronous
        self._checked_at = asyncio.get_running_loop().time()
        return synchronous

    async def _commit_barriers(self) -> None:
        """Commits a barrier for each set of reads, one after the other, while reads wait."""
        try:
            while self._next is not None:
                begun, self._next = self._next, None
                try:
                    await self._commit_one()
                except Exception as error:  # noqa: BLE001 - the reads waiting for it are told
                    if not begun.done():
                        begun.set_exception(error)
                    continue
                self.committed += 1
                if not begun.done():
                    begun.set_result(None)
        finally:
            self._committing = None

    async def _commit_one(self) -> None:
        """Commits barriers until one's wait for the standby ended with its confirmation (the pool's
        connections note a cancelled wait: database.py)."""
        async with self._pool.acquire() as conn:
            await conn.execute(_BARRIER_SQL)
            while (cancelled := conn.take_cancelled_replication_wait()) is not None:
                log.warning(
                    "a replication barrier's wait for the synchronous standby was cancelled (%s): "
                    "committing another; reads wait for it",
                    cancelled.message,
                )
                await conn.execute(_BARRIER_SQL)


def _retrieved(future: asyncio.Future) -> None:
    # A failure no read waited for any more (they timed out, or the check ran in the background) is
    # nobody's error: the next read that needs it meets it again.
    if not future.cancelled() and future.exception() is not None:
        log.debug("replication barrier: %r", future.exception())
