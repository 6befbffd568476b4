"""The transaction coordinator (Kafka's TransactionCoordinator): InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn, two-phase prepare (KIP-939), admin abort, and the work of the background
workers (timeouts, recovery, expiration).

Invariants:
- Every request on a transactional id is one unit of work (unit_of_work.py): a PostgreSQL
  transaction that first locks the id's row, then partition rows in `lock_order`, and saves the
  transaction log last: requests on one id serialize, and no two requests can deadlock.
- Every state change is a transition of the request's TransactionMetadata (transaction_metadata.py),
  checked against transaction_states' table and recorded for the transaction log, which the unit
  writes before the PostgreSQL transaction commits. Nothing in memory outlives the request.
- EndTxn moves Ongoing -> PrepareCommit/PrepareAbort -> markers -> CompleteCommit/CompleteAbort.
  With every partition in this database the steps share one PostgreSQL transaction; they stay
  separable: a durable PrepareX (from a crash of a coordinator that wrote them apart) answers
  CONCURRENT_TRANSACTIONS to other requests and is finished by recovery, InitProducerId or an
  EndTxn retry (markers are idempotent per partition, producer id and epoch).
- Transaction versions, chosen by the EndTxn that ends a transaction: with version 2 (KIP-890:
  HTTP, Kafka's EndTxn v5+) every transaction ends with an epoch bump, so a late request of a
  finished transaction is fenced; with version 1 (Kafka's EndTxn below v5, what Kafka clients send)
  the epoch and the sequences carry over to the next transaction, and only InitProducerId (or an
  abort by timeout or admin, which fence) bumps it. Storage names a transaction by its marker's
  offset, never by (producer id, epoch), so both are kept apart (markers.py, partition_log.ABORTED_BATCH_SQL).

This module orchestrates: it reads and locks through the unit of work, decides with the metadata's
transitions, and does the I/O the transitions need (producer ids issued, markers written).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

import asyncpg

from app.clock import now_ms
from app.coordinator.audit import Actor, record
from app.coordinator.confirmed_reads import confirmed_by_the_standby
from app.coordinator.identifiers import check_group_id, check_transactional_id
from app.coordinator.transaction_metadata import (
    TRANSACTION_VERSION_BUMP,
    TransactionMetadata,
    check_producer,
    concurrent,
    fenced,
    invalid_state,
)
from app.coordinator.transaction_states import TransactionState
from app.coordinator.unit_of_work import UnitOfWork, open_unit
from app.errors import BrokerError, ErrorCode, invalid_request
from app.settings import Settings
from app.storage.log import markers
from app.storage.log.topics import (
    CONSUMER_OFFSETS_TOPIC,
    INTERNAL_PREFIX,
    TopicInfo,
    get_topic,
    unknown_partition,
    unknown_topic,
)
from app.storage.replication_barrier import ReplicationBarrier, commit_waits_for_the_standby
from app.storage.transactions import producer_ids
from app.storage.transactions.producer_ids import ProducerIdAndEpoch
from app.storage.transactions.transaction_log import NO_START_TIME, TransactionLog, TxnPartition
from txbroker.wire import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, partition_for_key

log = logging.getLogger(__name__)

S = TransactionState


@dataclass(frozen=True, slots=True)
class EndTxnCommand:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    transaction_version: int = TRANSACTION_VERSION_BUMP


@dataclass(frozen=True, slots=True)
class AddPartitionsCommand:
    """AddPartitionsToTxn: `partitions` as (topic, partition) pairs, in the request's order.
    `all_or_nothing`: Kafka's broker's rule, which refuses the whole request when a partition is
    refused (`refused`: the front door's refusals, its authorization, one per partition or none) or
    does not exist, before the producer is looked at: nothing is added, and the partitions not at
    fault are answered None (Kafka's OPERATION_NOT_ATTEMPTED). Otherwise (HTTP's) the partitions
    that exist are added and the others answered with their error."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[tuple[str, int], ...]
    all_or_nothing: bool = False
    refused: tuple[BrokerError | None, ...] = ()


@dataclass(frozen=True, slots=True)
class AddOffsetsCommand:
    """AddOffsetsToTxn: the group whose __consumer_offsets partition joins the transaction."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str


@dataclass(frozen=True, slots=True)
class InitResult:
    producer_id: int
    producer_epoch: int
    prepared: ProducerIdAndEpoch | None = None


@dataclass(frozen=True, slots=True)
class EndResult:
    producer_id: int
    producer_epoch: int
    state: str


class TransactionCoordinator:
    """Kafka's TransactionCoordinator over this database: each request one unit of work (see the
    module's invariants)."""

    def __init__(
        self, pool: asyncpg.Pool, settings: Settings, replication_barrier: ReplicationBarrier | None = None
    ) -> None:
        """`replication_barrier`: the server's, with which the reads a person or a tool acts on
        (describe, list; topic and producer descriptions, which take it from here) are answered
        once the synchronous standby has them (confirmed_reads.py); None: answered at once."""
        self.pool = pool
        self.settings = settings
        self.replication_barrier = replication_barrier
        self.log = TransactionLog(TransactionMetadata, TransactionState.parse)

    def unit_of_work(self, *, atomic: bool = True) -> AbstractAsyncContextManager[UnitOfWork]:
        """A request's PostgreSQL transaction on transactional ids (unit_of_work.py)."""
        return open_unit(self.pool, self.log, atomic=atomic)

    # ---- completing and fencing: the transitions and the I/O they need

    async def _complete(
        self, unit: UnitOfWork, meta: TransactionMetadata, now: int, bump: bool, remember_ids: bool = False
    ) -> None:
        """PrepareCommit/PrepareAbort -> markers -> CompleteCommit/CompleteAbort. With `bump`, the epoch
        moves on and the ids that ended the transaction are remembered for an EndTxn retry; with
        `remember_ids` (transaction version 1), the ids the producer keeps are remembered."""
        await unit.write_partitions([], [meta.transaction_end()], now)
        await self._completed(unit, meta, now, bump, remember_ids)

    async def _completed(
        self, unit: UnitOfWork, meta: TransactionMetadata, now: int, bump: bool, remember_ids: bool = False
    ) -> None:
        """PrepareCommit/PrepareAbort -> CompleteCommit/CompleteAbort, the markers
        (`meta.transaction_end()`) being written in the same PostgreSQL transaction."""
        bumped = None
        if bump:
            current = ProducerIdAndEpoch(meta.producer_id, meta.producer_epoch)
            # The new epoch reaches producer_ids with the row, when the unit saves it (one statement
            # fewer); a new producer id, once epochs are exhausted, is issued here.
            bumped = producer_ids.next_epoch(current) or await producer_ids.issue(unit.conn, now, meta.transactional_id)
        meta.complete_end(now, bumped, remember_ids)

    async def _fence_and_abort(self, unit: UnitOfWork, meta: TransactionMetadata, now: int) -> None:
        """Ongoing or Prepared -> (PrepareEpochFence) -> PrepareAbort -> CompleteAbort, bumping the
        epoch first so the producer of the aborted transaction is fenced."""
        bumped = await producer_ids.bump(
            unit.conn, ProducerIdAndEpoch(meta.producer_id, meta.producer_epoch), now, meta.transactional_id
        )
        meta.fence(bumped, now)
        await self._complete(unit, meta, now, bump=False)

    # ---- InitProducerId

    async def init_producer_id(
        self,
        transactional_id: str | None,
        timeout_ms: int,
        producer_id: int,
        producer_epoch: int,
        keep_prepared: bool = False,
        principal: str | None = None,
    ) -> InitResult:
        """`principal`: who asks, None for a super user (every caller with auth off). The
        per-principal quota of transactional ids applies to it, and an idempotent producer id it is
        issued is its own: only it may bump the id's epoch (another gets a new id)."""
        if transactional_id is not None:
            check_transactional_id(transactional_id)  # first, as Kafka checks an empty one
        if (producer_id == NO_PRODUCER_ID) != (producer_epoch == NO_PRODUCER_EPOCH):
            # Kafka's broker refuses this too (KafkaApis.handleInitProducerIdRequest). Taken as given,
            # an id with epoch -1 read as the retry of a bump from -1 and answered the live
            # producer's own ids: a second holder, whose batches were answered as duplicates.
            raise invalid_request(
                f"producer_id {producer_id} and producer_epoch {producer_epoch}: expected both -1 (a new "
                f"producer, or the transactional id's current one) or both the producer's current ones (to "
                f"bump its epoch, KIP-360); send both or neither"
            )
        now = now_ms()
        async with self.unit_of_work() as unit:
            if transactional_id is None:
                return await self._init_idempotent(unit.conn, producer_id, producer_epoch, now, principal)
            if not 1 <= timeout_ms <= self.settings.transaction_max_timeout_ms:
                raise BrokerError(
                    ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                    f"transaction_timeout_ms is {timeout_ms}: expected 1 to {self.settings.transaction_max_timeout_ms} "
                    f"(the server's transaction_max_timeout_ms)",
                )
            meta = await unit.lock(transactional_id)
            if meta is None and principal is not None:
                # A principal's creations serialize on its quota (or two concurrent ones both passed
                # its count); the one waited for may have created this very id, then re-initialized.
                await self.log.hold_creations_by(unit.conn, principal)
                meta = await unit.lock(transactional_id)
            if meta is None:
                await self._check_quota(unit.conn, principal, transactional_id)
                issued = await producer_ids.issue(unit.conn, now, transactional_id)
                fresh = TransactionMetadata(
                    transactional_id,
                    issued.producer_id,
                    issued.producer_epoch,
                    S.EMPTY,
                    timeout_ms,
                    NO_START_TIME,
                    now,
                    principal=principal,
                )
                if await unit.lock_new(fresh):
                    return InitResult(issued.producer_id, issued.producer_epoch)
                meta = await unit.lock(transactional_id)  # a racing init created it first
            return await self._reinit(unit, meta, timeout_ms, producer_id, producer_epoch, keep_prepared, now)

    async def _check_quota(self, conn: asyncpg.Connection, principal: str | None, transactional_id: str) -> None:
        if principal is None:
            return
        limit = self.settings.max_transactional_ids_per_principal
        if await self.log.count_created_by(conn, principal) >= limit:
            raise BrokerError(
                ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                f"principal {principal!r} already created {limit} transactional ids (setting "
                f"max_transactional_ids_per_principal), so {transactional_id!r} cannot be created: reuse an id, "
                f"or let idle ones expire",
            )

    async def _init_idempotent(
        self, conn: asyncpg.Connection, producer_id: int, producer_epoch: int, now: int, principal: str | None
    ) -> InitResult:
        # KIP-360: an idempotent producer bumps its own epoch after an error to reset its sequences.
        issued = None if producer_id == NO_PRODUCER_ID else await producer_ids.lookup(conn, producer_id)
        if issued is None or (principal is not None and issued.principal != principal):
            # A new id, as Kafka answers every InitProducerId without a transactional id: when none
            # is named; when the server no longer knows the one named (expired: kafka-python asks
            # the bump with it after UNKNOWN_PRODUCER_ID; nothing was issued under it since); and
            # when it is not the caller's, for a bump would fence another principal's producer on
            # every partition, ids being issued in sequence (a new id tells nothing of the one named).
            fresh = await producer_ids.issue(conn, now, principal=principal)
            return InitResult(fresh.producer_id, fresh.producer_epoch)
        if issued.transactional_id is not None:
            raise unknown_producer(producer_id)
        issued_epoch = issued.producer_epoch
        # The producer may have started epochs above the one issued itself (produce takes them, as
        # Kafka's leaders do): the bump goes above every epoch it wrote with, else its next batch,
        # at sequence 0 of an epoch it already wrote, would be taken for a duplicate and dropped.
        current = max(issued_epoch, await producer_ids.highest_epoch_written(conn, producer_id) or 0)
        if producer_epoch == issued_epoch - 1 and current == issued_epoch:
            # The retry of a bump whose answer was lost: answer the epoch it issued. An idempotent
            # producer id has one holder (no transactional id to share), so this fences no one. That
            # bump's commit may not be on the synchronous standby (its answer was a retriable error),
            # and this answer, read without a lock or a write, would not wait for it: it waits.
            await commit_waits_for_the_standby(conn)
            return InitResult(producer_id, issued_epoch)
        if not issued_epoch <= producer_epoch <= current:
            raise BrokerError(
                ErrorCode.PRODUCER_FENCED if producer_epoch < issued_epoch else ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer {producer_id} asked to bump epoch {producer_epoch}, but its current "
                f"epoch is {current}: send the current epoch, or -1/-1 for a new producer id",
            )
        bumped = await producer_ids.bump(conn, ProducerIdAndEpoch(producer_id, current), now, principal=principal)
        return InitResult(bumped.producer_id, bumped.producer_epoch)

    async def _reinit(
        self,
        unit: UnitOfWork,
        meta: TransactionMetadata,
        timeout_ms: int,
        producer_id: int,
        producer_epoch: int,
        keep_prepared: bool,
        now: int,
    ) -> InitResult:
        given = (producer_id, producer_epoch)
        if (
            given != (NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
            and given == (meta.last_producer_id, meta.last_producer_epoch)
            and meta.state in (S.EMPTY, S.PREPARED)
        ):
            # KIP-360: the retry of a bump whose answer was lost (nothing happened since: a new
            # instance's InitProducerId, or a transaction beginning, forgets the ids). Answer what
            # that bump issued, bumping nothing: no other instance can hold these ids.
            return InitResult(meta.producer_id, meta.producer_epoch, meta.kept_prepared())
        if given != (NO_PRODUCER_ID, NO_PRODUCER_EPOCH) and given != (meta.producer_id, meta.producer_epoch):
            raise fenced(meta, producer_id, producer_epoch)
        state = meta.state
        if state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            await self._complete(unit, meta, now, bump=True)
        elif state == S.PREPARE_EPOCH_FENCE:
            meta.abort_fenced(now)
            await self._complete(unit, meta, now, bump=False)
        elif state == S.ONGOING or (state == S.PREPARED and not keep_prepared):
            await self._fence_and_abort(unit, meta, now)
        prepared = meta.kept_prepared()
        bumped = await producer_ids.bump(
            unit.conn, ProducerIdAndEpoch(meta.producer_id, meta.producer_epoch), now, meta.transactional_id
        )
        # The ids a KIP-360 bump was asked with are remembered, so its retry is recognised (above).
        retry_key = (None, None) if given == (NO_PRODUCER_ID, NO_PRODUCER_EPOCH) else given
        meta.prepare_new_producer(bumped, timeout_ms, retry_key, now)
        return InitResult(bumped.producer_id, bumped.producer_epoch, prepared)

    # ---- AddPartitionsToTxn / AddOffsetsToTxn / produce

    @staticmethod
    def add_partitions_in_batch(
        meta: TransactionMetadata | None, command: AddPartitionsCommand, topics: dict[str, TopicInfo]
    ) -> list[BrokerError | None]:
        """AddPartitionsToTxn on the id's metadata as locked by the unit of a write batch (None if it
        has no row; `topics`: the requested ones that exist, looked up by that unit): each
        partition's error or None. Raises the request's error. The unit saves the metadata, and the
        write batch answers after its commit: an added partition is durable when answered."""
        refused = command.refused or (None,) * len(command.partitions)
        resolved = [
            given or found for given, found in zip(refused, _resolve_in(topics, list(command.partitions)), strict=True)
        ]
        errors = [p if isinstance(p, BrokerError) else None for p in resolved]
        if command.all_or_nothing and any(errors):
            return errors
        meta = check_producer(meta, command.transactional_id, command.producer_id, command.producer_epoch)
        meta.prepare_add_partitions([p for p in resolved if isinstance(p, TxnPartition)], [], now_ms())
        return errors

    @staticmethod
    def add_offsets_in_batch(
        meta: TransactionMetadata | None, command: AddOffsetsCommand, offsets_topic: TopicInfo | None
    ) -> None:
        """AddOffsetsToTxn on the id's metadata as locked by the unit of a write batch, as
        `add_partitions_in_batch`: the group's __consumer_offsets partition (of `offsets_topic`, looked
        up by that unit) joins the transaction."""
        meta = check_producer(meta, command.transactional_id, command.producer_id, command.producer_epoch)
        check_group_id(command.group_id)  # it would be TxnOffsetCommit's, which no group can take
        if offsets_topic is None:  # created at start-up and never deleted: only a broken database
            raise unknown_topic(CONSUMER_OFFSETS_TOPIC)
        meta.prepare_add_partitions(
            [offsets_partition_of(offsets_topic, command.group_id)], [command.group_id], now_ms()
        )

    async def offsets_partition(self, conn: asyncpg.Connection, group_id: str) -> TxnPartition:
        """The __consumer_offsets partition that holds this group's offsets."""
        return offsets_partition_of(await get_topic(conn, CONSUMER_OFFSETS_TOPIC), group_id)

    async def lock_producer(
        self, unit: UnitOfWork, transactional_id: str, producer_id: int, producer_epoch: int
    ) -> TransactionMetadata:
        """Locks the id's row and verifies the producer, within the caller's unit of work
        (TxnOffsetCommit's first step; `join_for_offsets` follows once something is to commit)."""
        return check_producer(await unit.lock(transactional_id), transactional_id, producer_id, producer_epoch)

    async def join_for_offsets(self, unit: UnitOfWork, meta: TransactionMetadata, group_id: str) -> TxnPartition:
        """Adds the group's offsets partition to the transaction implicitly (beginning it if none is
        open); the unit saves the metadata at its end."""
        partition = await self.offsets_partition(unit.conn, group_id)
        meta.prepare_add_partitions([partition], [group_id], now_ms())
        return partition

    @staticmethod
    def join_for_produce(
        meta: TransactionMetadata | None,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        requested: list[tuple[str, int]],
        topics: dict[str, TopicInfo],
    ) -> TransactionMetadata:
        """Within the produce's unit of work, `meta` being the id's metadata as locked there (None
        if it has no row): verifies the producer against the coordinator's current state (KIP-890:
        a late request of an old transaction can never land in a new one) and adds the partitions
        implicitly. The id's row stays locked until the batches are appended, so EndTxn cannot
        write markers in between; the unit saves the metadata with its appends' write."""
        meta = check_producer(meta, transactional_id, producer_id, producer_epoch)
        valid = [p for p in _resolve_in(topics, requested) if isinstance(p, TxnPartition)]
        meta.prepare_add_partitions(valid, [], now_ms())
        return meta

    # ---- EndTxn and prepare

    async def end_in_batch(
        self, unit: UnitOfWork, meta: TransactionMetadata | None, command: EndTxnCommand
    ) -> tuple[EndResult, markers.TransactionEnd | None]:
        """EndTxn on the id's metadata as locked by the unit of a write batch (the requests written
        together, app/coordinator/batched_writes.py): its answer, and the markers the write batch
        must write after its appends (None for a retry of the EndTxn that ended the last transaction).
        Raises the request's error. The unit saves the metadata last."""
        if meta is not None and meta.is_retry_of_last(command.producer_id, command.producer_epoch):
            outcome = S.COMPLETE_COMMIT if command.commit else S.COMPLETE_ABORT
            if meta.state != outcome:
                raise invalid_state(
                    meta,
                    f"{'commit' if command.commit else 'abort'} (its transaction already ended with {meta.state})",
                )
            return EndResult(meta.producer_id, meta.producer_epoch, meta.state), None
        meta = check_producer(meta, command.transactional_id, command.producer_id, command.producer_epoch)
        meta.prepare_end(command.commit, now_ms(), command.transaction_version)
        # Every partition lives in this database, so PrepareX, the markers and CompleteX share one
        # PostgreSQL transaction (one commit instead of two). The steps stay separable: PrepareX is
        # logged before the markers, markers are idempotent, and a PrepareX found durable (left by
        # a coordinator that wrote them separately) is finished by recovery, InitProducerId, or this
        # same EndTxn retried. The write batch writes its markers after every state change: a retry
        # of an EndTxn in the same write batch sees its transaction complete, as it would after it.
        ending = meta.transaction_end()
        await self._completed(unit, meta, now_ms(), bump=meta.ends_with_bump, remember_ids=not meta.ends_with_bump)
        return EndResult(meta.producer_id, meta.producer_epoch, meta.state), ending

    async def prepare(self, transactional_id: str, producer_id: int, producer_epoch: int) -> EndResult:
        async with self.unit_of_work() as unit:
            meta = check_producer(await unit.lock(transactional_id), transactional_id, producer_id, producer_epoch)
            meta.prepare_two_phase(now_ms())
            return EndResult(meta.producer_id, meta.producer_epoch, meta.state)

    # ---- administration

    async def admin_abort(
        self,
        transactional_id: str,
        expected: ProducerIdAndEpoch | None = None,
        *,
        expected_start_ms: int | None = None,
        actor: Actor,
    ) -> EndResult:
        """`expected`: the producer id and epoch the operator saw, and `expected_start_ms` the start
        time of the transaction they saw; if the transaction has moved on since (a new producer, or
        another transaction), nothing is aborted. Both are needed to tell transactions apart: with
        transaction version 1 (Kafka's clients) the producer id and epoch carry over from one
        transaction to the next, so an abort naming them alone aborts the producer's next
        transaction when the one seen committed meanwhile. The audit entry (`actor`: who, through
        which door) is written in the same PostgreSQL transaction as the abort: both happen or neither.

        A refusal (nothing open, moved on, no such id) is answered once the synchronous standby has
        what it found, as a write is: a retry of an abort whose COMMIT's wait for the standby was
        cancelled (answered 503) finds it done, and a client takes that refusal for "not open"
        (txbroker.two_phase's abort_open: the Spark data source's sweep). Answered at once (its
        PostgreSQL transaction rolled back, and a rollback waits for no standby), a failover brought
        the transaction back open, Prepared for good, while the sweep believed it aborted."""
        async with self.unit_of_work() as unit:
            meta = await unit.lock(transactional_id)
            refusal = _admin_abort_refusal(transactional_id, meta, expected, expected_start_ms)
            if refusal is not None:
                await commit_waits_for_the_standby(unit.conn)  # the id's row may be gone: no lock to wait on
            else:
                await self._fence_and_abort(unit, meta, now_ms())
                await record(
                    unit.conn,
                    actor,
                    "abort transaction",
                    transactional_id,
                    f"fenced: now producer {meta.producer_id} epoch {meta.producer_epoch}",
                )
        if refusal is not None:
            raise refusal
        return EndResult(meta.producer_id, meta.producer_epoch, meta.state)

    async def describe(self, transactional_id: str) -> TransactionMetadata:
        check_transactional_id(transactional_id)
        async with self.pool.acquire() as conn:
            meta = await self.log.get(conn, transactional_id)
        # Its absence too: an id's creation (InitProducerId) or expiry the standby lacks comes back.
        await confirmed_by_the_standby(self.replication_barrier, f"the state of transactional id {transactional_id!r}")
        if meta is None:
            raise transactional_id_not_found(transactional_id)
        return meta

    async def list(
        self,
        states: list[str] | None,
        prefix: str | None,
        producer_id: int | None,
        min_duration_ms: int | None,
        limit: int,
        after: str | None,
        id_pattern: str | None = None,
    ) -> list[TransactionMetadata]:
        """`id_pattern`: a regular expression the whole id matches (raises InvalidIdPattern)."""
        started_before = None if min_duration_ms is None else now_ms() - min_duration_ms
        async with self.pool.acquire() as conn:
            return await self.log.list(conn, states, prefix, producer_id, started_before, limit, after, id_pattern)

    # ---- background work, safe on several servers at once (SKIP LOCKED claims)

    async def _each_claimed(self, where_sql: str, *args, handle: Callable) -> int:
        done = 0
        while True:
            async with self.unit_of_work() as unit:
                meta = await unit.claim(where_sql, *args)
                if meta is None:
                    return done
                await handle(unit, meta)
                done += 1

    async def abort_timed_out(self) -> int:
        """Aborts (and fences) every Ongoing transaction older than its timeout. Prepared ones wait
        for their external coordinator: no timeout applies to them."""
        now = now_ms()

        async def abort(unit, meta):
            log.info(
                "aborting transaction of %r: open for %d ms, timeout %d ms",
                meta.transactional_id,
                now - meta.txn_start_ms,
                meta.timeout_ms,
            )
            await self._fence_and_abort(unit, meta, now)

        return await self._each_claimed(
            "state = $1 AND txn_start_ms + timeout_ms < $2", S.ONGOING.value, now, handle=abort
        )

    async def recover_pending(self) -> int:
        """Finishes every transaction whose outcome is decided (PrepareCommit/PrepareAbort) but whose
        markers may be missing: at start-up, and periodically for ones a crashed server left."""

        async def finish(unit, meta):
            # As the EndTxn that decided it would have (its version is logged with PrepareX).
            await self._complete(unit, meta, now_ms(), bump=meta.ends_with_bump, remember_ids=not meta.ends_with_bump)

        return await self._each_claimed(
            "state = ANY($1::text[])", _states_where(lambda state: state.is_decided), handle=finish
        )

    async def expire_transactional_ids(self) -> int:
        now = now_ms()

        async def expire(unit, meta):
            meta.prepare_dead(now)
            await unit.delete(meta)

        return await self._each_claimed(
            "state = ANY($1::text[]) AND last_update_ms < $2",
            _states_where(lambda state: state.may_expire),
            now - self.settings.transactional_id_expiration_ms,
            handle=expire,
        )


def _admin_abort_refusal(
    transactional_id: str,
    meta: TransactionMetadata | None,
    expected: ProducerIdAndEpoch | None,
    expected_start_ms: int | None,
) -> BrokerError | None:
    """Why an operator's abort (`TransactionCoordinator.admin_abort`) aborts nothing, if it does not:
    no such id, the producer or the transaction moved on since the operator looked, an outcome
    being completed (retriable), or nothing open."""
    if meta is None:
        return transactional_id_not_found(transactional_id)
    if expected is not None and (expected.producer_id, expected.producer_epoch) != (
        meta.producer_id,
        meta.producer_epoch,
    ):
        return invalid_state(
            meta,
            f"abort the transaction of producer {expected.producer_id} epoch "
            f"{expected.producer_epoch} (it has moved on: the producer is now "
            f"{meta.producer_id} epoch {meta.producer_epoch}); look again",
        )
    if expected_start_ms is not None and expected_start_ms != meta.txn_start_ms:
        return invalid_state(
            meta,
            f"abort the transaction started at {expected_start_ms} ms (it has moved on: the "
            f"transaction open now started at {meta.txn_start_ms} ms, -1 if none is); look again",
        )
    if meta.state in (S.ONGOING, S.PREPARED):
        return None
    if meta.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
        return concurrent(meta)
    return invalid_state(meta, "abort (no transaction is open)")


def _states_where(predicate) -> list[str]:
    """The persisted names of the states a predicate of TransactionState holds for: the claim
    queries of the workers are built from the state machine, never from a list of their own."""
    return [state.value for state in TransactionState if predicate(state)]


def _resolve_in(topics: dict, requested: list[tuple[str, int]]) -> list[TxnPartition | BrokerError]:
    """The requested (topic, partition) pairs as partitions a transaction may hold, or why not;
    `topics`: name -> TopicInfo, as looked up by the caller."""
    resolved: list[TxnPartition | BrokerError] = []
    for topic_name, partition in requested:
        topic = topics.get(topic_name)
        if topic is None:
            resolved.append(unknown_topic(topic_name))
        elif topic.is_internal or topic_name.startswith(INTERNAL_PREFIX):
            resolved.append(
                BrokerError(
                    ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic {topic_name!r} is internal and cannot be written"
                )
            )
        elif not 0 <= partition < topic.partition_count:
            resolved.append(unknown_partition(topic, partition))
        else:
            resolved.append(TxnPartition(topic_name, partition, topic.topic_id))
    return resolved


def offsets_partition_of(offsets_topic: TopicInfo, group_id: str) -> TxnPartition:
    """The partition of __consumer_offsets (`offsets_topic`) that holds this group's offsets."""
    return TxnPartition(
        offsets_topic.name, partition_for_key(group_id.encode(), offsets_topic.partition_count), offsets_topic.topic_id
    )


def unknown_producer(producer_id: int) -> BrokerError:
    return BrokerError(
        ErrorCode.UNKNOWN_PRODUCER_ID,
        f"producer id {producer_id} was never issued by this server, or has expired: get one "
        f"from POST /v1/producers/init, or send producer_id -1 for a plain write",
    )


def transactional_id_not_found(transactional_id: str) -> BrokerError:
    return BrokerError(
        ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
        f"transactional id {transactional_id!r} is unknown (never initialized, or expired)",
    )
