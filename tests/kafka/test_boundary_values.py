"""Requests that parse but carry extreme values get a Kafka broker's answer for them (its error
code, per entry where Kafka answers per entry), never UNKNOWN_SERVER_ERROR, a closed connection or
an error inside the node, and write nothing they refuse. The sweep at the end sends every advertised
API and version with each field at the edges of its type (tests/kafka/boundary_sweep.py)."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import uuid
from dataclasses import dataclass

import pytest
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.conftest import start_server_on_fresh_database, stop_in_process_server
from tests.kafka import boundary_sweep, http_side, raw_transactions
from tests.kafka.clients import create_topic, topic_uuid
from tests.kafka.conftest import BRIEF_SESSIONS_FROM_MS
from tests.kafka.raw import RawConnection, nested, request_of
from tests.kafka.test_api_versions import ADVERTISED, _still_serving, errors_in, prepare_samples, sample_request
from tests.kafka.test_api_versions import TOPIC as SAMPLES_TOPIC

TOPIC = "boundaries"
TIMEOUT = datetime.timedelta(seconds=30)


# The server's cap on a fetch's long poll (max_wait_ms), low so that a Fetch asking 2^31-1 ms
# (or waiting for 2^31-1 bytes) is answered within the sweep's wait.
FETCH_WAIT_CAP_MS = 300


@pytest.fixture(scope="module")
def server(postgres):
    running = start_server_on_fresh_database(
        postgres,
        "kafka_boundary_values",
        kafka_listener="127.0.0.1:0",
        max_wait_ms=FETCH_WAIT_CAP_MS,
        group_min_session_timeout_ms=BRIEF_SESSIONS_FROM_MS,
    )
    create_topic(running, TOPIC, 2)
    yield running
    stop_in_process_server(running)


@dataclass(frozen=True)
class SweepTarget:
    address: str
    topic_id: uuid.UUID


@pytest.fixture(scope="module")
def sweep_bootstrap(server) -> SweepTarget:
    """The server with what the sample requests name (test_api_versions.prepare_samples)."""
    address = prepare_samples(server)
    return SweepTarget(address, topic_uuid(server.client.get(f"/v1/topics/{SAMPLES_TOPIC}").json()["topic_id"]))


@pytest.fixture
def no_unexpected_errors(caplog):
    caplog.set_level(logging.INFO, logger="txbroker.kafka")
    yield
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def call(server, request):
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        return connection.call(request)


def topic_exists(server, name: str) -> bool:
    return server.client.get(f"/v1/topics/{name}").status_code == 200


def create_topics_request(version: int, *topics: tuple[str, int, int]):
    creatable = tuple(
        nested(
            api_table.CREATE_TOPICS,
            version,
            "CreatableTopic",
            name=name,
            num_partitions=partitions,
            replication_factor=replication_factor,
            assignments=(),
            configs=(),
        )
        for name, partitions, replication_factor in topics
    )
    return request_of(api_table.CREATE_TOPICS, version, topics=creatable, timeout=TIMEOUT, validate_only=False)


# ---- Metadata


@pytest.mark.parametrize("version", [10, 11])
def test_metadata_v10_v11_asking_by_id_is_invalid_request(server, version, no_unexpected_errors):
    """Regression: a v10/v11 topic without a name (by id) closed the connection after an error inside
    the node (its answer has no room for a nameless topic). Kafka refuses such a request whole:
    each topic INVALID_REQUEST, nothing created (KafkaApis, MetadataRequest.getErrorResponse)."""
    topic_id = uuid.uuid4()
    topics = (
        nested(api_table.METADATA, version, "MetadataRequestTopic", name=None, topic_id=topic_id),
        nested(api_table.METADATA, version, "MetadataRequestTopic", name="boundaries-not-created", topic_id=None),
    )
    response = call(
        server,
        request_of(
            api_table.METADATA,
            version,
            topics=topics,
            allow_auto_topic_creation=True,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        ),
    )
    assert [(t.name, t.error_code) for t in response.topics] == [
        ("", KafkaError.invalid_request),
        ("boundaries-not-created", KafkaError.invalid_request),
    ]
    assert not topic_exists(server, "boundaries-not-created")


# ---- CreateTopics, DeleteTopics


@pytest.mark.parametrize("replication_factor", [0, -2, -(2**15)])
def test_create_topics_refuses_a_replication_factor_neither_default_nor_positive(
    server, replication_factor, no_unexpected_errors
):
    """Regression: the replication factor was ignored, so 0 or -2 created the topic. Kafka's
    controller answers INVALID_REPLICATION_FACTOR and creates nothing."""
    name = f"boundaries-rf{replication_factor}"
    response = call(server, create_topics_request(7, (name, 1, replication_factor)))
    [result] = response.topics
    assert (result.name, result.error_code) == (name, KafkaError.invalid_replication_factor)
    assert not topic_exists(server, name)


@pytest.mark.parametrize(
    ("name", "partitions", "error"),
    [
        ("boundaries rf and name", 1, KafkaError.invalid_topic_exception),
        (TOPIC, 1, KafkaError.topic_already_exists),
        ("boundaries-rf-and-partitions", 0, KafkaError.invalid_replication_factor),
    ],
    ids=["invalid-name", "existing-topic", "invalid-partitions"],
)
def test_create_topics_checks_the_replication_factor_where_kafkas_controller_does(
    server, name, partitions, error, no_unexpected_errors
):
    """Regression: the replication factor was checked first, so a creation with an invalid name (or
    of a topic that exists) was answered INVALID_REPLICATION_FACTOR. Kafka's controller checks the
    name, then whether the topic exists (and the configs), then the replication factor, then the
    partition count (ReplicationControlManager.createTopics and createTopic)."""
    response = call(server, create_topics_request(7, (name, partitions, 0)))
    [result] = response.topics
    assert (result.name, result.error_code) == (name, error)
    assert not topic_exists(server, name) or name == TOPIC


def test_create_topics_still_ignores_a_positive_replication_factor(server, no_unexpected_errors):
    response = call(server, create_topics_request(7, ("boundaries-rf3", 1, 3), ("boundaries-rf32767", 1, 2**15 - 1)))
    assert [(t.error_code, t.replication_factor) for t in response.topics] == [(KafkaError.none, 1)] * 2


@pytest.mark.parametrize("version", [2, 7])
def test_create_topics_naming_a_topic_twice_creates_neither(server, version, no_unexpected_errors):
    """Regression: the first entry created the topic and the second got TOPIC_ALREADY_EXISTS. Kafka
    answers the name once, INVALID_REQUEST "Duplicate topic name.", and creates it not at all (the
    others of the request are created)."""
    twice, other = f"boundaries-twice-v{version}", f"boundaries-other-v{version}"
    response = call(server, create_topics_request(version, (twice, 1, -1), (other, 1, -1), (twice, 2, -1)))
    assert sorted((t.name, t.error_code) for t in response.topics) == [
        (other, KafkaError.none),
        (twice, KafkaError.invalid_request),
    ]
    assert not topic_exists(server, twice)
    assert topic_exists(server, other)


@pytest.mark.parametrize("field", ["name", "value"])
def test_create_topics_with_a_config_of_32767_bytes_is_invalid_config(server, field, no_unexpected_errors):
    """Regression: the error message quoting the config made the v2-v4 answer too long to write (the
    node closed the connection). Kafka answers INVALID_CONFIG; nothing is created."""
    config = {"name": "retention.ms", "value": "60000", field: boundary_sweep.LONGEST_STRING}
    topic = nested(
        api_table.CREATE_TOPICS,
        2,
        "CreatableTopic",
        name=f"boundaries-long-config-{field}",
        num_partitions=1,
        replication_factor=-1,
        assignments=(),
        configs=(nested(api_table.CREATE_TOPICS, 2, "CreatableTopicConfig", **config),),
    )
    response = call(
        server, request_of(api_table.CREATE_TOPICS, 2, topics=(topic,), timeout=TIMEOUT, validate_only=False)
    )
    [result] = response.topics
    assert result.error_code == KafkaError.invalid_config
    assert len(result.error_message.encode()) <= 32767
    assert not topic_exists(server, f"boundaries-long-config-{field}")


@pytest.mark.parametrize("version", [1, 6])
def test_delete_topics_naming_a_topic_twice_deletes_nothing(server, version, no_unexpected_errors):
    """Regression: the first entry deleted the topic and the second got UNKNOWN_TOPIC_OR_PARTITION.
    Kafka answers the name once, INVALID_REQUEST "Duplicate topic name.", and deletes nothing."""
    name = f"boundaries-deleted-twice-v{version}"
    create_topic(server, name)
    if version >= 6:
        state = nested(api_table.DELETE_TOPICS, version, "DeleteTopicState", name=name, topic_id=None)
        request = request_of(api_table.DELETE_TOPICS, version, topics=(state, state), timeout=TIMEOUT)
    else:
        request = request_of(api_table.DELETE_TOPICS, version, topic_names=(name, name), timeout=TIMEOUT)
    response = call(server, request)
    assert [(r.name, r.error_code) for r in response.responses] == [(name, KafkaError.invalid_request)]
    assert topic_exists(server, name)


# ---- Fetch


@pytest.mark.parametrize("max_bytes", [0, -1, -(2**31)])
def test_fetch_of_zero_or_negative_max_bytes_returns_the_first_batch(server, max_bytes, no_unexpected_errors):
    """Regression: a fetch whose max_bytes was 0 or less returned no batch at all, so a client asking
    so never made progress. As KIP-74's rule (the first batch of the first partition with any is
    returned whatever the limits), it gets the first batch. (A Kafka broker fails a negative limit
    with UNKNOWN_SERVER_ERROR, which txbroker never answers.)"""
    http_side.produce(server, TOPIC, 1, [{"value": "first"}])
    request = sample_request(api_table.FETCH, 12)  # of the samples' topic: made to ask this one
    [topic] = request.topics
    [partition] = topic.partitions
    asked = dataclasses.replace(topic, topic=TOPIC, partitions=(dataclasses.replace(partition, partition=1),))
    request = dataclasses.replace(request, topics=(asked,), max_bytes=max_bytes)
    [topic] = call(server, request).responses
    [answered] = topic.partitions
    assert answered.error_code == KafkaError.none
    assert answered.records


# ---- DescribeConfigs


def describe_configs_request(*resources: tuple[int, str]):
    asked = tuple(
        nested(
            api_table.DESCRIBE_CONFIGS,
            4,
            "DescribeConfigsResource",
            resource_type=resource_type,
            resource_name=name,
            configuration_keys=None,
        )
        for resource_type, name in resources
    )
    return request_of(
        api_table.DESCRIBE_CONFIGS, 4, resources=asked, include_synonyms=False, include_documentation=False
    )


@pytest.mark.parametrize("resource_type", [0, 1, 3, 99, -1])
def test_describe_configs_of_an_unknown_resource_type_is_invalid_request(server, resource_type, no_unexpected_errors):
    """Regression: an unknown resource type was answered with no configs and no error. A Kafka broker
    fails the whole request: every resource INVALID_REQUEST, the topic's too."""
    response = call(server, describe_configs_request((2, TOPIC), (resource_type, "x")))
    assert [(r.error_code, r.configs) for r in response.results] == [(KafkaError.invalid_request, ())] * 2


