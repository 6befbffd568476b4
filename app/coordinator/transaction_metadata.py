"""One transactional id's metadata as the coordinator changes it (Kafka's TransactionMetadata): its
transitions are typed verbs (prepare_add_partitions, prepare_two_phase, prepare_end, complete_end,
fence, prepare_new_producer, prepare_dead), each checked against the one table of legal state
changes, transaction_states.VALID_PREVIOUS_STATES, before it changes anything.

Invariants:
- The state only changes through `_transit`, which checks the table first: an illegal change raises
  IllegalStateTransition (a coordinator bug) with the metadata untouched.
- Every transition is recorded on the metadata (`pending_records`) as the `__transaction_state`
  record of the state it leaves the id in; the unit of work (unit_of_work.py) writes the row and
  those records last, in the request's PostgreSQL transaction. Nothing here does I/O, so nothing in
  memory outlives a request that fails: its PostgreSQL transaction rolls back and the metadata,
  read again by the next request, is the durable one.
- Expected outcomes of a request (a fenced producer, a transaction completing, a state that refuses
  the request) are BrokerErrors raised before any change; a transition refused by the table is not
  an expected outcome.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.coordinator.identifiers import check_transactional_id
from app.coordinator.transaction_states import TransactionState, transition
from app.errors import BrokerError, ErrorCode
from app.storage.log import markers
from app.storage.log.partition_log import CONTROL_ABORT, CONTROL_COMMIT
from app.storage.log.topics import CONSUMER_OFFSETS_TOPIC
from app.storage.transactions.producer_ids import ProducerIdAndEpoch
from app.storage.transactions.transaction_log import NO_START_TIME, TransactionLog, TransactionRow, TxnPartition

S = TransactionState

# Transaction versions (Kafka's transaction.version feature): how an EndTxn ends its transaction.
TRANSACTION_VERSION_CLASSIC = 1  # the epoch and sequences carry over to the next transaction
TRANSACTION_VERSION_BUMP = 2  # KIP-890: the epoch is bumped at every transaction's end


@dataclass(slots=True)
class TransactionMetadata(TransactionRow):
    """The row's fields (TransactionRow) and the transitions that change them."""

    # ---- the transitions

    def prepare_add_partitions(self, partitions: list[TxnPartition], groups: list[str], now: int) -> None:
        """AddPartitionsToTxn/AddOffsetsToTxn/produce: adds partitions and groups to the open
        transaction, or begins one (-> Ongoing) with them. Nothing joins (every partition refused,
        or already in): no transaction begins, nothing is recorded."""
        if self.state == S.PREPARED:
            raise invalid_state(self, "add partitions or offsets to (it is Prepared and takes no more writes)")
        if self.state.is_completing:
            raise concurrent(self)
        known = {(p.topic_id, p.partition) for p in self.partitions}
        added = [p for p in dict.fromkeys(partitions) if (p.topic_id, p.partition) not in known]
        new_groups = [g for g in dict.fromkeys(groups) if g not in self.groups]
        if not added and not new_groups:
            return
        beginning = self.state != S.ONGOING
        self._transit(S.ONGOING, now)
        if beginning:
            self.partitions, self.groups = added, new_groups
            self.txn_start_ms = now
            self.txn_producer_id, self.txn_producer_epoch = self.producer_id, self.producer_epoch
            self.last_producer_id = self.last_producer_epoch = None
        else:
            self.partitions, self.groups = self.partitions + added, self.groups + new_groups
        self._record()

    def prepare_two_phase(self, now: int) -> None:
        """KIP-939's prepare: Ongoing -> Prepared, the outcome now an external coordinator's. A
        transaction already Prepared stays so (a retry)."""
        if self.state == S.ONGOING:
            self._transit(S.PREPARED, now)
            self._record()
        elif self.state.is_completing:
            raise concurrent(self)
        elif self.state != S.PREPARED:
            raise invalid_state(self, "prepare (no transaction is open)")

    def prepare_end(self, commit: bool, now: int, transaction_version: int = TRANSACTION_VERSION_BUMP) -> None:
        """EndTxn: Ongoing or Prepared -> PrepareCommit/PrepareAbort, the outcome decided, and the
        transaction version the EndTxn asked for recorded with it (so recovery completes it as the
        EndTxn would have); markers follow (`transaction_end`), then `complete_end`. A transaction
        already in the PrepareX asked (left durable by a crash between the steps) stays there, for
        the caller to complete."""
        wanted = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
        doing = "commit" if commit else "abort"
        state = self.state
        if state in (S.ONGOING, S.PREPARED):
            self._transit(wanted, now)
            self.transaction_version = transaction_version
            self._record()
        elif state == S.PREPARE_EPOCH_FENCE:
            raise concurrent(self)
        elif state.is_completing and state != wanted:
            raise invalid_state(self, f"{doing} (it is already in {state})")
        elif state != wanted:
            raise invalid_state(self, f"{doing} (no transaction is open)")

    def complete_end(self, now: int, bumped: ProducerIdAndEpoch | None, remember_ids: bool = False) -> None:
        """PrepareCommit/PrepareAbort -> CompleteCommit/CompleteAbort, the markers being written in
        the same PostgreSQL transaction. With `bumped` (the epoch after the current one: transaction
        version 2 ends every transaction with a bump), the producer moves to it and the ids that
        ended the transaction are remembered, to recognise an EndTxn retry. With `remember_ids`
        instead (transaction version 1: the producer keeps its epoch), the ids it keeps are
        remembered for the same purpose."""
        self._transit(S.COMPLETE_COMMIT if self.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT, now)
        self.partitions, self.groups = [], []
        self.txn_start_ms = NO_START_TIME
        self.txn_producer_id = self.txn_producer_epoch = None
        if bumped is not None:
            self.last_producer_id, self.last_producer_epoch = self.producer_id, self.producer_epoch
            self.producer_id, self.producer_epoch = bumped.producer_id, bumped.producer_epoch
        elif remember_ids:
            self.last_producer_id, self.last_producer_epoch = self.producer_id, self.producer_epoch
        self._record()

    @property
    def ends_with_bump(self) -> bool:
        """Whether completing the decided transaction bumps the epoch (transaction version 2). A
        transaction an EndTxn decided has the EndTxn's version (`prepare_end`); one decided by a
        fence keeps the id's last, None if no EndTxn ended one of its transactions yet, and bumps
        then as version 2 does (2 was what an id said before its first EndTxn until migration 0015)."""
        return self.transaction_version != TRANSACTION_VERSION_CLASSIC

    def fence(self, bumped: ProducerIdAndEpoch, now: int) -> None:
        """InitProducerId, a transaction timeout or an operator aborting an open transaction
        (Kafka's prepareFenceProducerEpoch): Ongoing -> PrepareEpochFence -> PrepareAbort, or
        Prepared -> PrepareAbort, the producer moved to `bumped` first (the epoch already bumped
        in producer_ids by the caller) so the producer of the aborted transaction is fenced."""
        if self.state == S.ONGOING:
            self._transit(S.PREPARE_EPOCH_FENCE, now)
            self._fenced_by(bumped)
            self._record()
        else:
            # Prepared: no PrepareEpochFence between (the table has none); the new epoch is recorded
            # with PrepareAbort.
            transition(self.state, S.PREPARE_ABORT)
            self._fenced_by(bumped)
        self.abort_fenced(now)

    def abort_fenced(self, now: int) -> None:
        """PrepareEpochFence (or Prepared, being fenced) -> PrepareAbort: the new epoch is durable,
        the abort decided; markers follow, then `complete_end` without a bump."""
        self._transit(S.PREPARE_ABORT, now)
        self._record()

    def prepare_new_producer(
        self, bumped: ProducerIdAndEpoch, timeout_ms: int, retry_key: tuple[int | None, int | None], now: int
    ) -> None:
        """InitProducerId on an id with no open transaction (any open one was fenced or completed
        first): the new instance's producer is `bumped`, and `retry_key` the ids a KIP-360 bump was
        asked with (so its retry is recognised), or (None, None). -> Empty; a Prepared transaction
        kept for the new instance (KIP-939 keep_prepared_txn) stays Prepared, fenced in."""
        if self.state == S.PREPARED:
            self.last_update_ms = now  # no state change, so no transition to check
        else:
            self._transit(S.EMPTY, now)
        self.producer_id, self.producer_epoch = bumped.producer_id, bumped.producer_epoch
        self.timeout_ms = timeout_ms
        self.last_producer_id, self.last_producer_epoch = retry_key
        self._record()

    def prepare_dead(self, now: int) -> None:
        """Transactional id expiration: -> Dead (its row is deleted with this record)."""
        self._transit(S.DEAD, now)
        self._record()

    # ---- what the transitions imply

    def transaction_end(self) -> markers.TransactionEnd:
        """The markers the transaction (in PrepareCommit/PrepareAbort) leaves in its partitions."""
        return markers.TransactionEnd(
            [(p.topic_id, p.partition) for p in self.partitions],
            self.txn_producer_id,
            self.txn_producer_epoch,
            CONTROL_COMMIT if self.state == S.PREPARE_COMMIT else CONTROL_ABORT,
            [p.partition for p in self.partitions if p.topic == CONSUMER_OFFSETS_TOPIC],
        )

    def kept_prepared(self) -> ProducerIdAndEpoch | None:
        """The producer of a Prepared transaction (KIP-939: its new instance commits or aborts it)."""
        if self.state != S.PREPARED:
            return None
        return ProducerIdAndEpoch(self.txn_producer_id, self.txn_producer_epoch)

    def is_retry_of_last(self, producer_id: int, producer_epoch: int) -> bool:
        """The ids are those that ended the last transaction: an EndTxn retried after its answer was
        lost."""
        return self.state.is_complete and (producer_id, producer_epoch) == (
            self.last_producer_id,
            self.last_producer_epoch,
        )

    # ---- internals

    def _transit(self, target: TransactionState, now: int) -> None:
        """The state change, checked against VALID_PREVIOUS_STATES before anything changes."""
        self.state = transition(self.state, target)
        self.last_update_ms = now

    def _fenced_by(self, bumped: ProducerIdAndEpoch) -> None:
        self.producer_id, self.producer_epoch = bumped.producer_id, bumped.producer_epoch
        self.last_producer_id = self.last_producer_epoch = None

    def _record(self) -> None:
        TransactionLog.record(self)


