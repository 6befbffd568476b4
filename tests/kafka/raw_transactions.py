"""Raw requests of a transactional producer (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn,
TxnOffsetCommit, EndTxn) over a RawConnection, for tests that must choose each version and field."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from app.kafka.record_batches import KafkaRecord
from tests.kafka.raw import RawConnection, by_topic, nested, record_batch, request_of

TIMEOUT = datetime.timedelta(seconds=60)


@dataclass
class RawProducer:
    transactional_id: str
    producer_id: int
    epoch: int


def init_producer(connection: RawConnection, transactional_id: str, version: int = 4) -> RawProducer:
    response = connection.call(
        request_of(
            api_table.INIT_PRODUCER_ID,
            version,
            transactional_id=transactional_id,
            transaction_timeout=TIMEOUT,
            producer_id=-1,
            producer_epoch=-1,
        )
    )
    assert response.error_code == KafkaError.none, response
    return RawProducer(transactional_id, response.producer_id, response.producer_epoch)


def add_partitions(connection: RawConnection, producer: RawProducer, topic: str, partitions, version: int = 3):
    return [code for _, _, code in add_partitions_of(connection, producer, [(topic, partitions)], version)]


def add_partitions_of(
    connection: RawConnection, producer: RawProducer, topics: list[tuple[str, list[int]]], version: int = 3
) -> list[tuple[str, int, KafkaError]]:
    """AddPartitionsToTxn of (topic, partitions) entries: (topic, partition, error code) as answered."""
    key = api_table.ADD_PARTITIONS_TO_TXN
    response = connection.call(
        request_of(
            key,
            version,
            v3_and_below_transactional_id=producer.transactional_id,
            v3_and_below_producer_id=producer.producer_id,
            v3_and_below_producer_epoch=producer.epoch,
            v3_and_below_topics=tuple(
                nested(key, version, "AddPartitionsToTxnTopic", name=topic, partitions=tuple(partitions))
                for topic, partitions in topics
            ),
        )
    )
    return [
        (t.name, p.partition_index, p.partition_error_code)
        for t in response.results_by_topic_v3_and_below
        for p in t.results_by_partition
    ]


def add_offsets(connection: RawConnection, producer: RawProducer, group_id: str, version: int = 3):
    return connection.call(
        request_of(
            api_table.ADD_OFFSETS_TO_TXN,
            version,
            transactional_id=producer.transactional_id,
            producer_id=producer.producer_id,
            producer_epoch=producer.epoch,
            group_id=group_id,
        )
    ).error_code


def txn_offset_commit(
    connection: RawConnection,
    producer: RawProducer,
    group_id: str,
    topic: str,
    offset: int,
    version: int = 3,
    member: tuple[int, str, str | None] = (-1, "", None),
    metadata: str | None = "raw",
    leader_epoch: int = -1,
    partitions: list[tuple[str, int]] | None = None,
):
    """member: (generation, member id, group instance id) as v3 sends them (KIP-447); `leader_epoch`
    is sent from v2. `partitions`: the (topic, partition)s committed instead of the topic's partition
    0, each topic once (in the order first named); the error codes in the response's order."""
    key = api_table.TXN_OFFSET_COMMIT
    topics = tuple(
        nested(
            key,
            version,
            "TxnOffsetCommitRequestTopic",
            name=name,
            partitions=tuple(
                nested(
                    key,
                    version,
                    "TxnOffsetCommitRequestPartition",
                    partition_index=index,
                    committed_offset=offset,
                    committed_leader_epoch=leader_epoch,
                    committed_metadata=metadata,
                )
                for index in indexes
            ),
        )
        for name, indexes in by_topic(partitions or [(topic, 0)]).items()
    )
    response = connection.call(
        request_of(
            key,
            version,
            transactional_id=producer.transactional_id,
            group_id=group_id,
            producer_id=producer.producer_id,
            producer_epoch=producer.epoch,
            generation_id=member[0],
            member_id=member[1],
            group_instance_id=member[2],
            topics=topics,
        )
    )
    return [p.error_code for t in response.topics for p in t.partitions]


def end_txn(connection: RawConnection, producer: RawProducer, committed: bool, version: int):
    return connection.call(
        request_of(
            api_table.END_TXN,
            version,
            transactional_id=producer.transactional_id,
            producer_id=producer.producer_id,
            producer_epoch=producer.epoch,
            committed=committed,
        )
    )


def produce(
    connection: RawConnection, producer: RawProducer, topic: str, partition: int, values: list[bytes], sequence: int
):
    """A transactional batch (Produce v9); the partition's error code."""
    key = api_table.PRODUCE
    batch = record_batch(
        [KafkaRecord(1_700_000_000_000, None, value, []) for value in values],
        producer_id=producer.producer_id,
        epoch=producer.epoch,
        base_sequence=sequence,
        is_transactional=True,
    )
    data = nested(key, 9, "PartitionProduceData", index=partition, records=batch)
    response = connection.call(
        request_of(
            key,
            9,
            transactional_id=producer.transactional_id,
            acks=-1,
            timeout=TIMEOUT,
            topic_data=(nested(key, 9, "TopicProduceData", name=topic, partition_data=(data,)),),
        )
    )
    [topic_response] = response.responses
    [partition_response] = topic_response.partition_responses
    return partition_response.error_code


def one_committed_batch(connection: RawConnection, transactional_id: str, topic: str, values: list[bytes]) -> None:
    """A new transactional producer's one transaction, committed: a batch of `values` in partition 0
    of `topic`, then its COMMIT marker."""
    producer = init_producer(connection, transactional_id)
    assert add_partitions(connection, producer, topic, [0]) == [KafkaError.none]
    assert produce(connection, producer, topic, 0, values, sequence=0) == KafkaError.none
    assert end_txn(connection, producer, True, version=4).error_code == KafkaError.none
