"""Bounds on what one Kafka request may make a worker do or hold, whatever the client asks
(docs/kafka.md, "Starting it"): a Fetch is answered at most kafka_fetch_max_bytes of batches (Kafka's
fetch.max.bytes); a request of any other API than Produce is at most kafka_max_other_request_bytes."""

from __future__ import annotations

import datetime

from app.kafka import api_table
from app.kafka.record_batches import KafkaRecord
from tests.kafka.clients import create_topic
from tests.kafka.raw import RawConnection, nested, record_batch, request_frame, request_of
from tests.kafka.test_produce_raw import _batches_of, produce_request

FETCH_MAX_BYTES = 1024  # the smallest the setting takes, as Kafka's fetch.max.bytes
ASKED_BYTES = 2**31 - 1  # the most a Fetch can ask, for the fetch and for each partition
BATCHES = 8
OTHER_REQUEST_BYTES = 4096
KAFKA_SERVER_SETTINGS = {  # module_kafka_server's
    "kafka_fetch_max_bytes": FETCH_MAX_BYTES,
    "kafka_max_other_request_bytes": OTHER_REQUEST_BYTES,
}


def _batch() -> bytes:
    return record_batch([KafkaRecord(1_700_000_000_000, None, b"v" * 200, [])])


def _fetch_everything(topic: str):
    partition = nested(
        api_table.FETCH, 12, "FetchPartition", partition=0, fetch_offset=0, partition_max_bytes=ASKED_BYTES
    )
    return request_of(
        api_table.FETCH,
        12,
        max_wait=datetime.timedelta(0),
        min_bytes=1,
        max_bytes=ASKED_BYTES,
        isolation_level=0,
        topics=(nested(api_table.FETCH, 12, "FetchTopic", topic=topic, partitions=(partition,)),),
        forgotten_topics_data=(),
    )


def test_a_fetch_is_answered_at_most_fetch_max_bytes_whatever_it_asks(module_kafka_server):
    """Regression: a Fetch's max_bytes and partition_max_bytes were taken as asked, so one asking
    2 GiB of a large topic made the worker read and hold up to that much (200 batches a
    partition, every partition) for one answer. Kafka's broker caps a fetch at its fetch.max.bytes
    (55 MiB by default), and so does txbroker, with kafka_fetch_max_bytes."""
    topic = "bounded-fetch"
    create_topic(module_kafka_server, topic)
    batch = _batch()
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        for _ in range(BATCHES):
            assert connection.call(produce_request(topic, 0, batch)).responses[0].partition_responses[0].error_code == 0
        fetched = _batches_of(connection.call(_fetch_everything(topic)))
    assert BATCHES * len(batch) > FETCH_MAX_BYTES
    assert [b.base_offset for b in fetched] == list(range(FETCH_MAX_BYTES // len(batch)))


def _list_offsets(topic: str, entries: int):
    partition = nested(api_table.LIST_OFFSETS, 7, "ListOffsetsPartition", partition_index=0, timestamp=-1)
    return request_of(
        api_table.LIST_OFFSETS,
        7,
        replica_id=-1,
        isolation_level=0,
        topics=(nested(api_table.LIST_OFFSETS, 7, "ListOffsetsTopic", name=topic, partitions=(partition,) * entries),),
    )


def test_a_request_of_many_entries_is_refused_unparsed_and_other_connections_are_served(module_kafka_server):
    """Regression: a request of any API was taken up to kafka_max_request_bytes (100 MiB), and one of
    many small entries (a ListOffsets naming one partition a million times, 17 MB) kept its worker's
    event loop, every other connection of it waiting, for seconds: parsing, handling and encoding
    cost a Python step per entry. Only Produce, whose batches are checked whole, may be that large;
    any other request beyond kafka_max_other_request_bytes closes its connection unparsed, as a frame
    over kafka_max_request_bytes does, and a Produce of the same size is served."""
    topic = "bounded-requests"
    create_topic(module_kafka_server, topic)
    bootstrap = module_kafka_server.extra["kafka_bootstrap"]
    small = _list_offsets(topic, 1)
    with RawConnection(bootstrap) as connection:
        [answered] = connection.call(small).topics[0].partitions[:1]
        assert answered.error_code == 0
        large = _list_offsets(topic, 1000)
        assert len(request_frame(large)) > OTHER_REQUEST_BYTES
        connection.send(large)
        assert connection.closed_by_peer()
    with RawConnection(bootstrap) as connection:
        assert connection.call(small).topics[0].partitions[0].error_code == 0
        big_batch = record_batch([KafkaRecord(1_700_000_000_000, None, b"v" * (2 * OTHER_REQUEST_BYTES), [])])
        produced = connection.call(produce_request(topic, 0, big_batch))
        assert produced.responses[0].partition_responses[0].error_code == 0
