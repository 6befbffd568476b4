"""The transitions of TransactionMetadata (pure, no I/O): what each changes, what each records for
the transaction log, the expected refusals (typed BrokerErrors, the metadata untouched), and that a
transition the state table forbids raises IllegalStateTransition before anything changes."""

from __future__ import annotations

import dataclasses

import pytest

from app.coordinator.transaction_metadata import TransactionMetadata, check_producer
from app.coordinator.transaction_states import IllegalStateTransition, TransactionState
from app.errors import BrokerError, ErrorCode
from app.storage.log.partition_log import CONTROL_ABORT, CONTROL_COMMIT
from app.storage.log.topics import CONSUMER_OFFSETS_TOPIC
from app.storage.transactions.producer_ids import ProducerIdAndEpoch
from app.storage.transactions.transaction_log import NO_START_TIME, TxnPartition

S = TransactionState
P0 = TxnPartition("orders", 0, 7)
P1 = TxnPartition("orders", 1, 7)
OFFSETS = TxnPartition(CONSUMER_OFFSETS_TOPIC, 3, 2)


def _meta(state: TransactionState = S.EMPTY, **fields) -> TransactionMetadata:
    return TransactionMetadata("tid", 10, 4, state, 60_000, NO_START_TIME, 1, **fields)


def _ongoing(*partitions: TxnPartition, groups=()) -> TransactionMetadata:
    meta = _meta()
    meta.prepare_add_partitions(list(partitions) or [P0], list(groups), 100)
    meta.pending_records.clear()
    return meta


def _snapshot(meta: TransactionMetadata) -> dict:
    return dataclasses.asdict(meta)


def test_adding_partitions_begins_a_transaction_with_the_current_producer():
    meta = _meta(S.COMPLETE_COMMIT, last_producer_id=10, last_producer_epoch=3)
    meta.prepare_add_partitions([P0, P0, P1], ["g"], 100)
    assert meta.state is S.ONGOING
    assert (meta.partitions, meta.groups, meta.txn_start_ms, meta.last_update_ms) == ([P0, P1], ["g"], 100, 100)
    assert (meta.txn_producer_id, meta.txn_producer_epoch) == (10, 4)
    assert (meta.last_producer_id, meta.last_producer_epoch) == (None, None)
    assert [record["state"] for record in meta.pending_records] == ["Ongoing"]
    assert meta.pending_records[0]["partitions"] == [["orders", 0], ["orders", 1]]


def test_adding_to_an_open_transaction_extends_it_and_keeps_its_start():
    meta = _ongoing(P0)
    meta.prepare_add_partitions([P0, P1], [], 200)
    assert (meta.partitions, meta.txn_start_ms, meta.last_update_ms) == ([P0, P1], 100, 200)
    assert len(meta.pending_records) == 1


def test_adding_nothing_new_begins_nothing_and_records_nothing():
    meta = _meta()
    meta.prepare_add_partitions([], [], 100)
    assert (meta.state, meta.pending_records) == (S.EMPTY, [])
    ongoing = _ongoing(P0, groups=["g"])
    ongoing.prepare_add_partitions([P0], ["g"], 200)
    assert (ongoing.last_update_ms, ongoing.pending_records) == (100, [])


@pytest.mark.parametrize(
    ("state", "code"),
    [
        (S.PREPARED, ErrorCode.INVALID_TXN_STATE),
        (S.PREPARE_COMMIT, ErrorCode.CONCURRENT_TRANSACTIONS),
        (S.PREPARE_ABORT, ErrorCode.CONCURRENT_TRANSACTIONS),
        (S.PREPARE_EPOCH_FENCE, ErrorCode.CONCURRENT_TRANSACTIONS),
    ],
)
def test_adding_partitions_is_refused_while_the_transaction_takes_no_writes(state, code):
    meta = _meta(state, partitions=[P0])
    before = _snapshot(meta)
    with pytest.raises(BrokerError) as refused:
        meta.prepare_add_partitions([P1], [], 100)
    assert refused.value.code == code
    assert _snapshot(meta) == before