def check_producer(
    meta: TransactionMetadata | None, transactional_id: str, producer_id: int, producer_epoch: int
) -> TransactionMetadata:
    """The request's producer id and epoch against the coordinator's current ones: the metadata,
    or the request's error. An id over the identifier limit, which no transaction can have, is
    INVALID_REQUEST (Kafka's answer for a transactional id it finds invalid), not a mapping error."""
    if meta is None or meta.state == S.DEAD:
        check_transactional_id(transactional_id)
        raise mapping_error(transactional_id, producer_id)
    if producer_id != meta.producer_id:
        if producer_id in (meta.last_producer_id, meta.txn_producer_id):
            raise fenced(meta, producer_id, producer_epoch)
        raise mapping_error(transactional_id, producer_id)
    if producer_epoch < meta.producer_epoch:
        raise fenced(meta, producer_id, producer_epoch)
    if producer_epoch > meta.producer_epoch:
        raise BrokerError(
            ErrorCode.INVALID_PRODUCER_EPOCH,
            f"epoch {producer_epoch} of producer {producer_id} is higher than the coordinator's "
            f"{meta.producer_epoch} for {meta.transactional_id!r}: use the epoch POST /v1/producers/init "
            f"or the last EndTxn returned",
        )
    return meta


def mapping_error(transactional_id: str, producer_id: int) -> BrokerError:
    return BrokerError(
        ErrorCode.INVALID_PRODUCER_ID_MAPPING,
        f"producer id {producer_id} is not the producer of transactional id {transactional_id!r} (the id is "
        f"unknown, expired, or owned by another producer id): call POST /v1/producers/init again",
    )


def fenced(meta: TransactionMetadata, producer_id: int, producer_epoch: int) -> BrokerError:
    return BrokerError(
        ErrorCode.PRODUCER_FENCED,
        f"producer {producer_id} epoch {producer_epoch} of {meta.transactional_id!r} is fenced: the current "
        f"producer is {meta.producer_id} epoch {meta.producer_epoch} (a newer instance initialized, or a "
        f"transaction ended or timed out since). If this was your current epoch, close the producer",
    )


def concurrent(meta: TransactionMetadata) -> BrokerError:
    return BrokerError(
        ErrorCode.CONCURRENT_TRANSACTIONS,
        f"transactional id {meta.transactional_id!r} is completing its previous transaction "
        f"({meta.state}): retry shortly",
    )


def invalid_state(meta: TransactionMetadata, doing: str) -> BrokerError:
    return BrokerError(
        ErrorCode.INVALID_TXN_STATE, f"cannot {doing} transactional id {meta.transactional_id!r} in state {meta.state}"
    )
