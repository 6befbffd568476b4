"""The SDK's pure parts, with no I/O at all: the client transaction state machine (declared as data),
the sequence bookkeeping, the error classes (one per code of the wire's registry, which the server
shares), the partitioner's use."""

from __future__ import annotations

import pickle
import time

import pytest

from txbroker import errors
from txbroker.accumulator import RecordAccumulator
from txbroker.errors import IllegalStateError
from txbroker.records import TopicPartition
from txbroker.transaction_manager import (
    VALID_PREVIOUS_STATES,
    TransactionManager,
    TransactionState,
    is_transition_valid,
)
from txbroker.wire import ERROR_SPECS, ErrorCode, partition_for_key

S = TransactionState
TP = TopicPartition("t", 0)


def test_every_state_declares_its_previous_states_and_fatal_is_reachable_from_all():
    assert set(VALID_PREVIOUS_STATES) == set(S)
    assert VALID_PREVIOUS_STATES[S.FATAL_ERROR] == frozenset(S)
    assert VALID_PREVIOUS_STATES[S.UNINITIALIZED] == frozenset(), "nothing leads back to UNINITIALIZED"
    assert is_transition_valid(S.IN_TRANSACTION, S.COMMITTING)
    assert not is_transition_valid(S.COMMITTING, S.ABORTING), "a commit in doubt is never turned into an abort"
    assert not is_transition_valid(S.READY, S.COMMITTING)


def test_a_full_transaction_cycle_and_the_epoch_of_the_next():
    tm = TransactionManager("app")
    tm.initialized(5, 0)
    assert tm.state is S.READY
    tm.begin_transaction()
    assert tm.take_sequence(TP, 3) == 0 and tm.take_sequence(TP, 2) == 3
    tm.added_partition(TP)
    tm.transition_to(S.COMMITTING)
    body = tm.end_body(True)
    assert tm.end_body(True) is body, "a retry sends the very same body"
    assert body == {"transactional_id": "app", "producer_id": 5, "producer_epoch": 0, "committed": True}
    tm.completed(5, 1)
    assert (tm.state, tm.producer_epoch, tm.next_sequence(TP)) == (S.READY, 1, 0), "a new epoch restarts at 0"
    assert not tm.transaction_has_content and tm.pending_end is None


def test_invalid_calls_raise_illegal_state_not_assertions():
    tm = TransactionManager("app")
    with pytest.raises(IllegalStateError, match="init_transactions"):
        tm.begin_transaction()
    tm.initialized(1, 0)
    with pytest.raises(IllegalStateError, match="begin_transaction"):
        tm.check_can_send()
    tm.begin_transaction()
    with pytest.raises(IllegalStateError, match="already open"):
        tm.begin_transaction()
    with pytest.raises(IllegalStateError, match="IN_TRANSACTION to READY"):
        tm.transition_to(S.READY)
    with pytest.raises(IllegalStateError, match="transactional producer"):
        TransactionManager(None).begin_transaction()


def test_abortable_error_allows_only_abort():
    tm = TransactionManager("app")
    tm.initialized(1, 0)
    tm.begin_transaction()
    error = tm.fail_abortable(errors.UnknownTopicOrPartitionError("no such topic"))
    assert tm.state is S.ABORTABLE_ERROR and error.abortable and not error.fatal
    with pytest.raises(IllegalStateError, match="abort_transaction"):
        tm.check_can_send()
    tm.transition_to(S.ABORTING)
    tm.completed(1, 1)
    assert tm.state is S.READY and tm.last_error is None


def test_fatal_error_is_final_and_reraised():
    tm = TransactionManager("app")
    tm.initialized(1, 0)
    tm.begin_transaction()
    fenced = errors.ProducerFencedError("a newer instance")
    assert tm.fail_fatal(fenced) is fenced
    assert tm.state is S.FATAL_ERROR
    with pytest.raises(errors.ProducerFencedError):
        tm.check_can_send()
    with pytest.raises(errors.ProducerFencedError):
        tm.transition_to(S.READY)
    # an error that is not fatal by default becomes fatal when it ends the producer
    idempotent = TransactionManager(None)
    error = idempotent.fail_fatal(errors.UnknownProducerIdError("gone"))
    assert error.fatal and isinstance(error, errors.UnknownProducerIdError) and idempotent.state is S.FATAL_ERROR


