"""The versions Apache Kafka 4.0 serves that txbroker serves too, each new version's behaviour with raw
requests (ListOffsets v8-v10, FindCoordinator v6, DescribeGroups v6, ListGroups v5, ApiVersions v4,
OffsetFetch v9, TxnOffsetCommit v5), then kafka-python pinned to `api_version=(4, 0)`, which sends
Kafka 4.0's versions without asking: produce, a group's consumer committing and reading back its
offsets, ListOffsets, and a transaction with send_offsets_to_transaction."""

from __future__ import annotations

import datetime
import time

import pytest
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.kafka import http_side
from tests.kafka.clients import bootstrap, create_topic
from tests.kafka.raw import RawConnection, nested, request_of
from tests.kafka.raw_groups import commit, describe, join, sync
from tests.kafka.raw_transactions import end_txn, init_producer, txn_offset_commit

WAIT_S = 30
EARLIEST, EARLIEST_LOCAL, LATEST_TIERED, LATEST = -2, -4, -5, -1


def _list_offset(connection, version: int, topic: str, timestamp: int, partition: int = 0):
    key = api_table.LIST_OFFSETS
    asked = nested(
        key, version, "ListOffsetsPartition", partition_index=partition, current_leader_epoch=-1, timestamp=timestamp
    )
    response = connection.call(
        request_of(
            key,
            version,
            replica_id=-1,
            isolation_level=0,
            topics=(nested(key, version, "ListOffsetsTopic", name=topic, partitions=(asked,)),),
            timeout=datetime.timedelta(seconds=5),
        )
    )
    [answered] = response.topics[0].partitions
    return answered.error_code, answered.offset, answered.timestamp


def test_list_offsets_earliest_local_and_latest_tiered_as_a_broker_without_tiered_storage(module_kafka_server):
    topic = "v4-list-offsets"
    create_topic(module_kafka_server, topic)
    http_side.produce(module_kafka_server, topic, 0, [{"value": f"v{i}"} for i in range(3)])
    deleted = module_kafka_server.client.post(
        f"/v1/topics/{topic}/delete-records", json={"partitions": [{"partition": 0, "offset": 1}]}
    )
    assert deleted.status_code == 200, deleted.text
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        earliest = _list_offset(connection, 10, topic, EARLIEST)
        assert earliest == (KafkaError.none, 1, -1)  # the log start, moved up by DeleteRecords
        # -4 (v8+): every record is local, so the earliest local offset is the earliest offset.
        assert _list_offset(connection, 8, topic, EARLIEST_LOCAL) == earliest
        assert _list_offset(connection, 10, topic, EARLIEST_LOCAL) == earliest
        # -5 (v9+): nothing is tiered: offset -1, timestamp -1, no error.
        assert _list_offset(connection, 9, topic, LATEST_TIERED) == (KafkaError.none, -1, -1)
        assert _list_offset(connection, 10, topic, LATEST_TIERED) == (KafkaError.none, -1, -1)
        assert _list_offset(connection, 10, topic, LATEST) == (KafkaError.none, 3, -1)
        # Below the version that defines it, a sentinel is UNSUPPORTED_VERSION, as a Kafka broker answers.
        assert _list_offset(connection, 7, topic, EARLIEST_LOCAL)[0] == KafkaError.unsupported_version
        assert _list_offset(connection, 8, topic, LATEST_TIERED)[0] == KafkaError.unsupported_version
        # A partition that does not exist is answered as such, whatever the sentinel.
        assert (
            _list_offset(connection, 10, topic, LATEST_TIERED, partition=7)[0] == KafkaError.unknown_topic_or_partition
        )


def _find_coordinator(connection, version: int, key_type: int):
    return connection.call(
        request_of(api_table.FIND_COORDINATOR, version, key="some-key", key_type=key_type, coordinator_keys=("a", "b"))
    )


@pytest.mark.parametrize("version", [3, 4, 6])
def test_find_coordinator_refuses_share_group_keys(module_kafka_server, version):
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        share = _find_coordinator(connection, version, key_type=2)
        served = _find_coordinator(connection, version, key_type=1)
    answers = share.coordinators if version >= 4 else (share,)
    for answer in answers:
        assert (answer.error_code, answer.node_id) == (KafkaError.invalid_request, -1)
        assert "share groups" in answer.error_message
    for answer in served.coordinators if version >= 4 else (served,):
        assert (answer.error_code, answer.node_id) == (KafkaError.none, module_kafka_server.settings.node_id)


def _describe(connection, version: int, group: str):
    response = connection.call(
        request_of(api_table.DESCRIBE_GROUPS, version, groups=(group,), include_authorized_operations=False)
    )
    [described] = response.groups
    return described