def test_describe_configs_of_another_broker_id_is_invalid_request(server, no_unexpected_errors):
    """Regression: any broker name was answered with no configs. A Kafka broker describes only its
    own id (or "", the default), else INVALID_REQUEST for that resource."""
    response = call(server, describe_configs_request((4, "x"), (4, "7"), (4, "0"), (4, "")))
    assert [r.error_code for r in response.results] == [KafkaError.invalid_request] * 2 + [KafkaError.none] * 2


# ---- ListOffsets


def list_offsets_request(version: int, *partitions: tuple[int, int]):
    asked = tuple(
        nested(
            api_table.LIST_OFFSETS,
            version,
            "ListOffsetsPartition",
            partition_index=index,
            current_leader_epoch=-1,
            timestamp=timestamp,
        )
        for index, timestamp in partitions
    )
    topic = nested(api_table.LIST_OFFSETS, version, "ListOffsetsTopic", name=TOPIC, partitions=asked)
    return request_of(api_table.LIST_OFFSETS, version, replica_id=-1, isolation_level=0, topics=(topic,))


@pytest.mark.parametrize(
    ("version", "timestamp"), [(1, -3), (1, -4), (7, -4), (1, -5), (7, -5), (1, -(2**63)), (7, -(2**63))]
)
def test_list_offsets_of_an_unserved_negative_timestamp_is_unsupported_version(
    server, version, timestamp, no_unexpected_errors
):
    """Regression: a negative timestamp other than -1/-2 was read as a time, so any record matched
    it (Kafka's max timestamp, -3, answered with the first record). A Kafka broker answers
    UNSUPPORTED_VERSION for a negative timestamp its version does not define (ReplicaManager): -3
    (the record of the greatest timestamp) is served from v7 only (test_clients.py)."""
    http_side.produce(server, TOPIC, 0, [{"value": "v"}])  # a record of any time: none must match
    response = call(server, list_offsets_request(version, (0, timestamp), (1, -1)))
    [topic] = response.topics
    assert [(p.partition_index, p.error_code) for p in topic.partitions] == [
        (0, KafkaError.unsupported_version),
        (1, KafkaError.none),
    ]


