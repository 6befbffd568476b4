"""Kafka's per-partition sequence rules for idempotent and transactional producers
(ProducerAppendInfo): what to do with a batch given the producer's state on the partition.

Pure: no I/O. The caller holds the partition's row lock, so the state it read cannot change until it
has applied the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.errors import BrokerError, ErrorCode
from txbroker.wire import NO_SEQUENCE, NO_TIMESTAMP, SEQUENCE_MODULUS

# Kafka keeps the metadata of this many recent batches per producer and partition, so that a retry
# of any of the last five in-flight batches is recognised as a duplicate.
RECENT_BATCHES = 5


@dataclass(frozen=True, slots=True)
class RecentBatch:
    base_sequence: int
    last_sequence: int
    base_offset: int
    last_offset: int
    # The batch's max timestamp as stored (Kafka's BatchMetadata.timestamp: the append time in a
    # LogAppendTime topic), which answers a retry of it; NO_TIMESTAMP for a batch remembered before
    # it was kept.
    max_timestamp_ms: int = NO_TIMESTAMP


@dataclass(frozen=True, slots=True)
class ProducerEntry:
    """A producer's state on one partition."""

    producer_epoch: int
    last_sequence: int
    recent_batches: tuple[RecentBatch, ...]
    current_txn_first_offset: int | None


@dataclass(frozen=True, slots=True)
class Append:
    """Append the batch; `last_sequence` is its last record's sequence."""

    last_sequence: int


@dataclass(frozen=True, slots=True)
class Duplicate:
    """Already appended: answer with the original batch's offsets and max timestamp, append nothing."""

    base_offset: int
    last_offset: int
    max_timestamp_ms: int


def last_sequence_of(base_sequence: int, record_count: int) -> int:
    return (base_sequence + record_count - 1) % SEQUENCE_MODULUS


def check_batch(
    entry: ProducerEntry | None,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    record_count: int,
    transactional: bool,
    where: str,
    *,
    stateless_takes_any_sequence: bool = False,
) -> Append | Duplicate | BrokerError:
    """`where` names the partition in messages (e.g. "orders-0"); `stateless_takes_any_sequence`:
    Kafka's leaders' rule for an idempotent producer with no state here (see below)."""
    last_sequence = last_sequence_of(base_sequence, record_count)
    if entry is None:
        # A transactional producer's state expires partition by partition while the producer lives
        # on (producer_ids.py), and with transaction version 1 its epoch and sequences carry over
        # from one transaction to the next: its next batch where its state went continues its
        # sequence. As Kafka's ProducerAppendInfo, a producer with no state here takes any sequence
        # then. An idempotent producer's state goes only with its id, so one with none here never
        # wrote here: it starts at 0, and any other sequence is a gap; unless the caller asks for
        # Kafka's rule, which takes it too (the Kafka door's clients go on with their sequences
        # once their id expired: ProduceCommand.takes_expired_producers).
        if base_sequence != 0 and not (transactional or stateless_takes_any_sequence):
            return BrokerError(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {producer_id} sent sequence {base_sequence} to {where}, where it has written "
                f"nothing yet: expected sequence 0. Records may have been lost; the producer must stop "
                f"and re-initialize",
            )
        return Append(last_sequence)
    if producer_epoch < entry.producer_epoch:
        code = ErrorCode.PRODUCER_FENCED if transactional else ErrorCode.INVALID_PRODUCER_EPOCH
        return BrokerError(
            code,
            f"producer {producer_id} wrote to {where} with epoch {producer_epoch}, but epoch "
            f"{entry.producer_epoch} has written there since: this producer instance is stale; close it",
        )
    if producer_epoch > entry.producer_epoch:
        if base_sequence != 0:
            return BrokerError(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {producer_id} started epoch {producer_epoch} on {where} at sequence "
                f"{base_sequence}: a new epoch starts at sequence 0",
            )
        return Append(last_sequence)
    for batch in entry.recent_batches:
        if batch.base_sequence == base_sequence and batch.last_sequence == last_sequence:
            return Duplicate(batch.base_offset, batch.last_offset, batch.max_timestamp_ms)
    expected = (entry.last_sequence + 1) % SEQUENCE_MODULUS
    if base_sequence != expected:
        return BrokerError(
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
            f"producer {producer_id} epoch {producer_epoch} sent sequence {base_sequence} to {where}: "
            f"expected {expected} (its last written sequence is {entry.last_sequence}). A gap means "
            f"records may be lost: the producer must stop",
        )
    return Append(last_sequence)


def remember(
    entry: ProducerEntry | None,
    producer_epoch: int,
    base_sequence: int,
    last_sequence: int,
    base_offset: int,
    last_offset: int,
    max_timestamp_ms: int,
    transactional: bool,
) -> ProducerEntry:
    """The producer's state after appending this batch (`max_timestamp_ms` its max timestamp as stored)."""
    recent = () if entry is None or entry.producer_epoch != producer_epoch else entry.recent_batches
    appended = RecentBatch(base_sequence, last_sequence, base_offset, last_offset, max_timestamp_ms)
    recent = (*recent, appended)[-RECENT_BATCHES:]
    first_open = entry.current_txn_first_offset if entry is not None else None
    if transactional and first_open is None:
        first_open = base_offset
    return ProducerEntry(producer_epoch, last_sequence, recent, first_open)


def coordinator_batch(entry: ProducerEntry | None, producer_epoch: int, base_offset: int) -> ProducerEntry:
    """The producer's state after a batch the coordinator wrote in its transaction (append.py's
    AppendOrigin.COORDINATOR): no sequence was checked or used, so the sequence state stays as it
    was; the epoch is the transaction's, and its transaction is open here from this batch on unless
    it already was."""
    if entry is None:
        return ProducerEntry(producer_epoch, NO_SEQUENCE, (), base_offset)
    first_open = entry.current_txn_first_offset if entry.current_txn_first_offset is not None else base_offset
    return ProducerEntry(producer_epoch, entry.last_sequence, entry.recent_batches, first_open)
