"""Requests with random bytes changed (seeded, so every run sends the same ones), of every
advertised API and version: each is answered or its connection closed, the node keeps serving, and
nothing is an unexpected error (a handler's exception would be logged as one)."""

from __future__ import annotations

import datetime
import logging
import random
import socket

from app.kafka import api_table
from app.kafka.frames import FRAME_LENGTH
from tests.kafka.raw import RawConnection, nested, request_frame, request_of
from tests.kafka.test_api_versions import ADVERTISED, _still_serving, prepare_samples, sample_request

MUTATIONS_PER_VERSION = 12
# The length prefix and the header's api key and version are left alone: the tests of
# test_api_versions.py send wrong ones on purpose.
FIRST_MUTABLE_BYTE = FRAME_LENGTH.size + 4
# A mutated Fetch may long-poll: its answer is not waited for beyond this.
ANSWER_WAIT_S = 5


def test_mutated_requests_never_harm_the_node(module_kafka_server, caplog):
    caplog.set_level(logging.INFO, logger="txbroker.kafka")
    # The samples name members and a transaction of their own server: made here, so that this test
    # does not depend on test_api_versions.py having run first against the same server.
    bootstrap = prepare_samples(module_kafka_server)
    rng = random.Random(23)
    for api_key, version in ADVERTISED:
        frame = request_frame(sample_request(api_key, version))
        for _ in range(MUTATIONS_PER_VERSION):
            mutated = bytearray(frame)
            for _ in range(rng.randint(1, 4)):
                mutated[rng.randrange(FIRST_MUTABLE_BYTE, len(mutated))] = rng.randrange(256)
            with RawConnection(bootstrap) as connection:
                connection.sock.settimeout(ANSWER_WAIT_S)
                connection.send_bytes(bytes(mutated))
                try:
                    connection.sock.recv(1 << 20)  # an answer, or the end of the stream
                except (TimeoutError, socket.timeout, ConnectionError):
                    pass
        _still_serving(bootstrap)
    unexpected = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert unexpected == []


def test_a_nul_in_a_group_id_closes_the_connection_and_nothing_fails(module_kafka_server, caplog):
    """Regression: PostgreSQL's text cannot hold NUL, and LeaveGroup and DescribeGroups naming a group
    with one failed inside the node (an unexpected error logged) instead of closing the connection."""
    caplog.set_level(logging.INFO, logger="txbroker.kafka")
    bootstrap = module_kafka_server.extra["kafka_bootstrap"]
    requests = [
        request_of(api_table.DESCRIBE_GROUPS, 5, groups=("nul\0group",), include_authorized_operations=False),
        request_of(api_table.LEAVE_GROUP, 0, group_id="nul\0group", member_id="m"),
    ]
    for request in requests:
        with RawConnection(bootstrap) as connection:
            connection.send(request)
            assert connection.closed_by_peer()
    _still_serving(bootstrap)
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []


def test_a_null_where_the_schema_allows_none_closes_the_connection_and_nothing_fails(module_kafka_server, caplog):
    """Regression: kio reads a null array whatever its schema says, and AlterPartitionReassignments
    with a topic's partitions null failed inside the node (an unexpected error logged); Kafka's
    readers refuse such a request, so the connection is closed."""
    caplog.set_level(logging.INFO, logger="txbroker.kafka")
    bootstrap = module_kafka_server.extra["kafka_bootstrap"]
    key = api_table.ALTER_PARTITION_REASSIGNMENTS
    topic = nested(key, 0, "ReassignableTopic", name="null-partitions", partitions=None)
    with RawConnection(bootstrap) as connection:
        connection.send(request_of(key, 0, timeout=datetime.timedelta(seconds=1), topics=(topic,)))
        assert connection.closed_by_peer()
    _still_serving(bootstrap)
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []
