"""kafka_connections_max_idle_ms (Kafka's connections.max.idle.ms): a connection that sends nothing
for that long while none of its requests is being answered is closed; one waiting for an answer is
not idle."""

from __future__ import annotations

import datetime
import logging

import pytest
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.conftest import start_server_on_fresh_database, stop_in_process_server
from tests.kafka.clients import create_topic
from tests.kafka.raw import RawConnection, nested, request_of
from tests.kafka.test_api_versions import sample_request

IDLE_MS = 1000
# Longer than the idle time: the fetch long-polls that long on an empty partition.
LONG_POLL = datetime.timedelta(milliseconds=3 * IDLE_MS)


@pytest.fixture(scope="module")
def idle_server(postgres):
    running = start_server_on_fresh_database(
        postgres, "kafka_idle_connections", kafka_listener="127.0.0.1:0", kafka_connections_max_idle_ms=IDLE_MS
    )
    yield running
    stop_in_process_server(running)


def _long_poll(topic: str):
    partition = nested(api_table.FETCH, 12, "FetchPartition", partition=0, fetch_offset=0, partition_max_bytes=1024)
    return request_of(
        api_table.FETCH,
        12,
        max_wait=LONG_POLL,
        min_bytes=1,
        max_bytes=1024,
        isolation_level=0,
        topics=(nested(api_table.FETCH, 12, "FetchTopic", topic=topic, partitions=(partition,)),),
        forgotten_topics_data=(),
    )


def test_a_connection_that_sends_nothing_is_closed_after_the_idle_time(idle_server, caplog):
    caplog.set_level(logging.INFO, logger="txbroker.kafka")
    bootstrap = idle_server.extra["kafka_bootstrap"]
    with RawConnection(bootstrap) as never_asked:
        assert never_asked.closed_by_peer()  # blocks until the server closes it (or the socket's timeout)
    with RawConnection(bootstrap) as asked_once:
        assert asked_once.call(sample_request(api_table.API_VERSIONS, 3)).error_code == KafkaError.none
        assert asked_once.closed_by_peer()
    assert any("idle for 1 s" in record.getMessage() for record in caplog.records)


def test_a_connection_waiting_for_its_answer_is_not_idle(idle_server):
    create_topic(idle_server, "idle-long-poll")
    with RawConnection(idle_server.extra["kafka_bootstrap"]) as connection:
        [topic] = connection.call(_long_poll("idle-long-poll")).responses
        assert topic.partitions[0].error_code == KafkaError.none
        # Answered after three idle times, and the connection still serves: the idle time counts
        # from the answer.
        assert connection.call(sample_request(api_table.API_VERSIONS, 3)).error_code == KafkaError.none
