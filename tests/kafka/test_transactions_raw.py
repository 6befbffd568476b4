"""Transactions with raw requests, each version chosen: EndTxn v5 ends a transaction as HTTP does
(transaction version 2, KIP-890: the epoch bumped, answered in the response); below v5 as Kafka's
clients expect (version 1: the epoch and the sequences carry over); Kafka's errors by version; a
transaction's pending offsets UNSTABLE_OFFSET_COMMIT to a require_stable fetch."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.kafka import http_side
from tests.kafka.clients import ConfluentKafka, create_topic
from tests.kafka.raw import RawConnection, request_of
from tests.kafka.raw_transactions import (
    RawProducer,
    add_offsets,
    add_partitions,
    add_partitions_of,
    end_txn,
    init_producer,
    produce,
    txn_offset_commit,
)

CONFLUENT = ConfluentKafka()


def _committed_values(server, topic: str) -> list[bytes]:
    over_http = [http_side.unb64(r["value"]) for r in http_side.fetch(server, topic, 0, "read_committed")]
    over_kafka = [r.value for r in CONFLUENT.consume(server, topic, 0, len(over_http), isolation="read_committed")]
    assert over_kafka == over_http
    return over_http


def _described(server, transactional_id: str) -> dict:
    response = server.client.get(f"/v1/transactions/{transactional_id}")
    assert response.status_code == 200, response.text
    return response.json()


def test_end_txn_v5_bumps_the_epoch_per_transaction_as_http(module_kafka_server):
    server = module_kafka_server
    topic = "raw-tv2"
    create_topic(server, topic, 1)
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        producer = init_producer(connection, "tid-raw-tv2")
        first_epoch = producer.epoch
        assert add_partitions(connection, producer, topic, [0]) == [KafkaError.none]
        assert produce(connection, producer, topic, 0, [b"tv2-committed"], sequence=0) == KafkaError.none
        ended = end_txn(connection, producer, True, version=5)
        assert ended.error_code == KafkaError.none
        assert (ended.producer_id, ended.producer_epoch) == (producer.producer_id, first_epoch + 1)

        # The finished transaction's epoch is fenced; the EndTxn retried with it gets its answer.
        assert produce(connection, producer, topic, 0, [b"late"], sequence=1) == KafkaError.invalid_producer_epoch
        retried = end_txn(connection, producer, True, version=5)
        assert (retried.error_code, retried.producer_epoch) == (KafkaError.none, first_epoch + 1)

        # The next transaction: the new epoch, its sequences from 0.
        producer = RawProducer(producer.transactional_id, ended.producer_id, ended.producer_epoch)
        assert add_partitions(connection, producer, topic, [0]) == [KafkaError.none]
        assert produce(connection, producer, topic, 0, [b"tv2-aborted"], sequence=0) == KafkaError.none
        aborted = end_txn(connection, producer, False, version=5)
        assert (aborted.error_code, aborted.producer_epoch) == (KafkaError.none, first_epoch + 2)

    assert _committed_values(server, topic) == [b"tv2-committed"]
    described = _described(server, "tid-raw-tv2")
    assert (described["state"], described["producer_epoch"], described["transaction_version"]) == (
        "CompleteAbort",
        first_epoch + 2,
        2,
    )
    markers = server.client.get(f"/v1/topics/{topic}/partitions/0/markers").json()["markers"]
    assert [(m["type"], m["producer_epoch"]) for m in markers] == [("COMMIT", first_epoch), ("ABORT", first_epoch + 1)]


def test_end_txn_below_v5_keeps_the_epoch_and_the_sequences(module_kafka_server):
    server = module_kafka_server
    topic = "raw-tv1"
    create_topic(server, topic, 1)
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        producer = init_producer(connection, "tid-raw-tv1")
        # No EndTxn has ended a transaction of the id yet: no version, until this one's below v5.
        assert _described(server, "tid-raw-tv1")["transaction_version"] is None
        values = iter(range(100))
        sequence = 0
        outcomes = [True, False, False, True, False, True]
        for commit in outcomes:
            assert add_partitions(connection, producer, topic, [0]) == [KafkaError.none]
            value = f"tv1-{next(values)}-{'committed' if commit else 'aborted'}".encode()
            assert produce(connection, producer, topic, 0, [value, value], sequence=sequence) == KafkaError.none
            sequence += 2  # the sequences carry over: the epoch does not change
            assert end_txn(connection, producer, commit, version=3).error_code == KafkaError.none
        # Version 1's EndTxn retried is answered as the first; the other outcome is refused.
        assert end_txn(connection, producer, True, version=3).error_code == KafkaError.none
        assert end_txn(connection, producer, False, version=3).error_code == KafkaError.invalid_txn_state

    committed = _committed_values(server, topic)
    assert committed == [v for v in committed if v.endswith(b"committed")]
    assert len(committed) == 2 * outcomes.count(True)
    described = _described(server, "tid-raw-tv1")
    assert (described["producer_epoch"], described["transaction_version"]) == (producer.epoch, 1)
    markers = server.client.get(f"/v1/topics/{topic}/partitions/0/markers").json()["markers"]
    assert [m["type"] == "COMMIT" for m in markers] == outcomes
    assert {m["producer_epoch"] for m in markers} == {producer.epoch}


def test_kafka_errors_by_version(module_kafka_server):
    server = module_kafka_server
    topic = "raw-errors"
    create_topic(server, topic, 1)
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        too_long = connection.call(
            request_of(
                api_table.INIT_PRODUCER_ID,
                4,
                transactional_id="tid-raw-errors",
                transaction_timeout=datetime.timedelta(milliseconds=server.settings.transaction_max_timeout_ms + 1),
                producer_id=-1,
                producer_epoch=-1,
            )
        )
        assert too_long.error_code == KafkaError.invalid_transaction_timeout

        zombie = init_producer(connection, "tid-raw-errors")
        assert end_txn(connection, zombie, True, version=3).error_code == KafkaError.invalid_txn_state  # none open
        init_producer(connection, "tid-raw-errors")  # a new instance: the zombie is fenced
        # PRODUCER_FENCED from the versions that know it (KIP-588), INVALID_PRODUCER_EPOCH before.
        assert add_partitions(connection, zombie, topic, [0], version=3) == [KafkaError.producer_fenced]
        assert add_partitions(connection, zombie, topic, [0], version=1) == [KafkaError.invalid_producer_epoch]
        assert add_offsets(connection, zombie, "g", version=2) == KafkaError.producer_fenced
        assert add_offsets(connection, zombie, "g", version=0) == KafkaError.invalid_producer_epoch
        assert end_txn(connection, zombie, True, version=2).error_code == KafkaError.producer_fenced
        assert end_txn(connection, zombie, True, version=1).error_code == KafkaError.invalid_producer_epoch
        assert txn_offset_commit(connection, zombie, "g", topic, 0, version=3) == [KafkaError.producer_fenced]
        assert txn_offset_commit(connection, zombie, "g", topic, 0, version=1) == [KafkaError.invalid_producer_epoch]
        # Produce never answers PRODUCER_FENCED (as Kafka): a fenced epoch is INVALID_PRODUCER_EPOCH.
        assert produce(connection, zombie, topic, 0, [b"zombie"], sequence=0) == KafkaError.invalid_producer_epoch
    assert _committed_values(server, topic) == []


def test_pending_transactional_offsets_are_unstable_until_the_end(module_kafka_server):
    server = module_kafka_server
    topic, group = "raw-offsets", "raw-offsets-group"
    create_topic(server, topic, 1)

    def fetched() -> dict:
        response = server.client.post(
            f"/v1/groups/{group}/offsets/fetch",
            json={"partitions": [{"topic": topic, "partition": 0}], "require_stable": True},
        )
        assert response.status_code == 200, response.text
        [entry] = response.json()["offsets"]
        return entry

    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        producer = init_producer(connection, "tid-raw-offsets")
        assert add_offsets(connection, producer, group) == KafkaError.none
        assert txn_offset_commit(connection, producer, group, topic, 7) == [KafkaError.none]
        pending = fetched()
        assert pending["error"]["code"] == "UNSTABLE_OFFSET_COMMIT", pending
        assert end_txn(connection, producer, True, version=3).error_code == KafkaError.none
        assert (fetched()["offset"], fetched()["error"]) == (7, None)

        # The next transaction of the same epoch (version 1): aborted, its offset never shows.
        assert add_offsets(connection, producer, group) == KafkaError.none
        assert txn_offset_commit(connection, producer, group, topic, 9) == [KafkaError.none]
        assert end_txn(connection, producer, False, version=3).error_code == KafkaError.none
        assert (fetched()["offset"], fetched()["error"]) == (7, None)


def test_add_partitions_with_an_unknown_partition_adds_none(module_kafka_server):
    """Regression: AddPartitionsToTxn added the partitions that exist and refused the others. Kafka's
    broker refuses the whole request, before it looks at the producer: the unknown partitions are
    UNKNOWN_TOPIC_OR_PARTITION, the others OPERATION_NOT_ATTEMPTED, and none is added
    (KafkaApis.handleAddPartitionsToTxnRequest); a partition named twice is answered once."""
    server = module_kafka_server
    topic = "raw-add-unknown"
    create_topic(server, topic, 2)
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        producer = init_producer(connection, "tid-raw-add-unknown")
        answers = add_partitions_of(connection, producer, [(topic, [0, 7, 0]), ("raw-add-none", [0]), (topic, [1])])
        assert sorted(answers) == [
            ("raw-add-none", 0, KafkaError.unknown_topic_or_partition),
            (topic, 0, KafkaError.operation_not_attempted),
            (topic, 1, KafkaError.operation_not_attempted),
            (topic, 7, KafkaError.unknown_topic_or_partition),
        ]
        assert _described(server, "tid-raw-add-unknown")["state"] == "Empty"
        # Checked before the producer: a fenced one gets the same answer.
        init_producer(connection, "tid-raw-add-unknown")
        assert add_partitions(connection, producer, topic, [0, 2]) == [
            KafkaError.operation_not_attempted,
            KafkaError.unknown_topic_or_partition,
        ]
        assert add_partitions(connection, producer, topic, [0]) == [KafkaError.producer_fenced]


def test_add_partitions_of_an_internal_topic_is_refused_as_unauthorized(module_kafka_server):
    """Regression: an internal topic was INVALID_TOPIC_EXCEPTION and the other partitions were added.
    Kafka's broker leaves internal topics out of those it authorizes (KafkaApis
    .handleAddPartitionsToTxnRequest): TOPIC_AUTHORIZATION_FAILED whoever asks (here the super user
    every caller is with auth off), the others OPERATION_NOT_ATTEMPTED, none added."""
    server = module_kafka_server
    topic, transactional_id = "raw-add-internal", "tid-raw-add-internal"
    create_topic(server, topic, 1)
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        producer = init_producer(connection, transactional_id)
        answers = add_partitions_of(connection, producer, [("__consumer_offsets", [0]), (topic, [0])])
    assert answers == [
        ("__consumer_offsets", 0, KafkaError.topic_authorization_failed),
        (topic, 0, KafkaError.operation_not_attempted),
    ]
    assert _described(server, transactional_id)["state"] == "Empty"


def test_txn_offset_commit_naming_a_generation_of_a_group_that_does_not_exist_is_illegal_generation(
    module_kafka_server,
):
    """Regression: such a commit (KIP-447's v3+) made the group and answered UNKNOWN_MEMBER_ID. Kafka's
    group coordinator answers ILLEGAL_GENERATION and makes no group
    (OffsetMetadataManager.validateTransactionalOffsetCommit); nothing joins the transaction.
    Generation -1 commits to a group that does not exist, as before."""
    server = module_kafka_server
    topic, transactional_id = "raw-txn-commit-no-group", "tid-raw-txn-commit-no-group"
    create_topic(server, topic, 1)
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        producer = init_producer(connection, transactional_id)
        refused = txn_offset_commit(connection, producer, "raw-never-made", topic, 5, member=(0, "ghost", None))
        assert refused == [KafkaError.illegal_generation]
        assert server.client.get("/v1/groups/raw-never-made").status_code == 404
        assert _described(server, transactional_id)["state"] == "Empty"
        assert txn_offset_commit(connection, producer, "raw-made-by-commit", topic, 5) == [KafkaError.none]
        assert end_txn(connection, producer, True, version=3).error_code == KafkaError.none
    assert server.client.get("/v1/groups/raw-made-by-commit").status_code == 200