def test_list_offsets_naming_a_partition_twice_is_invalid_request(server, no_unexpected_errors):
    """Regression: each mention was answered. Kafka answers a duplicated partition INVALID_REQUEST."""
    response = call(server, list_offsets_request(7, (0, -1), (1, -2), (0, -2)))
    [topic] = response.topics
    assert [(p.partition_index, p.error_code) for p in topic.partitions] == [
        (0, KafkaError.invalid_request),
        (1, KafkaError.none),
        (0, KafkaError.invalid_request),
    ]


# ---- Produce


@pytest.mark.parametrize("version", [8, 12])
def test_produce_to_a_topic_named_by_32767_bytes_is_unknown_topic(server, version, no_unexpected_errors):
    """Regression: the error message quoting the name made the answer longer than a string may be
    (32767 bytes): its writing failed inside the node, which closed the connection. Kafka answers
    UNKNOWN_TOPIC_OR_PARTITION for a topic it does not have; the message is cut to fit."""
    request = sample_request(api_table.PRODUCE, version)
    [topic] = request.topic_data
    request = dataclasses.replace(request, topic_data=(dataclasses.replace(topic, name=boundary_sweep.LONGEST_STRING),))
    response = call(server, request)
    [answered] = response.responses
    assert [p.error_code for p in answered.partition_responses] == [KafkaError.unknown_topic_or_partition]