def test_two_phase_prepare_moves_ongoing_to_prepared_and_a_retry_changes_nothing():
    meta = _ongoing(P0)
    meta.prepare_two_phase(200)
    assert (meta.state, [r["state"] for r in meta.pending_records]) == (S.PREPARED, ["Prepared"])
    meta.prepare_two_phase(300)
    assert (meta.last_update_ms, len(meta.pending_records)) == (200, 1)


@pytest.mark.parametrize(
    ("commit", "prepared", "completed"),
    [(True, S.PREPARE_COMMIT, S.COMPLETE_COMMIT), (False, S.PREPARE_ABORT, S.COMPLETE_ABORT)],
)
def test_end_decides_the_outcome_then_completes_with_an_epoch_bump(commit, prepared, completed):
    meta = _ongoing(P0, OFFSETS, groups=["g"])
    meta.prepare_end(commit, 200)
    assert meta.state is prepared
    end = meta.transaction_end()
    assert end.partitions == [(7, 0), (2, 3)]
    assert (end.producer_id, end.producer_epoch) == (10, 4)
    assert end.control_type == (CONTROL_COMMIT if commit else CONTROL_ABORT)
    assert end.consumer_offsets_partitions == [3]
    meta.complete_end(210, ProducerIdAndEpoch(10, 5))
    assert meta.state is completed
    assert (meta.partitions, meta.groups, meta.txn_start_ms) == ([], [], NO_START_TIME)
    assert (meta.txn_producer_id, meta.txn_producer_epoch) == (None, None)
    assert (meta.producer_id, meta.producer_epoch) == (10, 5)
    assert (meta.last_producer_id, meta.last_producer_epoch) == (10, 4)
    assert meta.is_retry_of_last(10, 4) and not meta.is_retry_of_last(10, 5)
    assert [r["state"] for r in meta.pending_records] == [prepared.value, completed.value]


def test_end_of_a_prepared_transaction_and_of_one_left_in_its_prepare_state():
    prepared = _ongoing(P0)
    prepared.prepare_two_phase(200)
    prepared.prepare_end(True, 300)
    assert prepared.state is S.PREPARE_COMMIT
    left = _meta(S.PREPARE_ABORT, partitions=[P0])  # durable from a crash between the steps
    left.prepare_end(False, 300)
    assert (left.state, left.pending_records) == (S.PREPARE_ABORT, [])


@pytest.mark.parametrize(
    ("state", "commit", "code"),
    [
        (S.EMPTY, True, ErrorCode.INVALID_TXN_STATE),
        (S.COMPLETE_ABORT, False, ErrorCode.INVALID_TXN_STATE),
        (S.PREPARE_ABORT, True, ErrorCode.INVALID_TXN_STATE),
        (S.PREPARE_COMMIT, False, ErrorCode.INVALID_TXN_STATE),
        (S.PREPARE_EPOCH_FENCE, False, ErrorCode.CONCURRENT_TRANSACTIONS),
    ],
)
def test_end_is_refused_without_an_open_transaction_or_against_the_decided_outcome(state, commit, code):
    meta = _meta(state)
    before = _snapshot(meta)
    with pytest.raises(BrokerError) as refused:
        meta.prepare_end(commit, 200)
    assert refused.value.code == code
    assert _snapshot(meta) == before


def test_fencing_an_ongoing_transaction_bumps_the_producer_then_decides_the_abort():
    meta = _ongoing(P0)
    meta.fence(ProducerIdAndEpoch(10, 5), 200)
    assert meta.state is S.PREPARE_ABORT
    assert (meta.producer_id, meta.producer_epoch) == (10, 5)
    assert (meta.txn_producer_id, meta.txn_producer_epoch) == (10, 4)  # the markers are the old epoch's
    assert [(r["state"], r["producer_epoch"]) for r in meta.pending_records] == [
        ("PrepareEpochFence", 5),
        ("PrepareAbort", 5),
    ]
    meta.complete_end(210, None)
    assert (meta.state, meta.producer_epoch, meta.last_producer_id) == (S.COMPLETE_ABORT, 5, None)


