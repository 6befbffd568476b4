"""The unit of work of every request on transactional ids: one PostgreSQL transaction that locks the
ids' rows, then the partitions, writes, and saves the transaction log last.

Invariants (TransactionLog's lock order, so no two units deadlock):
- The ids' rows are locked first (`lock`, `lock_many_and_find_topics`: in id order), then the
  partitions, in lock_order, by the statement that writes them (`write_partitions`), then the
  __transaction_state partitions, by the save. A unit never takes an id's row after a partition's.
- Every metadata the unit locked is saved at its end (TransactionLog.save_statement: one statement
  for all of them, nothing when none has a transition to record), or fused into the last write
  (`write_partitions_and_save`). A unit left by an exception saves nothing: its PostgreSQL
  transaction rolls back, and with it every transition of its request.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg

from app.coordinator.transaction_metadata import TransactionMetadata
from app.errors import BrokerError
from app.storage.groups import group_offsets
from app.storage.log import markers
from app.storage.log.append import AppendResult, BatchAppend, append_batches, locks_for_appends, plan_appends
from app.storage.log.fused_writes import WriteStatement, execute_fused, fused
from app.storage.log.locks import lock_partitions
from app.storage.log.partition_log import CONTROL_COMMIT
from app.storage.log.topics import TopicInfo, find_topics
from app.storage.transactions.transaction_log import TransactionLog


class UnitOfWork:
    """A request's PostgreSQL transaction on transactional ids (see the module's invariants).
    `conn` is the transaction's connection, for the request's other reads and writes (an audit
    entry, a group's offsets), which go between the locks of the ids and the save."""

    def __init__(self, conn: asyncpg.Connection, log: TransactionLog[TransactionMetadata]) -> None:
        self.conn = conn
        self._log = log
        self._locked: dict[str, TransactionMetadata] = {}

    # ---- the ids' rows, first

    async def lock(self, transactional_id: str) -> TransactionMetadata | None:
        """The id's metadata, its row locked until the unit ends; None if the id has no row."""
        meta = await self._log.lock(self.conn, transactional_id)
        return self._track(meta)

    async def lock_new(self, meta: TransactionMetadata) -> bool:
        """Inserts a new id's row unless one exists (a racing InitProducerId may have made it); True
        when this unit created it (and logged its first state). Either way the row is then locked."""
        created = await self._log.lock_new(self.conn, meta)
        if created:
            self._track(meta)
        return created

    async def lock_many_and_find_topics(
        self, transactional_ids: list[str], topic_names: list[str]
    ) -> tuple[dict[str, TransactionMetadata], dict[str, TopicInfo]]:
        """The ids' metadata (ids without a row left out), locked in id order, and the topics that
        exist: one statement for a write batch of requests."""
        if not transactional_ids:
            return {}, await find_topics(self.conn, topic_names)
        metas, topics = await self._log.lock_many_and_find_topics(self.conn, transactional_ids, topic_names)
        for meta in metas.values():
            self._track(meta)
        return metas, topics

    async def claim(self, where_sql: str, *args) -> TransactionMetadata | None:
        """One id matching `where_sql` that no other server is working on (SKIP LOCKED), locked:
        how the background workers of several servers share the work. None when none is left."""
        claimed = await self._log.claim(self.conn, where_sql, *args, limit=1)
        return await self.lock(claimed[0]) if claimed else None

    # ---- the partitions, then the save

    async def write_partitions(
        self, appends: list[BatchAppend], ends: list[markers.TransactionEnd], now: int
    ) -> list[AppendResult | BrokerError]:
        """Appends the batches, then writes the markers of the transactions `ends` (see `_write`);
        the save follows at the unit's end."""
        return await self._write(appends, ends, now, None)

    async def write_partitions_and_save(
        self, appends: list[BatchAppend], ends: list[markers.TransactionEnd], now: int
    ) -> list[AppendResult | BrokerError]:
        """`write_partitions` with the save fused into its last statement (one round trip fewer);
        the unit's work on the ids ends here."""
        save = await self._log.save_statement(self.conn, list(self._locked.values()))
        return await self._write(appends, ends, now, save)

    async def save(self) -> None:
        """Writes the rows of the ids whose metadata changed and their transitions' records, in one
        statement (none when nothing changed). Run by `open_unit` at the unit's end."""
        statement = await self._log.save_statement(self.conn, list(self._locked.values()))
        if statement is not None:
            await statement.execute(self.conn)

    async def delete(self, meta: TransactionMetadata) -> None:
        """The expired id's row goes, its Dead record and a tombstone are logged."""
        await self._log.delete(self.conn, meta)

    def _track(self, meta: TransactionMetadata | None) -> TransactionMetadata | None:
        if meta is not None:
            self._locked[meta.transactional_id] = meta
        return meta

    async def _write(
        self,
        appends: list[BatchAppend],
        ends: list[markers.TransactionEnd],
        now: int,
        then: WriteStatement | None,
    ) -> list[AppendResult | BrokerError]:
        """Appends the batches, then writes the markers of the transactions `ends`, the rows of every
        transactional id concerned being held since an earlier statement: one statement locks every
        partition (lock_order), one writes, however many batches, partitions and transactions.
        Each append's result, as append.append_batches. `then`: the unit's last write (the
        transaction log's, which locks its partitions last), fused with the others unless consumer
        offsets are to be settled after the markers."""
        conn = self.conn
        if not ends:
            return await append_batches(conn, appends, then)
        locked = await lock_partitions(conn, locks_for_appends(appends) | markers.locks_for_markers(ends))
        appending = await plan_appends(conn, appends, locked)
        marking = markers.plan_markers(ends, locked, now)
        if appending.written_partitions & {key for end in ends for key in end.partitions}:
            # One statement cannot change a row twice (a partition's head, a producer's state
            # there): the batches are written first, by a statement of their own.
            await execute_fused(conn, appending.statement, None)
            writes = marking
        else:
            writes = fused(appending.statement, marking)
        settles = any(end.consumer_offsets_partitions for end in ends)
        await execute_fused(conn, writes, None if settles else then)
        if settles:
            for end in ends:
                for partition in end.consumer_offsets_partitions:
                    # The transaction's offsets become visible (or are discarded) with its marker
                    # there, in the same PostgreSQL transaction.
                    await group_offsets.settle(
                        conn, partition, end.producer_id, end.producer_epoch, end.control_type == CONTROL_COMMIT
                    )
            await execute_fused(conn, then, None)
        return appending.results()


@contextlib.asynccontextmanager
async def open_unit(
    pool: asyncpg.Pool, log: TransactionLog[TransactionMetadata], *, atomic: bool = True
) -> AsyncIterator[UnitOfWork]:
    """A unit of work on a connection of `pool`, saved at its end. `atomic=False` runs without
    BEGIN/COMMIT, for a caller whose only write is one statement (PostgreSQL runs it as a
    transaction of its own); such a caller locks no id."""
    async with pool.acquire() as conn, conn.transaction() if atomic else contextlib.nullcontext():
        unit = UnitOfWork(conn, log)
        yield unit
        await unit.save()