# ---- OffsetCommit, TxnOffsetCommit

METADATA_LIMIT = 4096  # Kafka's offset.metadata.max.bytes, in characters


def committed(server, group: str) -> list[tuple[int, int, str | None]]:
    response = server.client.post(f"/v1/groups/{group}/offsets/fetch", json={})
    assert response.status_code == 200, response.text
    return sorted((o["partition"], o["offset"], o["metadata"]) for o in response.json()["offsets"])


def offset_commit_request(version: int, group: str, *partitions: tuple[int, int, str | None]):
    key = api_table.OFFSET_COMMIT
    asked = tuple(
        nested(
            key,
            version,
            "OffsetCommitRequestPartition",
            partition_index=index,
            committed_offset=offset,
            committed_leader_epoch=-1,
            commit_timestamp=-1,
            committed_metadata=metadata,
        )
        for index, offset, metadata in partitions
    )
    return request_of(
        key,
        version,
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        retention_time=datetime.timedelta(milliseconds=-1),
        topics=(nested(key, version, "OffsetCommitRequestTopic", name=TOPIC, partitions=asked),),
    )


@pytest.mark.parametrize("version", [2, 8])
def test_offset_commit_metadata_over_kafkas_limit_is_offset_metadata_too_large(server, version, no_unexpected_errors):
    """Regression: metadata of any length up to 32767 was stored. Kafka's group coordinator answers
    OFFSET_METADATA_TOO_LARGE for metadata over offset.metadata.max.bytes (4096 characters) and
    commits that partition's offset not at all; the others of the request are committed."""
    group = f"boundaries-metadata-v{version}"
    response = call(
        server, offset_commit_request(version, group, (0, 5, "x" * (METADATA_LIMIT + 1)), (1, 7, "é" * METADATA_LIMIT))
    )
    [topic] = response.topics
    assert [(p.partition_index, p.error_code) for p in topic.partitions] == [
        (0, KafkaError.offset_metadata_too_large),
        (1, KafkaError.none),
    ]
    assert committed(server, group) == [(1, 7, "é" * METADATA_LIMIT)]


