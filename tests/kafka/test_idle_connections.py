"""kafka_connections_max_idle_ms (Kafka's connections.max.idle.ms): a connection that sends nothing
for that long while none of its requests is being answered is closed; one waiting for an answer is
not idle."""

from __future__ import annotations

import datetime
import logging
import time

import pytest
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.conftest import start_server_on_fresh_database, stop_in_process_server
from tests.kafka.clients import create_topic
from tests.kafka.raw import RawConnection, nested, request_frame, request_of
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


def test_a_connection_quiet_in_the_middle_of_a_frame_is_closed_after_the_idle_time(idle_server, caplog):
    """Regression: the idle time applied only between requests, so a client that announced a frame
    and sent part of it (or none), then nothing, held its socket and buffer for good, before
    authentication too (the frame is refused only past sasl.server.max.receive.size). Kafka's
    connections.max.idle.ms counts from a connection's last bytes: it is closed within twice the idle
    time (the frame's first read, then its parts', each waits that long)."""
    caplog.set_level(logging.INFO, logger="txbroker.kafka")
    frame = request_frame(sample_request(api_table.API_VERSIONS, 3))
    for sent in (frame[:4], frame[:10]):  # the length prefix alone, then part of the request too
        with RawConnection(idle_server.extra["kafka_bootstrap"]) as connection:
            connection.sock.settimeout(3 * IDLE_MS / 1000)
            connection.send_bytes(sent)
            started = time.monotonic()
            assert connection.closed_by_peer()
            assert time.monotonic() - started < 2.5 * IDLE_MS / 1000
    assert any("sent part of a" in record.getMessage() for record in caplog.records)


def test_a_frame_sent_in_parts_each_within_the_idle_time_is_served(idle_server):
    """A frame slower than the idle time as a whole is no idle connection while its parts keep coming."""
    frame = request_frame(sample_request(api_table.API_VERSIONS, 3))
    parts = [frame[:4], frame[4:8], frame[8:12], frame[12:]]
    with RawConnection(idle_server.extra["kafka_bootstrap"]) as connection:
        for part in parts:
            connection.send_bytes(part)
            time.sleep(0.6 * IDLE_MS / 1000)
        answer = connection.receive(api_table.API_VERSIONS, 3, correlation_id=1)
    assert answer.error_code == KafkaError.none