def test_describe_groups_v6_answers_group_id_not_found_for_a_group_that_does_not_exist(module_kafka_server):
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        missing_v6 = _describe(connection, 6, "v4-no-such-group")
        missing_v5 = _describe(connection, 5, "v4-no-such-group")
        joined = join(connection, "v4-described", member="")
        joined = join(connection, "v4-described", member=joined.member_id)
        assert sync(connection, "v4-described", joined.member_id, joined.generation_id, {}).error_code == 0
        existing = _describe(connection, 6, "v4-described")
    assert (missing_v6.error_code, missing_v6.group_state) == (KafkaError.group_id_not_found, "Dead")
    assert missing_v6.error_message == "Group v4-no-such-group not found."
    assert (missing_v5.error_code, missing_v5.group_state) == (KafkaError.none, "Dead")
    assert (existing.error_code, existing.error_message, existing.group_state) == (KafkaError.none, None, "Stable")


@pytest.mark.parametrize(
    ("types_filter", "listed"),
    [((), True), (("classic",), True), (("CLASSIC",), True), (("consumer",), False), (("share", "nonsense"), False)],
)
def test_list_groups_v5_filters_by_type_and_every_group_is_classic(module_kafka_server, types_filter, listed):
    group = "v4-listed"
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        joined = join(connection, group, member="")
        join(connection, group, member=joined.member_id)
        response = connection.call(request_of(api_table.LIST_GROUPS, 5, states_filter=(), types_filter=types_filter))
    found = {g.group_id: g.group_type for g in response.groups}
    assert response.error_code == KafkaError.none
    assert (group in found) == listed
    assert set(found.values()) <= {"classic"}


@pytest.mark.parametrize(
    ("states_filter", "listed"),
    [
        (("Stable",), True),
        (("stable",), True),
        ((" STABLE ",), True),
        (("Empty", "stable"), True),
        (("Empty",), False),
        (("bogus",), False),
    ],
)
def test_list_groups_filters_by_state_in_any_case(module_kafka_server, states_filter, listed):
    """Regression: ListGroups v4+'s state filter matched the state's name exactly; Kafka's group
    coordinator compares it in any case, trimmed (GroupMetadataManager.listGroups), so a filter
    "stable" listed no Stable group."""
    group = "v4-listed-by-state"
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        if describe(connection, group).group_state != "Stable":
            joined = join(connection, group, member="")
            joined = join(connection, group, member=joined.member_id)
            assert sync(connection, group, joined.member_id, joined.generation_id, {}).error_code == 0
        response = connection.call(request_of(api_table.LIST_GROUPS, 4, states_filter=states_filter))
    found = {g.group_id: g.group_state for g in response.groups}
    assert response.error_code == KafkaError.none
    assert (group in found) == listed
    assert {state.lower() for state in found.values()} <= {state.strip().lower() for state in states_filter}


def _api_versions(connection, version: int):
    return connection.call(
        request_of(api_table.API_VERSIONS, version, client_software_name="raw-test", client_software_version="1")
    )


def test_api_versions_v4_lists_a_feature_whose_minimum_is_0_and_v3_leaves_it_out(module_kafka_server):
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        v4 = _api_versions(connection, 4)
        v3 = _api_versions(connection, 3)
    assert [(f.name, f.min_version, f.max_version) for f in v4.supported_features] == [("transaction.version", 0, 2)]
    assert list(v3.supported_features) == []
    for response in (v3, v4):  # the finalized level is 2 either way
        assert [(f.name, f.min_version_level, f.max_version_level) for f in response.finalized_features] == [
            ("transaction.version", 2, 2)
        ]


def test_offset_commit_v9_answers_group_id_not_found_for_a_generation_of_a_group_that_does_not_exist(
    module_kafka_server,
):
    topic = "v4-offset-commit"
    create_topic(module_kafka_server, topic)
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        refused = commit(connection, "v4-never-made", "ghost", 1, None, topic, 5, version=9)
        still_missing = _describe(connection, 6, "v4-never-made")
        simple = commit(connection, "v4-simple", "", -1, None, topic, 5, version=9)
        joined = join(connection, "v4-committing", member="")
        joined = join(connection, "v4-committing", member=joined.member_id)
        assert sync(connection, "v4-committing", joined.member_id, joined.generation_id, {}).error_code == 0
        member = commit(connection, "v4-committing", joined.member_id, joined.generation_id, None, topic, 6, version=9)
        zombie = commit(connection, "v4-committing", joined.member_id, joined.generation_id - 1, None, topic, 7, 9)
    assert refused == KafkaError.group_id_not_found
    assert still_missing.error_code == KafkaError.group_id_not_found  # the refused commit made no group
    assert (simple, member, zombie) == (KafkaError.none, KafkaError.none, KafkaError.illegal_generation)
    assert _committed(module_kafka_server, "v4-committing") == [(topic, 6)]