@pytest.mark.parametrize(
    ("last", "answers", "stored"),
    [
        ((0, 7, "last"), [KafkaError.none] * 3, (0, 7, "last")),
        (
            (0, 7, "x" * (METADATA_LIMIT + 1)),
            [KafkaError.none] * 2 + [KafkaError.offset_metadata_too_large],
            (0, 5, "first"),
        ),
    ],
    ids=["both-stored", "last-refused"],
)
def test_offset_commit_answers_each_mention_of_a_partition_and_keeps_the_last_stored(
    server, last, answers, stored, no_unexpected_errors
):
    """Regression: every mention of a partition named twice was answered with the last mention's
    error, so a first offset that was stored could be answered OFFSET_METADATA_TOO_LARGE. Kafka's
    group coordinator answers each mention with its own error and stores each accepted one in turn,
    so the last stays (OffsetMetadataManager.commitOffset)."""
    group = f"boundaries-commit-twice-{last[2][:4]}"
    response = call(server, offset_commit_request(8, group, (0, 5, "first"), (1, 3, None), last))
    [topic] = response.topics
    assert [(p.partition_index, p.error_code) for p in topic.partitions] == list(zip([0, 1, 0], answers))
    assert committed(server, group) == sorted([stored, (1, 3, None)])


def test_offset_commit_stores_a_negative_offset_as_kafka_does(server, no_unexpected_errors):
    """Kafka's group coordinator stores whatever offset a commit gives, a negative one too (no check
    in OffsetMetadataManager.commitOffset or OffsetAndMetadata.fromRequest), and answers NONE; the
    HTTP door (its Offset type, 0 and up) refuses one, but reads back what the Kafka door stored."""
    group = "boundaries-negative-offset"
    response = call(server, offset_commit_request(8, group, (0, -5, None), (1, -1, None)))
    [topic] = response.topics
    assert [(p.partition_index, p.error_code) for p in topic.partitions] == [(0, KafkaError.none), (1, KafkaError.none)]
    assert committed(server, group) == [(0, -5, None), (1, -1, None)]


def test_txn_offset_commit_refuses_metadata_over_the_limit_per_partition(server, no_unexpected_errors):
    """Regression: TxnOffsetCommit stored metadata of any length (Kafka: OFFSET_METADATA_TOO_LARGE
    over 4096 characters). Nothing is committed for it."""
    group = "boundaries-txn-metadata-too-large"
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        producer = raw_transactions.init_producer(connection, group)
        assert raw_transactions.add_offsets(connection, producer, group) == KafkaError.none
        errors = raw_transactions.txn_offset_commit(
            connection, producer, group, TOPIC, 3, metadata="x" * (METADATA_LIMIT + 1)
        )
        assert errors == [KafkaError.offset_metadata_too_large]
        assert raw_transactions.end_txn(connection, producer, True, 4).error_code == KafkaError.none
    assert committed(server, group) == []


