"""The client side of a producer's identity and transactions (KIP-98), after aiokafka's
`transaction_manager.py` and Kafka's `TransactionManager.java`: the state machine, the producer id
and epoch, the sequence numbers per partition, and what the open transaction touched.

Pure: no I/O, no clock, no threads. The producer (txbroker.producer) drives it from its event loop
and performs the RPCs; everything here is testable directly.

Invariants:
- A state change goes through `transition_to`, checked against VALID_PREVIOUS_STATES (data, not
  asserts: an invalid transition raises IllegalStateError even under `python -O`).
- Sequences are per partition for the current (producer_id, epoch), start at 0 and wrap to 0 past
  Int.MaxValue (as Kafka's): adopting a new producer id or epoch (InitProducerId, or the ids every
  EndTxn returns, KIP-890) resets them all.
- FATAL_ERROR is final: every later operation raises the error that caused it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from txbroker.errors import IllegalStateError, TxbrokerError
from txbroker.records import TopicPartition
from txbroker.wire import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, SEQUENCE_MODULUS


class TransactionState(enum.Enum):
    """The comment on each state lists the events that LEAVE it."""

    # A new producer. Leaves on: InitProducerId answered -> READY.
    UNINITIALIZED = "UNINITIALIZED"
    # Has a producer id; no transaction open. Leaves on: begin_transaction -> IN_TRANSACTION.
    READY = "READY"
    # Sends and offsets join the transaction. Leaves on: commit_transaction -> COMMITTING;
    # abort_transaction -> ABORTING; a failed send or offset commit -> ABORTABLE_ERROR.
    IN_TRANSACTION = "IN_TRANSACTION"
    # Flushing, then EndTxn(commit), retried with the same body until the outcome is known.
    # Leaves on: EndTxn answered -> READY; a record failed during the flush -> ABORTABLE_ERROR.
    COMMITTING = "COMMITTING"
    # EndTxn(abort). Leaves on: answered -> READY.
    ABORTING = "ABORTING"
    # The transaction cannot commit; only abort_transaction is allowed. Leaves on: -> ABORTING.
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    # Fenced, or sequence state lost: the producer must be closed. Never left.
    FATAL_ERROR = "FATAL_ERROR"


S = TransactionState
VALID_PREVIOUS_STATES: Mapping[TransactionState, frozenset[TransactionState]] = MappingProxyType(
    {
        S.UNINITIALIZED: frozenset(),
        S.READY: frozenset({S.UNINITIALIZED, S.COMMITTING, S.ABORTING}),
        S.IN_TRANSACTION: frozenset({S.READY}),
        S.COMMITTING: frozenset({S.IN_TRANSACTION}),
        S.ABORTING: frozenset({S.IN_TRANSACTION, S.ABORTABLE_ERROR}),
        S.ABORTABLE_ERROR: frozenset({S.IN_TRANSACTION, S.COMMITTING, S.ABORTABLE_ERROR}),
        S.FATAL_ERROR: frozenset(S),
    }
)


def is_transition_valid(source: TransactionState, target: TransactionState) -> bool:
    return source in VALID_PREVIOUS_STATES[target]


class TransactionManager:
    """One producer's transactional (or only idempotent, when `transactional_id` is None) state."""

    def __init__(self, transactional_id: str | None = None, transaction_timeout_ms: int = 60_000) -> None:
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.state = TransactionState.UNINITIALIZED
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self.last_error: TxbrokerError | None = None
        self._sequences: dict[TopicPartition, int] = {}
        # What the open transaction touched on the server (a produce request sent, even one whose
        # answer was lost, may have opened it): decides whether EndTxn is needed at all.
        self.txn_partitions: set[TopicPartition] = set()
        self.txn_groups: set[str] = set()
        # The EndTxn body in progress: a commit or abort that timed out resumes with the same body.
        self.pending_end: dict | None = None

    @property
    def is_transactional(self) -> bool:
        return self.transactional_id is not None

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id != NO_PRODUCER_ID

    @property
    def ids(self) -> dict:
        """The identity fields of a transactional request."""
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
        }

    # ---- state

    def transition_to(self, target: TransactionState, error: TxbrokerError | None = None) -> None:
        if self.state is TransactionState.FATAL_ERROR and target is not TransactionState.FATAL_ERROR:
            raise self._fatal_state_error()
        if not is_transition_valid(self.state, target):
            raise IllegalStateError(
                f"producer {self._name()}: cannot go from {self.state.value} to {target.value}"
                + (f" (pending error: {self.last_error})" if self.last_error else "")
            )
        if error is not None:
            self.last_error = error
        self.state = target

    def _name(self) -> str:
        if self.transactional_id is not None:
            return f"with transactional id {self.transactional_id!r}"
        return f"{self.producer_id}" if self.has_producer_id else "(no producer id yet)"

    def _fatal_state_error(self) -> TxbrokerError:
        return self.last_error or IllegalStateError(f"producer {self._name()} is in FATAL_ERROR")

    def fail_fatal(self, error: TxbrokerError) -> TxbrokerError:
        """Enter FATAL_ERROR (from any state); returns the error, now marked fatal, to raise."""
        if not error.fatal:
            error = error.with_category(fatal=True)
        if self.state is not TransactionState.FATAL_ERROR:
            self.transition_to(TransactionState.FATAL_ERROR, error)
        return self.last_error or error

    def fail_abortable(self, error: TxbrokerError) -> TxbrokerError:
        """A transaction's send or offset commit failed: the transaction can only be aborted. Outside
        a transaction (an idempotent producer, or already aborting) the error only fails its records."""
        if error.fatal:
            return self.fail_fatal(error)
        if self.state in (S.IN_TRANSACTION, S.COMMITTING, S.ABORTABLE_ERROR):
            if not error.abortable:
                error = error.with_category(abortable=True)
            self.transition_to(S.ABORTABLE_ERROR, error)
        return error

    def check_not_completing(self, operation: str) -> None:
        """A commit or abort whose outcome is unknown (its call raised after max_block_ms) admits only
        the same call again: Kafka's "the previous call to commitTransaction timed out and must be
        retried"."""
        if self.state is S.COMMITTING or self.state is S.ABORTING:
            verb = "commit" if self.state is S.COMMITTING else "abort"
            raise IllegalStateError(
                f"producer {self._name()}: {operation}() while the transaction's {verb} is unfinished (an "
                f"earlier {verb}_transaction() raised before its outcome was known): call {verb}_transaction() "
                f"again until it returns"
                + ("; a commit that may have happened is never turned into an abort" if verb == "commit" else "")
            )

    def check_not_fatal(self) -> None:
        if self.state is S.FATAL_ERROR:
            raise self._fatal_state_error()

    def check_can_send(self) -> None:
        """send() is allowed: in a transaction for a transactional producer; any time but after a
        fatal error for an idempotent one."""
        self.check_not_fatal()
        if not self.is_transactional:
            return
        if self.state is S.ABORTABLE_ERROR:
            raise IllegalStateError(
                f"producer {self._name()}: the transaction cannot commit after an earlier error "
                f"({self.last_error}); call abort_transaction()"
            ) from self.last_error
        self.check_not_completing("send")
        if self.state is not S.IN_TRANSACTION:
            raise IllegalStateError(
                f"producer {self._name()}: send() needs an open transaction "
                f"(state {self.state.value}): call begin_transaction() first"
            )

    def require_transactional(self, operation: str) -> None:
        if not self.is_transactional:
            raise IllegalStateError(f"{operation}() needs a transactional producer: pass transactional_id=...")
        self.check_not_fatal()

    # ---- identity and sequences

    def set_producer_id_and_epoch(self, producer_id: int, producer_epoch: int) -> None:
        """Adopt the ids an InitProducerId or EndTxn answered; a new id or epoch restarts every
        partition's sequence at 0."""
        if (producer_id, producer_epoch) != (self.producer_id, self.producer_epoch):
            self._sequences.clear()
        self.producer_id, self.producer_epoch = producer_id, producer_epoch

    def take_sequence(self, tp: TopicPartition, count: int) -> int:
        """The base sequence of the next batch of `count` records for `tp`, advancing past it. Past
        Int.MaxValue the sequence wraps to 0, as Kafka's and the server's: an idempotent producer
        that wrote 2**31 records to a partition in one epoch goes on."""
        base = self._sequences.get(tp, 0)
        self._sequences[tp] = (base + count) % SEQUENCE_MODULUS
        return base

    def rollback_sequence(self, tp: TopicPartition, base_sequence: int, count: int) -> None:
        """The batch of `count` records that took `base_sequence` was refused and appended nothing:
        its sequence is the next one again, if it is still the latest batch of the partition (only
        one batch of a partition is ever in flight, so it is unless the ids changed since)."""
        if self._sequences.get(tp) == (base_sequence + count) % SEQUENCE_MODULUS:
            self._sequences[tp] = base_sequence

    def next_sequence(self, tp: TopicPartition) -> int:
        return self._sequences.get(tp, 0)

    # ---- the transaction's verbs

    def initialized(self, producer_id: int, producer_epoch: int) -> None:
        self.set_producer_id_and_epoch(producer_id, producer_epoch)
        if self.state is S.UNINITIALIZED:
            self.transition_to(S.READY)

    def begin_transaction(self) -> None:
        self.require_transactional("begin_transaction")
        if self.state is S.UNINITIALIZED:
            raise IllegalStateError("call init_transactions() before begin_transaction()")
        self.check_not_completing("begin_transaction")
        if self.state is not S.READY:
            raise IllegalStateError(
                f"producer {self._name()}: begin_transaction() while {self.state.value}: "
                f"a transaction is already open or completing"
            )
        self.txn_partitions.clear()
        self.txn_groups.clear()
        self.transition_to(S.IN_TRANSACTION)

    def added_partition(self, tp: TopicPartition) -> None:
        self.txn_partitions.add(tp)

    def added_group(self, group_id: str) -> None:
        self.txn_groups.add(group_id)

    @property
    def transaction_has_content(self) -> bool:
        return bool(self.txn_partitions or self.txn_groups)

    def end_body(self, committed: bool) -> dict:
        """The EndTxn body for this transaction, kept so a retry after an unknown outcome (or a
        resumed commit after a client timeout) sends exactly the same body."""
        if self.pending_end is None or self.pending_end["committed"] is not committed:
            self.pending_end = {**self.ids, "committed": committed}
        return self.pending_end

    def completed(self, producer_id: int, producer_epoch: int) -> None:
        """EndTxn answered (or nothing needed ending): adopt the ids of the next transaction."""
        self.set_producer_id_and_epoch(producer_id, producer_epoch)
        self.pending_end = None
        self.txn_partitions.clear()
        self.txn_groups.clear()
        self.last_error = None
        self.transition_to(S.READY)
