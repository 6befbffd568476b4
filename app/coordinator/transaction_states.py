"""The transaction state machine of the txbroker coordinator.

This is Kafka's transaction state machine (KIP-98), with the ``Prepared``
state of two-phase commit (KIP-939). The reference is Kafka's
``TransactionState`` and its ``validPreviousStates`` (``TransactionMetadata.scala``
/ ``TransactionState.java``).

``VALID_PREVIOUS_STATES`` is the single source of truth for which state changes
are legal. The coordinator calls :func:`transition` on every state change, so
a transition not in the table fails loudly instead of being persisted. The
predicates (``is_open``, ``is_completing``, ``takes_writes``, ``is_complete``,
``is_decided``, ``may_expire``)
are derived here too, so no other module keeps its own list of states.

The module is pure: no I/O, no imports from the rest of txbroker.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Mapping


class TransactionState(enum.StrEnum):
    """State of one transactional id.

    The values are stored in PostgreSQL and shown in the HTTP API: they are
    frozen and must never change (add a new state rather than renaming one).
    The comment on each state lists the events that LEAVE it.
    """

    # No transaction in flight (new id, or InitProducerId after a finished one).
    # Leaves on: AddPartitions/AddOffsets/produce -> Ongoing;
    #            InitProducerId (epoch bump) -> Empty;
    #            transactional id expiration -> Dead.
    EMPTY = "Empty"

    # A transaction is open and takes writes.
    # Leaves on: AddPartitions/AddOffsets/produce -> Ongoing;
    #            prepare (KIP-939) -> Prepared;
    #            EndTxn(commit) -> PrepareCommit; EndTxn(abort) -> PrepareAbort;
    #            InitProducerId or transaction timeout -> PrepareEpochFence.
    ONGOING = "Ongoing"

    # Two-phase commit, first phase done: the outcome belongs to an external
    # coordinator, so no timeout applies.
    # Leaves on: commit -> PrepareCommit; abort -> PrepareAbort.
    PREPARED = "Prepared"

    # Commit decided; COMMIT markers are being written.
    # Leaves on: all markers written -> CompleteCommit.
    PREPARE_COMMIT = "PrepareCommit"

    # Abort decided; ABORT markers are being written.
    # Leaves on: all markers written -> CompleteAbort.
    PREPARE_ABORT = "PrepareAbort"

    # An open transaction is being fenced (InitProducerId or timeout); the
    # producer epoch is bumped before aborting so the old producer is fenced.
    # Leaves on: epoch bump persisted -> PrepareAbort.
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"

    # Last transaction committed; markers are all written.
    # Leaves on: AddPartitions/AddOffsets/produce -> Ongoing;
    #            InitProducerId -> Empty; transactional id expiration -> Dead.
    COMPLETE_COMMIT = "CompleteCommit"

    # Last transaction aborted; markers are all written.
    # Leaves on: AddPartitions/AddOffsets/produce -> Ongoing;
    #            InitProducerId -> Empty; transactional id expiration -> Dead.
    COMPLETE_ABORT = "CompleteAbort"

    # Transactional id expired; terminal. Never left.
    DEAD = "Dead"

    @classmethod
    def parse(cls, name: str) -> TransactionState:
        """Read a persisted state name (exact, case-sensitive)."""
        try:
            return cls(name)
        except ValueError:
            known = ", ".join(s.value for s in cls)
            raise ValueError(f"unknown transaction state {name!r}; known states: {known}") from None

    @property
    def is_open(self) -> bool:
        """A transaction is in flight (begun and not yet completed)."""
        return self in _OPEN

    @property
    def is_completing(self) -> bool:
        """A transition to markers is pending: new requests for this
        transactional id answer CONCURRENT_TRANSACTIONS."""
        return self in _COMPLETING

    @property
    def takes_writes(self) -> bool:
        """A write (AddPartitions/AddOffsets/produce) is accepted: either the
        transaction is Ongoing or the write starts a new one."""
        # Derived from the table, so it cannot drift from it.
        return self in VALID_PREVIOUS_STATES[TransactionState.ONGOING]

    @property
    def is_complete(self) -> bool:
        """The last transaction finished and all its markers are written."""
        return self in _COMPLETE

    @property
    def is_decided(self) -> bool:
        """The outcome is durable but markers may be missing: recovery finishes it."""
        return self in _DECIDED

    @property
    def may_expire(self) -> bool:
        """Nothing is open: the transactional id may expire (-> Dead)."""
        # Derived from the table, so it cannot drift from it.
        return self in VALID_PREVIOUS_STATES[TransactionState.DEAD]


S = TransactionState

# target state -> states it may be reached from. The only list of legal
# transitions in txbroker; read-only so nothing can patch it at runtime.
VALID_PREVIOUS_STATES: Mapping[TransactionState, frozenset[TransactionState]] = types.MappingProxyType(
    {
        S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
        S.ONGOING: frozenset({S.EMPTY, S.ONGOING, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
        S.PREPARED: frozenset({S.ONGOING}),
        S.PREPARE_COMMIT: frozenset({S.ONGOING, S.PREPARED}),
        S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARED, S.PREPARE_EPOCH_FENCE}),
        S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
        S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
        S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
        S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    }
)

# Kept outside the enum body: a set assigned there would become a member.
_COMPLETING = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT, S.PREPARE_EPOCH_FENCE})
_OPEN = _COMPLETING | {S.ONGOING, S.PREPARED}
_COMPLETE = frozenset({S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
_DECIDED = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})

del S


class IllegalStateTransition(Exception):
    """A state change not in VALID_PREVIOUS_STATES was attempted.

    Always a coordinator bug: expected outcomes (fenced producer, concurrent
    transaction, ...) are checked before transition() is called. A real
    exception rather than an assert, because asserts vanish under python -O.
    """

    def __init__(self, current: TransactionState, target: TransactionState):
        super().__init__(current, target)  # keeps the exception picklable
        self.current = current
        self.target = target

    def __str__(self) -> str:
        sources = VALID_PREVIOUS_STATES[self.target]
        # Declaration order, so the message reads like the table.
        allowed = ", ".join(s.value for s in TransactionState if s in sources)
        return (
            f"illegal transaction state transition {self.current.value} -> "
            f"{self.target.value}: {self.target.value} may only be reached "
            f"from {allowed}. This is a broken invariant in the transaction "
            f"coordinator (a bug): expected outcomes such as fencing or "
            f"concurrent transactions must be checked before transition()."
        )


def is_transition_valid(current: TransactionState, target: TransactionState) -> bool:
    """Whether ``current -> target`` is in VALID_PREVIOUS_STATES."""
    return current in VALID_PREVIOUS_STATES[target]


def transition(current: TransactionState, target: TransactionState) -> TransactionState:
    """Return ``target`` if ``current -> target`` is legal, else raise
    IllegalStateTransition. Call on every state change."""
    if not is_transition_valid(current, target):
        raise IllegalStateTransition(current, target)
    return target


__all__ = [
    "IllegalStateTransition",
    "TransactionState",
    "VALID_PREVIOUS_STATES",
    "is_transition_valid",
    "transition",
]