def test_txn_offset_commit_keeps_nul_characters_in_metadata(server, no_unexpected_errors):
    """Regression: TxnOffsetCommit refused metadata with a NUL (INVALID_REQUEST), where Kafka keeps
    it as sent, as confluent-kafka's Python binding sends it (with its C terminator)."""
    group = "boundaries-txn-metadata-nul"
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        producer = raw_transactions.init_producer(connection, group)
        assert raw_transactions.add_offsets(connection, producer, group) == KafkaError.none
        errors = raw_transactions.txn_offset_commit(connection, producer, group, TOPIC, 3, metadata="nul\0inside\0")
        assert errors == [KafkaError.none]
        assert raw_transactions.end_txn(connection, producer, True, 4).error_code == KafkaError.none
    assert committed(server, group) == [(0, 3, "nul\0inside\0")]


# ---- the sweep: every advertised API, each field at the edges of its type


def _sweep_versions() -> list[tuple[int, int]]:
    """Each advertised API's lowest and highest version (their fields span the versions between)."""
    chosen = []
    for api_key, version in ADVERTISED:
        versions = api_table.SUPPORTED_VERSIONS[api_key]
        if version in (versions.start, versions.stop - 1):
            chosen.append((api_key, version))
    return chosen


# A Produce with acks=0 is never answered, as Kafka.
UNANSWERED = {(api_table.PRODUCE, "acks", "0")}
# APIs whose every entry is a PostgreSQL transaction of its own: thousands of entries are not cheap
# (each is still tried empty and twice).
COSTLY_ENTRIES = {api_table.DELETE_RECORDS, api_table.DESCRIBE_GROUPS}
ANSWER_WAIT_S = 10


# A JoinGroup waits for the group's other members: each of the sweep's joins names a group of its own
# (but those that change the group id), with timeouts short enough for a rebalance within the wait.
SHORT_GROUP_TIMEOUT = datetime.timedelta(milliseconds=250)


def _swept_sample(api_key: int, version: int, topic_id: uuid.UUID):
    sample = sample_request(api_key, version, None, topic_id)
    if api_key == api_table.JOIN_GROUP:
        timeouts = {"session_timeout": SHORT_GROUP_TIMEOUT, "rebalance_timeout": SHORT_GROUP_TIMEOUT}
        sample = dataclasses.replace(sample, **{k: v for k, v in timeouts.items() if hasattr(sample, k)})
    return sample


def _own_group(api_key: int, mutation: boundary_sweep.Mutation, request, number: int):
    if api_key != api_table.JOIN_GROUP or mutation.path == "group_id":
        return request
    return dataclasses.replace(request, group_id=f"boundaries-join-{request.__version__}-{number}")


@pytest.mark.parametrize(("api_key", "version"), _sweep_versions(), ids=lambda value: str(value))
def test_edge_values_are_answered_without_harm(sweep_bootstrap, api_key, version, caplog):
    caplog.set_level(logging.INFO, logger="txbroker.kafka")
    harmed = []
    sample = _swept_sample(api_key, version, sweep_bootstrap.topic_id)
    for number, (mutation, request) in enumerate(boundary_sweep.mutations(sample)):
        if (api_key, mutation.path, mutation.value) in UNANSWERED:
            continue
        if api_key in COSTLY_ENTRIES and mutation.value == boundary_sweep.MANY_ENTRIES_LABEL:
            continue
        request = _own_group(api_key, mutation, request, number)
        outcome = boundary_sweep.send(sweep_bootstrap.address, request, ANSWER_WAIT_S, errors_in)
        if not outcome.answered or KafkaError.unknown_server_error in outcome.errors:
            harmed.append((mutation, outcome))
    _still_serving(sweep_bootstrap.address)
    assert harmed == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