@pytest.mark.parametrize("version", [2, 8])
def test_offset_commit_below_v9_answers_illegal_generation_for_a_group_that_does_not_exist(
    module_kafka_server, version
):
    """Regression: below v9 such a commit was UNKNOWN_MEMBER_ID. Kafka 4.0's group coordinator
    answers ILLEGAL_GENERATION there, kept for older clients, and makes no group
    (OffsetMetadataManager.validateOffsetCommit); a group that exists without the member is still
    UNKNOWN_MEMBER_ID."""
    topic, missing, simple = (f"v4-{name}-v{version}" for name in ("offset-commit", "never-made", "simple"))
    create_topic(module_kafka_server, topic)
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        refused = commit(connection, missing, "ghost", 0, None, topic, 5, version=version)
        still_missing = _describe(connection, 6, missing)
        assert commit(connection, simple, "", -1, None, topic, 5, version=version) == KafkaError.none
        not_a_member = commit(connection, simple, "ghost", 0, None, topic, 6, version=version)
    assert refused == KafkaError.illegal_generation
    assert still_missing.error_code == KafkaError.group_id_not_found  # the refused commit made no group
    assert not_a_member == KafkaError.unknown_member_id
    assert _committed(module_kafka_server, simple) == [(topic, 5)]


def test_offset_fetch_v9_of_a_classic_group_ignores_the_member_epoch(module_kafka_server):
    topic, group = "v4-offset-fetch", "v4-offset-fetch-group"
    create_topic(module_kafka_server, topic)
    offsets = [{"topic": topic, "partition": 0, "offset": 5}]
    committed = module_kafka_server.client.post(f"/v1/groups/{group}/offsets/commit", json={"offsets": offsets})
    assert committed.status_code < 300, committed.text
    key = api_table.OFFSET_FETCH
    asked = nested(key, 9, "OffsetFetchRequestTopics", name=topic, partition_indexes=(0,))
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        response = connection.call(
            request_of(
                key,
                9,
                groups=(
                    nested(
                        key,
                        9,
                        "OffsetFetchRequestGroup",
                        group_id=group,
                        member_id="m",
                        member_epoch=7,
                        topics=(asked,),
                    ),
                ),
                require_stable=True,
            )
        )
    [answered] = response.groups
    [partition] = answered.topics[0].partitions
    assert (answered.error_code, partition.error_code, partition.committed_offset) == (KafkaError.none, 0, 5)


def test_txn_offset_commit_v5_adds_the_offsets_to_the_transaction_itself(module_kafka_server):
    """Transaction version 2 (KIP-890 part 2): no AddOffsetsToTxn; the offsets commit with the transaction."""
    topic, group = "v4-txn-offsets", "v4-txn-offsets-group"
    create_topic(module_kafka_server, topic)
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        producer = init_producer(connection, "v4-txn-offsets", version=5)
        assert txn_offset_commit(connection, producer, group, topic, 9, version=5) == [KafkaError.none]
        assert end_txn(connection, producer, committed=True, version=5).error_code == KafkaError.none
    assert _committed(module_kafka_server, group) == [(topic, 9)]


def test_kafka_python_pinned_to_kafka_4_0(module_kafka_server):
    """kafka-python with api_version=(4, 0) uses Kafka 4.0's versions without ApiVersions: each of its
    requests must be one txbroker serves, or its connection closes."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    source, sink, group = "v4-kp-source", "v4-kp-sink", "v4-kp-group"
    create_topic(module_kafka_server, source)
    create_topic(module_kafka_server, sink)
    address = bootstrap(module_kafka_server)
    pinned = {"bootstrap_servers": address, "api_version": (4, 0)}
    producer = KafkaProducer(**pinned)
    try:
        for i in range(3):
            producer.send(source, key=b"k", value=f"m{i}".encode(), partition=0).get(WAIT_S)
    finally:
        producer.close(WAIT_S)

    partition = TopicPartition(source, 0)
    consumer = KafkaConsumer(source, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False, **pinned)
    try:
        received = []
        deadline = time.monotonic() + WAIT_S
        while len(received) < 3 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                received.extend(r.value for r in records)
        assert received == [b"m0", b"m1", b"m2"]
        consumer.commit()
        assert consumer.committed(partition) == 3
        assert consumer.beginning_offsets([partition]) == {partition: 0}
        assert consumer.end_offsets([partition]) == {partition: 3}
        assert consumer.offsets_for_times({partition: 0})[partition].offset == 0
        # The consumer's position, committed with a transaction while it is still the group's member
        # (KIP-447: TxnOffsetCommit names its generation and member id).
        transactional = KafkaProducer(transactional_id="v4-kp-txn", **pinned)
        try:
            transactional.init_transactions()
            transactional.begin_transaction()
            transactional.send(sink, value=b"out", partition=0).get(WAIT_S)
            transactional.send_offsets_to_transaction({partition: _offset_and_metadata(4)}, consumer.group_metadata())
            transactional.commit_transaction()
        finally:
            transactional.close(WAIT_S)
    finally:
        consumer.close()
    values = [http_side.unb64(r["value"]) for r in http_side.fetch(module_kafka_server, sink, 0, "read_committed")]
    assert values == [b"out"]
    assert _committed(module_kafka_server, group) == [(source, 4)]


def _committed(server, group: str) -> list[tuple[str, int]]:
    response = server.client.post(f"/v1/groups/{group}/offsets/fetch", json={"partitions": None})
    assert response.status_code == 200, response.text
    return [(o["topic"], o["offset"]) for o in response.json()["offsets"]]


def _offset_and_metadata(offset: int):
    from kafka.structs import OffsetAndMetadata

    return OffsetAndMetadata(offset, "", -1)
