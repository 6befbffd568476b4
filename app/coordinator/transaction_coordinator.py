"""The transaction coordinator (Kafka's TransactionCoordinator): InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn, two-phase prepare (KIP-939), admin abort, and the work of the background
workers (timeouts, recovery, expiration).

Invariants:
- Every request on a transactional id runs in a PostgreSQL transaction that first locks the id's
  row (`TransactionLog.lock`), then partition rows in `lock_order`: requests on one id serialize,
  and no two requests can deadlock.
- Every state change goes through `transaction_states.transition` (`_move`) and is recorded on the
  request's metadata; `TransactionLog.save` writes the row and the `__transaction_state` records
  last, before the PostgreSQL transaction commits. Nothing in memory outlives the request.
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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg

from app.clock import now_ms
from app.coordinator.transaction_states import TransactionState, transition
from app.errors import BrokerError, ErrorCode
from app.settings import Settings
from app.storage import group_offsets, markers, partition_log, principals, producer_ids
from app.storage.fused_writes import WriteStatement, execute_fused, fused
from app.storage.partition_log import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    AppendResult,
    BatchAppend,
)
from app.storage.producer_ids import ProducerIdAndEpoch
from app.storage.topics import (
    CONSUMER_OFFSETS_TOPIC,
    INTERNAL_PREFIX,
    find_topics,
    get_topic,
    unknown_partition,
    unknown_topic,
)
from app.storage.transaction_log import NO_START_TIME, TransactionLog, TransactionMetadata, TxnPartition
from txbroker.partitioner import partition_for_key

log = logging.getLogger(__name__)

S = TransactionState

# Transaction versions (Kafka's transaction.version feature): how an EndTxn ends its transaction.
TRANSACTION_VERSION_CLASSIC = 1  # the epoch carries over to the next transaction
TRANSACTION_VERSION_BUMP = 2  # KIP-890: the epoch is bumped at every transaction's end


@dataclass(frozen=True, slots=True)
class EndTxnCommand:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    transaction_version: int = TRANSACTION_VERSION_BUMP


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


def _mapping_error(transactional_id: str, producer_id: int) -> BrokerError:
    return BrokerError(
        ErrorCode.INVALID_PRODUCER_ID_MAPPING,
        f"producer id {producer_id} is not the producer of transactional id {transactional_id!r} (the id is "
        f"unknown, expired, or owned by another producer id): call POST /v1/producers/init again",
    )


def check_producer(
    meta: TransactionMetadata | None, transactional_id: str, producer_id: int, producer_epoch: int
) -> TransactionMetadata:
    """The request's producer id and epoch against the coordinator's current ones."""
    if meta is None or meta.state == S.DEAD:
        raise _mapping_error(transactional_id, producer_id)
    if producer_id != meta.producer_id:
        if producer_id in (meta.last_producer_id, meta.txn_producer_id):
            raise _fenced(meta, producer_id, producer_epoch)
        raise _mapping_error(transactional_id, producer_id)
    if producer_epoch < meta.producer_epoch:
        raise _fenced(meta, producer_id, producer_epoch)
    if producer_epoch > meta.producer_epoch:
        raise BrokerError(
            ErrorCode.INVALID_PRODUCER_EPOCH,
            f"epoch {producer_epoch} of producer {producer_id} is higher than the coordinator's "
            f"{meta.producer_epoch} for {meta.transactional_id!r}: use the epoch POST /v1/producers/init "
            f"or the last EndTxn returned",
        )
    return meta


def _fenced(meta: TransactionMetadata, producer_id: int, producer_epoch: int) -> BrokerError:
    return BrokerError(
        ErrorCode.PRODUCER_FENCED,
        f"producer {producer_id} epoch {producer_epoch} of {meta.transactional_id!r} is fenced: the current "
        f"producer is {meta.producer_id} epoch {meta.producer_epoch} (a newer instance initialized, or a "
        f"transaction ended or timed out since). If this was your current epoch, close the producer",
    )


def _concurrent(meta: TransactionMetadata) -> BrokerError:
    return BrokerError(
        ErrorCode.CONCURRENT_TRANSACTIONS,
        f"transactional id {meta.transactional_id!r} is completing its previous transaction "
        f"({meta.state}): retry shortly",
    )


def _invalid_state(meta: TransactionMetadata, doing: str) -> BrokerError:
    return BrokerError(
        ErrorCode.INVALID_TXN_STATE, f"cannot {doing} transactional id {meta.transactional_id!r} in state {meta.state}"
    )


class TransactionCoordinator:
    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings
        self.log = TransactionLog(parse_state=TransactionState.parse)

    # ---- state changes, each recorded for the transaction log

    def _move(self, meta: TransactionMetadata, target: TransactionState, now: int, **changes) -> None:
        meta.state = transition(meta.state, target)
        meta.last_update_ms = now
        for name, value in changes.items():
            setattr(meta, name, value)
        self.log.record(meta)

    def _update(self, meta: TransactionMetadata, now: int, **changes) -> None:
        """A change of the metadata that leaves the state as it is (so no transition to check),
        recorded for the transaction log like a transition."""
        if "state" in changes:
            raise ValueError("a state change goes through _move (the checked transition), not _update")
        for name, value in changes.items():
            setattr(meta, name, value)
        meta.last_update_ms = now
        self.log.record(meta)

    @staticmethod
    def _ending(meta: TransactionMetadata) -> markers.TransactionEnd:
        """The markers the transaction of `meta` (in PrepareCommit/PrepareAbort) leaves."""
        return markers.TransactionEnd(
            [(p.topic_id, p.partition) for p in meta.partitions],
            meta.txn_producer_id,
            meta.txn_producer_epoch,
            CONTROL_COMMIT if meta.state == S.PREPARE_COMMIT else CONTROL_ABORT,
            [p.partition for p in meta.partitions if p.topic == CONSUMER_OFFSETS_TOPIC],
        )

    @staticmethod
    async def write_partitions(
        conn: asyncpg.Connection,
        appends: list[BatchAppend],
        ends: list[markers.TransactionEnd],
        now: int,
        then: WriteStatement | None = None,
    ) -> list[AppendResult | BrokerError]:
        """Appends the batches, then writes the markers of the transactions `ends`, in the caller's
        PostgreSQL transaction, which has held the rows of every transactional id concerned since an
        earlier statement: one statement locks every partition (lock_order), one writes, however
        many batches, partitions and transactions. Each append's result, as partition_log.append_batches.
        `then`: the caller's last write (the transaction log's, which locks its partitions last),
        fused with the others unless consumer offsets are to be settled after the markers."""
        if not ends:
            return await partition_log.append_batches(conn, appends, then)
        locked = await partition_log.lock_partitions(
            conn, partition_log.locks_for_appends(appends) | markers.locks_for_markers(ends)
        )
        appending = await partition_log.plan_appends(conn, appends, locked)
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

    async def _complete(
        self, conn: asyncpg.Connection, meta: TransactionMetadata, now: int, bump: bool, remember_ids: bool = False
    ) -> None:
        """PrepareCommit/PrepareAbort -> markers -> CompleteCommit/CompleteAbort. With `bump`, the epoch
        moves on and the ids that ended the transaction are remembered for an EndTxn retry."""
        ending = self._ending(meta)
        await self.write_partitions(conn, [], [ending], now)
        await self._completed(conn, meta, now, bump, remember_ids)

    async def _completed(
        self, conn: asyncpg.Connection, meta: TransactionMetadata, now: int, bump: bool, remember_ids: bool = False
    ) -> None:
        """PrepareCommit/PrepareAbort -> CompleteCommit/CompleteAbort, the markers (`_ending`) being
        written in the same PostgreSQL transaction. With `remember_ids` (a transaction of version 1,
        not bumped), the ids it keeps are remembered as those that ended it, so that its EndTxn
        retried is recognised."""
        commit = meta.state == S.PREPARE_COMMIT
        changes: dict = {
            "partitions": [],
            "groups": [],
            "txn_start_ms": NO_START_TIME,
            "txn_producer_id": None,
            "txn_producer_epoch": None,
        }
        if bump:
            current = ProducerIdAndEpoch(meta.producer_id, meta.producer_epoch)
            # The new epoch reaches producer_ids with the row, in TransactionLog.save (one statement
            # fewer); a new producer id, once epochs are exhausted, is issued here.
            bumped = producer_ids.next_epoch(current) or await producer_ids.issue(conn, now, meta.transactional_id)
            changes.update(
                last_producer_id=current.producer_id,
                last_producer_epoch=current.producer_epoch,
                producer_id=bumped.producer_id,
                producer_epoch=bumped.producer_epoch,
            )
        elif remember_ids:
            changes.update(last_producer_id=meta.producer_id, last_producer_epoch=meta.producer_epoch)
        self._move(meta, S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT, now, **changes)

    async def _fence_and_abort(self, conn: asyncpg.Connection, meta: TransactionMetadata, now: int) -> None:
        """Ongoing or Prepared -> (PrepareEpochFence) -> PrepareAbort -> CompleteAbort, bumping the
        epoch first so the producer of the aborted transaction is fenced."""
        bumped = await producer_ids.bump(
            conn, ProducerIdAndEpoch(meta.producer_id, meta.producer_epoch), now, meta.transactional_id
        )
        if meta.state == S.ONGOING:
            self._move(
                meta,
                S.PREPARE_EPOCH_FENCE,
                now,
                producer_id=bumped.producer_id,
                producer_epoch=bumped.producer_epoch,
                last_producer_id=None,
                last_producer_epoch=None,
            )
        else:
            meta.producer_id, meta.producer_epoch = bumped.producer_id, bumped.producer_epoch
            meta.last_producer_id = meta.last_producer_epoch = None
        self._move(meta, S.PREPARE_ABORT, now)
        await self._complete(conn, meta, now, bump=False)

    def _start_or_extend(
        self, meta: TransactionMetadata, partitions: list[TxnPartition], groups: list[str], now: int
    ) -> None:
        """Adds partitions/groups to the transaction, beginning it (-> Ongoing) if none is open."""
        if meta.state == S.PREPARED:
            raise _invalid_state(meta, "add partitions or offsets to (it is Prepared and takes no more writes)")
        if meta.state.is_completing:
            raise _concurrent(meta)
        known = {(p.topic_id, p.partition) for p in meta.partitions}
        added = [p for p in dict.fromkeys(partitions) if (p.topic_id, p.partition) not in known]
        new_groups = [g for g in dict.fromkeys(groups) if g not in meta.groups]
        if not added and not new_groups:
            return  # nothing joins (every partition refused, or already in): no transaction begins
        if meta.state == S.ONGOING:
            self._move(meta, S.ONGOING, now, partitions=meta.partitions + added, groups=meta.groups + new_groups)
            return
        self._move(
            meta,
            S.ONGOING,
            now,
            partitions=added,
            groups=new_groups,
            txn_start_ms=now,
            txn_producer_id=meta.producer_id,
            txn_producer_epoch=meta.producer_epoch,
            last_producer_id=None,
            last_producer_epoch=None,
        )

    # ---- InitProducerId

    async def init_producer_id(
        self,
        transactional_id: str | None,
        timeout_ms: int,
        producer_id: int,
        producer_epoch: int,
        keep_prepared: bool = False,
        quota_principal: str | None = None,
    ) -> InitResult:
        """`quota_principal`: who asks, when the per-principal quota of transactional ids applies."""
        now = now_ms()
        async with self.pool.acquire() as conn, conn.transaction():
            if transactional_id is None:
                return await self._init_idempotent(conn, producer_id, producer_epoch, now)
            if not 1 <= timeout_ms <= self.settings.transaction_max_timeout_ms:
                raise BrokerError(
                    ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                    f"transaction_timeout_ms is {timeout_ms}: expected 1 to {self.settings.transaction_max_timeout_ms} "
                    f"(the server's transaction_max_timeout_ms)",
                )
            meta = await self.log.lock(conn, transactional_id)
            if meta is None:
                await self._check_quota(conn, quota_principal, transactional_id)
                issued = await producer_ids.issue(conn, now, transactional_id)
                fresh = TransactionMetadata(
                    transactional_id,
                    issued.producer_id,
                    issued.producer_epoch,
                    S.EMPTY,
                    timeout_ms,
                    NO_START_TIME,
                    now,
                    principal=quota_principal,
                )
                if await self.log.lock_new(conn, fresh):
                    return InitResult(issued.producer_id, issued.producer_epoch)
                meta = await self.log.lock(conn, transactional_id)  # a racing init created it first
            result = await self._reinit(conn, meta, timeout_ms, producer_id, producer_epoch, keep_prepared, now)
            await self.log.save(conn, meta)
            return result

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
        self, conn: asyncpg.Connection, producer_id: int, producer_epoch: int, now: int
    ) -> InitResult:
        if producer_id == NO_PRODUCER_ID:
            issued = await producer_ids.issue(conn, now)
            return InitResult(issued.producer_id, issued.producer_epoch)
        # KIP-360: an idempotent producer bumps its own epoch after an error to reset its sequences.
        issued = await producer_ids.lookup(conn, producer_id)
        if issued is None or issued.transactional_id is not None:
            raise unknown_producer(producer_id)
        issued_epoch = issued.producer_epoch
        if producer_epoch == issued_epoch - 1:
            # The retry of a bump whose answer was lost: answer the epoch it issued. An idempotent
            # producer id has one holder (no transactional id to share), so this fences no one.
            return InitResult(producer_id, issued_epoch)
        if producer_epoch != issued_epoch:
            raise BrokerError(
                ErrorCode.PRODUCER_FENCED if producer_epoch < issued_epoch else ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer {producer_id} asked to bump epoch {producer_epoch}, but its current "
                f"epoch is {issued_epoch}: send the current epoch, or -1/-1 for a new producer id",
            )
        bumped = await producer_ids.bump(conn, ProducerIdAndEpoch(producer_id, producer_epoch), now)
        return InitResult(bumped.producer_id, bumped.producer_epoch)

    async def _reinit(
        self,
        conn: asyncpg.Connection,
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
            prepared = None
            if meta.state == S.PREPARED:
                prepared = ProducerIdAndEpoch(meta.txn_producer_id, meta.txn_producer_epoch)
            return InitResult(meta.producer_id, meta.producer_epoch, prepared)
        if given != (NO_PRODUCER_ID, NO_PRODUCER_EPOCH) and given != (meta.producer_id, meta.producer_epoch):
            raise _fenced(meta, producer_id, producer_epoch)
        state = meta.state
        if state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            await self._complete(conn, meta, now, bump=True)
        elif state == S.PREPARE_EPOCH_FENCE:
            self._move(meta, S.PREPARE_ABORT, now)
            await self._complete(conn, meta, now, bump=False)
        elif state == S.ONGOING or (state == S.PREPARED and not keep_prepared):
            await self._fence_and_abort(conn, meta, now)
        prepared = None
        if meta.state == S.PREPARED:
            prepared = ProducerIdAndEpoch(meta.txn_producer_id, meta.txn_producer_epoch)
        bumped = await producer_ids.bump(
            conn, ProducerIdAndEpoch(meta.producer_id, meta.producer_epoch), now, meta.transactional_id
        )
        # The ids a KIP-360 bump was asked with are remembered, so its retry is recognised (above).
        retry_key = (None, None) if given == (NO_PRODUCER_ID, NO_PRODUCER_EPOCH) else given
        changes = dict(
            producer_id=bumped.producer_id,
            producer_epoch=bumped.producer_epoch,
            timeout_ms=timeout_ms,
            last_producer_id=retry_key[0],
            last_producer_epoch=retry_key[1],
        )
        if prepared is None:
            self._move(meta, S.EMPTY, now, **changes)
        else:
            # KIP-939 keep_prepared_txn: the new instance is fenced in, the Prepared transaction stays
            # as it is (no state change) for the new instance to commit or abort.
            self._update(meta, now, **changes)
        return InitResult(bumped.producer_id, bumped.producer_epoch, prepared)

    # ---- AddPartitionsToTxn / AddOffsetsToTxn / produce

    async def _resolve(
        self, conn: asyncpg.Connection, requested: list[tuple[str, int]], topics: dict | None = None
    ) -> list[TxnPartition | BrokerError]:
        """`topics`: already looked up by the caller (name -> TopicInfo), or None to look them up."""
        if topics is None:
            topics = await find_topics(conn, sorted({topic for topic, _ in requested}))
        return _resolve_in(topics, requested)

    async def add_partitions(
        self, transactional_id: str, producer_id: int, producer_epoch: int, requested: list[tuple[str, int]]
    ) -> list[BrokerError | None]:
        async with self.pool.acquire() as conn, conn.transaction():
            meta = check_producer(
                await self.log.lock(conn, transactional_id), transactional_id, producer_id, producer_epoch
            )
            resolved = await self._resolve(conn, requested)
            self._start_or_extend(meta, [p for p in resolved if isinstance(p, TxnPartition)], [], now_ms())
            await self.log.save(conn, meta)
        return [p if isinstance(p, BrokerError) else None for p in resolved]

    async def offsets_partition(self, conn: asyncpg.Connection, group_id: str) -> TxnPartition:
        """The __consumer_offsets partition that holds this group's offsets."""
        topic = await get_topic(conn, CONSUMER_OFFSETS_TOPIC)
        return TxnPartition(topic.name, partition_for_key(group_id.encode(), topic.partition_count), topic.topic_id)

    async def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            meta = check_producer(
                await self.log.lock(conn, transactional_id), transactional_id, producer_id, producer_epoch
            )
            partition = await self.offsets_partition(conn, group_id)
            self._start_or_extend(meta, [partition], [group_id], now_ms())
            await self.log.save(conn, meta)

    async def lock_producer(
        self, conn: asyncpg.Connection, transactional_id: str, producer_id: int, producer_epoch: int
    ) -> TransactionMetadata:
        """Locks the id's row and verifies the producer, within the caller's PostgreSQL transaction
        (TxnOffsetCommit's first step; `join_for_offsets` follows once something is to commit)."""
        return check_producer(
            await self.log.lock(conn, transactional_id), transactional_id, producer_id, producer_epoch
        )

    async def join_for_offsets(
        self, conn: asyncpg.Connection, meta: TransactionMetadata, group_id: str
    ) -> TxnPartition:
        """Adds the group's offsets partition to the transaction implicitly (beginning it if none is
        open). The caller runs `self.log.save(conn, meta)` last."""
        partition = await self.offsets_partition(conn, group_id)
        self._start_or_extend(meta, [partition], [group_id], now_ms())
        return partition

    def join_for_produce(
        self,
        meta: TransactionMetadata | None,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        requested: list[tuple[str, int]],
        topics: dict,
    ) -> TransactionMetadata:
        """Within the produce's PostgreSQL transaction, `meta` being the id's row as locked there
        (`self.log.lock_many_and_find_topics`; None if it has none): verifies the producer against the coordinator's
        current state (KIP-890: a late request of an old transaction can never land in a new one) and
        adds the partitions implicitly. The id's row stays locked until the batches are appended, so
        EndTxn cannot write markers in between; the caller then saves the metadata
        (`self.log.save_statement`, fused with its appends' write)."""
        meta = check_producer(meta, transactional_id, producer_id, producer_epoch)
        valid = [p for p in _resolve_in(topics, requested) if isinstance(p, TxnPartition)]
        self._start_or_extend(meta, valid, [], now_ms())
        return meta

    # ---- EndTxn and prepare

    async def end_in_group(
        self, conn: asyncpg.Connection, meta: TransactionMetadata | None, command: EndTxnCommand
    ) -> tuple[EndResult, markers.TransactionEnd | None]:
        """EndTxn on the id's row as locked by a group of requests written together
        (app/coordinator/write_groups.py): its answer, and the markers the group must write after
        its appends (None for a retry of the EndTxn that ended the last transaction). Raises the
        request's error. The group saves the metadata last (`self.log.save_statement`)."""
        retried = self._begin_end(meta, command)
        if retried is not None:
            return retried, None
        # Every partition lives in this database, so PrepareX, the markers and CompleteX share one
        # PostgreSQL transaction (one commit instead of two). The steps stay separable: PrepareX is
        # logged before the markers, markers are idempotent, and a PrepareX found durable (left by
        # a coordinator that wrote them separately) is finished by recovery, InitProducerId, or this
        # same EndTxn retried. The group writes its markers after every state change: a retry of an
        # EndTxn in the same group sees its transaction complete, as it would after it.
        ending = self._ending(meta)
        classic = meta.transaction_version == TRANSACTION_VERSION_CLASSIC
        await self._completed(conn, meta, now_ms(), bump=not classic, remember_ids=classic)
        return EndResult(meta.producer_id, meta.producer_epoch, meta.state), ending

    def _begin_end(self, meta: TransactionMetadata | None, request: EndTxnCommand) -> EndResult | None:
        """EndTxn's checks on the locked row: the answer of a retry of the EndTxn that ended the last
        transaction, or None once the transaction is in PrepareCommit/PrepareAbort, to complete.
        Raises the request's error."""
        commit = request.commit
        wanted = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
        outcome = S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT
        if meta is not None and self._is_retry_of_last(meta, request.producer_id, request.producer_epoch):
            if meta.state != outcome:
                raise _invalid_state(
                    meta, f"{'commit' if commit else 'abort'} (its transaction already ended with {meta.state})"
                )
            return EndResult(meta.producer_id, meta.producer_epoch, meta.state)
        check_producer(meta, request.transactional_id, request.producer_id, request.producer_epoch)
        state = meta.state
        if state in (S.ONGOING, S.PREPARED):
            self._move(meta, wanted, now_ms(), transaction_version=request.transaction_version)
        elif state == S.PREPARE_EPOCH_FENCE or (state.is_completing and state != wanted):
            raise (
                _concurrent(meta)
                if state == S.PREPARE_EPOCH_FENCE
                else _invalid_state(meta, f"{'commit' if commit else 'abort'} (it is already in {meta.state})")
            )
        elif state != wanted:
            raise _invalid_state(meta, f"{'commit' if commit else 'abort'} (no transaction is open)")
        return None

    @staticmethod
    def _is_retry_of_last(meta: TransactionMetadata, producer_id: int, producer_epoch: int) -> bool:
        return meta.state.is_complete and (producer_id, producer_epoch) == (
            meta.last_producer_id,
            meta.last_producer_epoch,
        )

    async def prepare(self, transactional_id: str, producer_id: int, producer_epoch: int) -> EndResult:
        async with self.pool.acquire() as conn, conn.transaction():
            meta = check_producer(
                await self.log.lock(conn, transactional_id), transactional_id, producer_id, producer_epoch
            )
            state = meta.state
            if state == S.ONGOING:
                self._move(meta, S.PREPARED, now_ms())
            elif state.is_completing:
                raise _concurrent(meta)
            elif state != S.PREPARED:
                raise _invalid_state(meta, "prepare (no transaction is open)")
            await self.log.save(conn, meta)
            return EndResult(meta.producer_id, meta.producer_epoch, meta.state)

    # ---- administration

    async def admin_abort(
        self, transactional_id: str, expected: ProducerIdAndEpoch | None = None, *, principal: str, via: str = ""
    ) -> EndResult:
        """`expected`: the producer id and epoch the operator saw; if the transaction has moved on
        since (a new producer or transaction), nothing is aborted. The audit entry (who, `via` which
        door) is written in the same PostgreSQL transaction as the abort: both happen or neither."""
        async with self.pool.acquire() as conn, conn.transaction():
            meta = await self.log.lock(conn, transactional_id)
            if meta is None:
                raise transactional_id_not_found(transactional_id)
            if expected is not None and (expected.producer_id, expected.producer_epoch) != (
                meta.producer_id,
                meta.producer_epoch,
            ):
                raise _invalid_state(
                    meta,
                    f"abort the transaction of producer {expected.producer_id} epoch "
                    f"{expected.producer_epoch} (it has moved on: the producer is now "
                    f"{meta.producer_id} epoch {meta.producer_epoch}); look again",
                )
            state = meta.state
            if state in (S.ONGOING, S.PREPARED):
                await self._fence_and_abort(conn, meta, now_ms())
            elif state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                raise _concurrent(meta)
            else:
                raise _invalid_state(meta, "abort (no transaction is open)")
            await principals.audit(
                conn,
                now_ms(),
                principal,
                "abort transaction",
                transactional_id,
                f"{via}fenced: now producer {meta.producer_id} epoch {meta.producer_epoch}",
            )
            await self.log.save(conn, meta)
            return EndResult(meta.producer_id, meta.producer_epoch, meta.state)

    async def describe(self, transactional_id: str) -> TransactionMetadata:
        async with self.pool.acquire() as conn:
            meta = await self.log.get(conn, transactional_id)
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
    ) -> list[TransactionMetadata]:
        started_before = None if min_duration_ms is None else now_ms() - min_duration_ms
        async with self.pool.acquire() as conn:
            return await self.log.list(conn, states, prefix, producer_id, started_before, limit, after)

    # ---- background work, safe on several servers at once (SKIP LOCKED claims)

    async def _each_claimed(self, where_sql: str, *args, handle) -> int:
        done = 0
        while True:
            async with self.pool.acquire() as conn, conn.transaction():
                claimed = await self.log.claim(conn, where_sql, *args, limit=1)
                if not claimed:
                    return done
                meta = await self.log.lock(conn, claimed[0])
                await handle(conn, meta)
                await self.log.save(conn, meta)
                done += 1

    async def abort_timed_out(self) -> int:
        """Aborts (and fences) every Ongoing transaction older than its timeout. Prepared ones wait
        for their external coordinator: no timeout applies to them."""
        now = now_ms()

        async def abort(conn, meta):
            log.info(
                "aborting transaction of %r: open for %d ms, timeout %d ms",
                meta.transactional_id,
                now - meta.txn_start_ms,
                meta.timeout_ms,
            )
            await self._fence_and_abort(conn, meta, now)

        return await self._each_claimed(
            "state = $1 AND txn_start_ms + timeout_ms < $2", S.ONGOING.value, now, handle=abort
        )

    async def recover_pending(self) -> int:
        """Finishes every transaction whose outcome is decided (PrepareCommit/PrepareAbort) but whose
        markers may be missing: at start-up, and periodically for ones a crashed server left."""

        async def finish(conn, meta):
            # As the EndTxn that decided it would have (its version is logged with PrepareX).
            classic = meta.transaction_version == TRANSACTION_VERSION_CLASSIC
            await self._complete(conn, meta, now_ms(), bump=not classic, remember_ids=classic)

        return await self._each_claimed(
            "state = ANY($1::text[])", _states_where(lambda state: state.is_decided), handle=finish
        )

    async def expire_transactional_ids(self) -> int:
        now = now_ms()

        async def expire(conn, meta):
            self._move(meta, S.DEAD, now)
            await self.log.delete(conn, meta)

        return await self._each_claimed(
            "state = ANY($1::text[]) AND last_update_ms < $2",
            _states_where(lambda state: state.may_expire),
            now - self.settings.transactional_id_expiration_ms,
            handle=expire,
        )


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