def test_fencing_a_prepared_transaction_goes_straight_to_prepare_abort():
    meta = _ongoing(P0)
    meta.prepare_two_phase(150)
    meta.pending_records.clear()
    meta.fence(ProducerIdAndEpoch(11, 0), 200)
    assert (meta.state, meta.producer_id, meta.producer_epoch) == (S.PREPARE_ABORT, 11, 0)
    assert [r["state"] for r in meta.pending_records] == ["PrepareAbort"]


def test_a_durable_epoch_fence_is_finished_as_an_abort():
    meta = _meta(S.PREPARE_EPOCH_FENCE, partitions=[P0])
    meta.abort_fenced(200)
    assert (meta.state, [r["state"] for r in meta.pending_records]) == (S.PREPARE_ABORT, ["PrepareAbort"])


def test_a_new_producer_empties_the_id_and_remembers_the_retry_key():
    meta = _meta(S.COMPLETE_COMMIT, last_producer_id=10, last_producer_epoch=3)
    meta.prepare_new_producer(ProducerIdAndEpoch(10, 5), 30_000, (10, 4), 200)
    assert meta.state is S.EMPTY
    assert (meta.producer_id, meta.producer_epoch, meta.timeout_ms) == (10, 5, 30_000)
    assert (meta.last_producer_id, meta.last_producer_epoch) == (10, 4)
    assert [r["state"] for r in meta.pending_records] == ["Empty"]


def test_a_new_producer_keeps_a_prepared_transaction_without_a_state_change():
    meta = _ongoing(P0)
    meta.prepare_two_phase(150)
    meta.pending_records.clear()
    assert meta.kept_prepared() == ProducerIdAndEpoch(10, 4)
    meta.prepare_new_producer(ProducerIdAndEpoch(10, 5), 60_000, (None, None), 200)
    assert (meta.state, meta.producer_epoch, meta.last_update_ms) == (S.PREPARED, 5, 200)
    assert (meta.txn_producer_id, meta.txn_producer_epoch) == (10, 4)
    assert [r["state"] for r in meta.pending_records] == ["Prepared"]


def test_expiry_moves_an_idle_id_to_dead():
    meta = _meta(S.COMPLETE_ABORT)
    meta.prepare_dead(200)
    assert (meta.state, [r["state"] for r in meta.pending_records]) == (S.DEAD, ["Dead"])


@pytest.mark.parametrize(
    ("state", "transit"),
    [
        (S.ONGOING, lambda meta: meta.prepare_dead(200)),
        (S.EMPTY, lambda meta: meta.complete_end(200, None)),
        (S.EMPTY, lambda meta: meta.fence(ProducerIdAndEpoch(10, 5), 200)),
        (S.COMPLETE_COMMIT, lambda meta: meta.abort_fenced(200)),
        (S.PREPARE_COMMIT, lambda meta: meta.prepare_new_producer(ProducerIdAndEpoch(10, 5), 1, (None, None), 200)),
    ],
)
def test_a_transition_the_table_forbids_raises_before_changing_anything(state, transit):
    meta = _meta(state, partitions=[P0])
    before = _snapshot(meta)
    with pytest.raises(IllegalStateTransition):
        transit(meta)
    assert _snapshot(meta) == before


@pytest.mark.parametrize(
    ("producer", "code"),
    [
        ((10, 3), ErrorCode.PRODUCER_FENCED),
        ((10, 5), ErrorCode.INVALID_PRODUCER_EPOCH),
        ((99, 4), ErrorCode.INVALID_PRODUCER_ID_MAPPING),
        ((9, 0), ErrorCode.PRODUCER_FENCED),  # the producer id that ended the last transaction
    ],
)
def test_check_producer_refuses_every_producer_but_the_current_one(producer, code):
    meta = _meta(S.COMPLETE_COMMIT, last_producer_id=9, last_producer_epoch=0)
    assert check_producer(meta, "tid", 10, 4) is meta
    with pytest.raises(BrokerError) as refused:
        check_producer(meta, "tid", *producer)
    assert refused.value.code == code
    with pytest.raises(BrokerError) as unknown:
        check_producer(None, "tid", 10, 4)
    assert unknown.value.code == ErrorCode.INVALID_PRODUCER_ID_MAPPING