def test_rollback_only_moves_a_sequence_back():
    tm = TransactionManager(None)
    tm.initialized(1, 0)
    base = tm.take_sequence(TP, 4)
    tm.rollback_sequence(TP, base, 4)
    assert tm.next_sequence(TP) == 0
    tm.take_sequence(TP, 4)
    tm.rollback_sequence(TP, 9, 1)
    assert tm.next_sequence(TP) == 4


def test_sequences_wrap_past_int_max_as_kafkas_and_roll_back_across_the_wrap():
    tm = TransactionManager(None)
    tm.initialized(1, 0)
    tm.take_sequence(TP, 2**31 - 2)
    assert tm.take_sequence(TP, 5) == 2**31 - 2 and tm.next_sequence(TP) == 3, "the batch ends past 0"
    tm.rollback_sequence(TP, 2**31 - 2, 5)
    assert tm.next_sequence(TP) == 2**31 - 2


# ---- errors: a class for each code of the registry that the server uses too


def test_every_error_code_has_a_class_with_its_status_and_retriability():
    assert {str(code) for code in ErrorCode} == errors.CONTRACT_CODES
    for code, spec in ERROR_SPECS.items():
        cls = errors.for_code(str(code))
        assert cls.code == str(code) and cls.http_status == spec.http_status, code
        assert cls.default_retriable == spec.retriable, code


def test_categories_of_kip_1050():
    assert errors.ProducerFencedError().fatal and not errors.ProducerFencedError().abortable
    assert errors.InvalidTxnStateError().fatal
    assert errors.ConcurrentTransactionsError().retriable
    assert errors.CoordinatorNotAvailableError().retriable and errors.NotCoordinatorError().retriable
    assert errors.TxbrokerConnectionError().retriable
    assert errors.IllegalGenerationError().abortable
    assert errors.OutOfOrderSequenceNumberError().fatal
    assert errors.OutOfOrderSequenceNumberError().with_category(fatal=False, abortable=True).abortable


def test_from_body_and_unknown_codes():
    error = errors.from_body({"code": "PRODUCER_FENCED", "message": "epoch 3 < 4", "retriable": False}, 409)
    assert isinstance(error, errors.ProducerFencedError) and error.message == "epoch 3 < 4" and error.status == 409
    assert str(error) == "PRODUCER_FENCED: epoch 3 < 4"
    future = errors.from_body({"code": "SOMETHING_NEW", "message": "m", "retriable": True})
    assert type(future) is errors.TxbrokerError and future.code == "SOMETHING_NEW" and future.retriable
    assert errors.for_code("NOPE") is errors.TxbrokerError
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, errors.ProducerFencedError) and copy.message == error.message and copy.fatal


# ---- the accumulator's batching and partitioning


def _accumulator(**overrides) -> RecordAccumulator:
    from concurrent.futures import Future

    settings = dict(batch_size=1000, linger_ms=0, max_batch_records=3, max_buffered_records=100, future_factory=Future)
    return RecordAccumulator(**{**settings, **overrides})


def test_batches_fill_per_partition_and_drain_one_per_partition():
    acc = _accumulator(linger_ms=10_000)
    futures = [acc.append(TP, {"value": str(i)}, 1)[0] for i in range(4)]
    other = TopicPartition("t", 1)
    acc.append(other, {"value": "x"}, 1)
    now = time.monotonic()
    drained = acc.drain(now=now, busy=set(), max_records=100)
    assert [(b.tp, len(b.records)) for b in drained] == [(TP, 3)], "full batches go; a lingering one waits"
    assert acc.drain(now=now, busy={TP}, max_records=100) == []
    drained[0].complete(40)
    assert [f.result(0).offset for f in futures[:3]] == [40, 41, 42], "one future per batch, one view per record"
    assert not futures[3].done()
    later = acc.drain(now=now + 11, busy=set(), max_records=100)
    assert sorted((b.tp.partition, len(b.records)) for b in later) == [(0, 1), (1, 1)]
    assert acc.buffered_records == 0


def test_keys_use_murmur2_and_null_keys_stick_until_the_batch_is_sent():
    acc = _accumulator()
    assert acc.choose_partition("t", b"order-42", 6) == partition_for_key(b"order-42", 6)
    first = acc.choose_partition("t", None, 6)
    assert acc.choose_partition("t", None, 6) == first, "sticky within a batch"
    for _ in range(3):
        acc.append(TopicPartition("t", first), {}, 1)
    assert acc.choose_partition("t", None, 6) != first, "a full batch moves the sticky partition on"
