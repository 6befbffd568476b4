"""ApiVersions advertises what the listener serves, and each advertised version of each API
round-trips: a request built with kio for that version gets an answer kio reads, without error.
Then what the listener must survive: versions and APIs it does not serve, a frame over
kafka_max_request_bytes, a request that does not parse."""

from __future__ import annotations

import datetime
import struct

import pytest
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from app.kafka.record_batches import KafkaRecord
from tests.kafka import raw_groups
from tests.kafka.clients import create_topic, topic_uuid
from tests.kafka.raw import RawConnection, nested, record_batch, request_frame, request_of, response_class_of
from tests.kafka.raw_transactions import RawProducer, add_partitions, init_producer

TOPIC = "versions"
MAX_BYTES = 1 << 20

GROUP = "versions-group"
# The APIs of a transactional producer: their sample requests name a transaction opened first.
TRANSACTIONAL = {
    api_table.ADD_PARTITIONS_TO_TXN,
    api_table.ADD_OFFSETS_TO_TXN,
    api_table.END_TXN,
    api_table.TXN_OFFSET_COMMIT,
}

# The errors a valid request of these APIs is answered with: ElectLeaders' for a partition whose
# one replica leads it (no election is ever needed).
ANSWERED_ERRORS = {api_table.ELECT_LEADERS: {KafkaError.election_not_needed}}

# SASL's round-trip on a server with auth required: tests/kafka/test_security.py.
SASL = {api_table.SASL_HANDSHAKE, api_table.SASL_AUTHENTICATE}
ADVERTISED = [
    (key, version) for key, versions in api_table.SUPPORTED_VERSIONS.items() if key not in SASL for version in versions
]


def sample_request(api_key: int, version: int, producer: RawProducer | None = None, topic_id=None):
    """A valid request of this API and version, about partition 0 of TOPIC (for a transactional
    API, of `producer`'s open transaction; Fetch and Produce v13+ name it by `topic_id`)."""
    if api_key == api_table.PRODUCE:
        records = record_batch([KafkaRecord(1_700_000_000_123, b"k", f"v{version}".encode(), [("h", b"x")])])
        partition = nested(api_key, version, "PartitionProduceData", index=0, records=records)
        return request_of(
            api_key,
            version,
            transactional_id=None,
            acks=-1,
            timeout=datetime.timedelta(seconds=30),
            topic_data=(
                nested(
                    api_key, version, "TopicProduceData", name=TOPIC, topic_id=topic_id, partition_data=(partition,)
                ),
            ),
        )
    if api_key == api_table.FETCH:
        partition = nested(
            api_key,
            version,
            "FetchPartition",
            partition=0,
            current_leader_epoch=-1,
            fetch_offset=0,
            last_fetched_epoch=-1,
            log_start_offset=-1,
            partition_max_bytes=MAX_BYTES,
        )
        return request_of(
            api_key,
            version,
            replica_id=-1,
            max_wait=datetime.timedelta(0),
            min_bytes=1,
            max_bytes=MAX_BYTES,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=(nested(api_key, version, "FetchTopic", topic=TOPIC, topic_id=topic_id, partitions=(partition,)),),
            forgotten_topics_data=(),
            rack_id="",
        )
    if api_key == api_table.LIST_OFFSETS:
        partition = nested(
            api_key, version, "ListOffsetsPartition", partition_index=0, current_leader_epoch=-1, timestamp=-2
        )
        return request_of(
            api_key,
            version,
            replica_id=-1,
            isolation_level=0,
            topics=(nested(api_key, version, "ListOffsetsTopic", name=TOPIC, partitions=(partition,)),),
            timeout=datetime.timedelta(seconds=30),
        )
    if api_key == api_table.METADATA:
        return request_of(
            api_key,
            version,
            topics=(nested(api_key, version, "MetadataRequestTopic", name=TOPIC, topic_id=None),),
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
    if api_key == api_table.DESCRIBE_CLUSTER:
        return request_of(
            api_key, version, include_cluster_authorized_operations=True, endpoint_type=1, include_fenced_brokers=True
        )
    if api_key == api_table.DESCRIBE_TOPIC_PARTITIONS:
        topic = nested(api_key, version, "TopicRequest", name=TOPIC)
        return request_of(api_key, version, topics=(topic,), response_partition_limit=10, cursor=None)
    if api_key == api_table.API_VERSIONS:
        return request_of(api_key, version, client_software_name="raw-test", client_software_version="1")
    if api_key == api_table.INIT_PRODUCER_ID:
        return request_of(
            api_key,
            version,
            transactional_id=None,
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=-1,
            producer_epoch=-1,
        )
    group_request = _group_sample(api_key, version)
    if group_request is not None:
        return group_request
    if api_key in TRANSACTIONAL:
        return _transactional_request(api_key, version, producer)
    raise AssertionError(f"no sample request for api key {api_key}: add one with the API")


# A group with one member, the leader, Stable in generation 1 (joined and synced by the fixture),
# for SyncGroup, Heartbeat and DescribeGroups; JoinGroup and LeaveGroup use a group per version.
GROUP = "versions-group"
MEMBER = "versions-member"
SESSION = datetime.timedelta(seconds=60)
# The member ids the server gave out, by the names the samples use: a JoinGroup naming an id the
# group never gave out is UNKNOWN_MEMBER_ID (as Kafka), so prepare_groups has them issued.
ISSUED: dict[str, str] = {}


def join_request(version: int, group: str, member: str):
    return raw_groups.join_request(group, member, SESSION, SESSION, version=version)


def _group_sample(api_key: int, version: int):
    if api_key == api_table.OFFSET_COMMIT:
        partition = nested(
            api_key,
            version,
            "OffsetCommitRequestPartition",
            partition_index=0,
            committed_offset=0,
            committed_leader_epoch=-1,
            commit_timestamp=-1,
            committed_metadata="m",
        )
        return request_of(
            api_key,
            version,
            group_id="versions-offsets",
            generation_id_or_member_epoch=-1,
            member_id="",
            group_instance_id=None,
            retention_time=datetime.timedelta(milliseconds=-1),
            topics=(nested(api_key, version, "OffsetCommitRequestTopic", name=TOPIC, partitions=(partition,)),),
        )
    if api_key == api_table.OFFSET_FETCH:
        if version >= 8:
            topic = nested(api_key, version, "OffsetFetchRequestTopics", name=TOPIC, partition_indexes=(0,))
            group = nested(
                api_key,
                version,
                "OffsetFetchRequestGroup",
                group_id="versions-offsets",
                member_id=None,
                member_epoch=-1,
                topics=(topic,),
            )
            return request_of(api_key, version, groups=(group,), require_stable=True)
        topic = nested(api_key, version, "OffsetFetchRequestTopic", name=TOPIC, partition_indexes=(0,))
        return request_of(api_key, version, group_id="versions-offsets", topics=(topic,), require_stable=True)
    if api_key == api_table.FIND_COORDINATOR:
        return request_of(api_key, version, key=GROUP, key_type=0, coordinator_keys=(GROUP, "a-transactional-id"))
    if api_key == api_table.JOIN_GROUP:
        return join_request(version, f"versions-join-v{version}", ISSUED.get(f"joiner-v{version}", ""))
    if api_key == api_table.SYNC_GROUP:
        assignment = nested(api_key, version, "SyncGroupRequestAssignment", member_id=ISSUED[MEMBER], assignment=b"")
        return request_of(
            api_key,
            version,
            group_id=GROUP,
            generation_id=1,
            member_id=ISSUED[MEMBER],
            group_instance_id=None,
            protocol_type="consumer",
            protocol_name="range",
            assignments=(assignment,),
        )
    if api_key == api_table.HEARTBEAT:
        return request_of(
            api_key, version, group_id=GROUP, generation_id=1, member_id=ISSUED[MEMBER], group_instance_id=None
        )
    if api_key == api_table.LEAVE_GROUP:
        leaver = ISSUED[f"leaver-v{version}"]
        members = (
            ()
            if version < 3
            else (nested(api_key, version, "MemberIdentity", member_id=leaver, group_instance_id=None),)
        )
        return request_of(api_key, version, group_id=f"versions-leave-v{version}", member_id=leaver, members=members)
    if api_key == api_table.LIST_GROUPS:
        return request_of(api_key, version, states_filter=(), types_filter=())
    if api_key == api_table.DESCRIBE_GROUPS:
        return request_of(api_key, version, groups=(GROUP,), include_authorized_operations=False)
    if api_key == api_table.DELETE_GROUPS:
        return request_of(api_key, version, groups_names=(deleted_group(version),))
    if api_key == api_table.CONSUMER_GROUP_DESCRIBE:
        return request_of(api_key, version, group_ids=(CONSUMER_GROUP,), include_authorized_operations=False)
    if api_key == api_table.CONSUMER_GROUP_HEARTBEAT:
        return raw_groups.consumer_heartbeat_request(
            f"versions-consumer-v{version}", f"versions-member-v{version}", 0, [TOPIC], version=version
        )
    if api_key == api_table.OFFSET_DELETE:
        partition = nested(api_key, version, "OffsetDeleteRequestPartition", partition_index=0)
        topic = nested(api_key, version, "OffsetDeleteRequestTopic", name=TOPIC, partitions=(partition,))
        return request_of(api_key, version, group_id=OFFSETS_DELETED, topics=(topic,))
    return _admin_sample(api_key, version)


# The KIP-848 consumer group ConsumerGroupDescribe describes: a member joined by prepare_groups.
CONSUMER_GROUP = "versions-consumer-described"


# The group OffsetDelete deletes an offset of: committed by prepare_samples, without members.
OFFSETS_DELETED = "versions-offsets-deleted"


def deleted_group(version: int) -> str:
    """The group each DeleteGroups version deletes: one with an offset and no members (prepare_samples)."""
    return f"versions-deleted-v{version}"


def deleted_topic(version: int) -> str:
    """The topic each DeleteTopics version deletes, made by prepare_samples: not one a CreateTopics
    sample makes, since pytest-xdist may run the two on different workers, or in either order."""
    return f"versions-deleted-topic-v{version}"


def _admin_sample(api_key: int, version: int):
    timeout = datetime.timedelta(seconds=30)
    if api_key == api_table.CREATE_TOPICS:
        config = nested(api_key, version, "CreatableTopicConfig", name="retention.ms", value="60000")
        topic = nested(
            api_key,
            version,
            "CreatableTopic",
            name=f"created-v{version}",
            num_partitions=-1,
            replication_factor=-1,
            assignments=(),
            configs=(config,),
        )
        return request_of(api_key, version, topics=(topic,), timeout=timeout, validate_only=False)
    if api_key == api_table.DELETE_TOPICS:
        name = deleted_topic(version)
        topic = nested(api_key, version, "DeleteTopicState", name=name, topic_id=None) if version >= 6 else None
        return request_of(api_key, version, topic_names=(name,), topics=(topic,), timeout=timeout)
    if api_key == api_table.DELETE_RECORDS:
        partition = nested(api_key, version, "DeleteRecordsPartition", partition_index=0, offset=0)
        topic = nested(api_key, version, "DeleteRecordsTopic", name=TOPIC, partitions=(partition,))
        return request_of(api_key, version, topics=(topic,), timeout=timeout)
    if api_key == api_table.DESCRIBE_CONFIGS:
        resource = nested(
            api_key, version, "DescribeConfigsResource", resource_type=2, resource_name=TOPIC, configuration_keys=None
        )
        return request_of(api_key, version, resources=(resource,), include_synonyms=False, include_documentation=False)
    if api_key == api_table.ALTER_CONFIGS:
        config = nested(api_key, version, "AlterableConfig", name="retention.ms", value="180000")
        resource = nested(
            api_key, version, "AlterConfigsResource", resource_type=2, resource_name=TOPIC, configs=(config,)
        )
        return request_of(api_key, version, resources=(resource,), validate_only=False)
    if api_key == api_table.CREATE_PARTITIONS:
        topic = nested(api_key, version, "CreatePartitionsTopic", name=TOPIC, count=2, assignments=None)
        return request_of(api_key, version, topics=(topic,), timeout=timeout, validate_only=True)
    if api_key == api_table.DESCRIBE_LOG_DIRS:
        topic = nested(api_key, version, "DescribableLogDirTopic", topic=TOPIC, partitions=(0,))
        return request_of(api_key, version, topics=(topic,))
    if api_key == api_table.ELECT_LEADERS:
        topic = nested(api_key, version, "TopicPartitions", topic=TOPIC, partitions=(0,))
        return request_of(api_key, version, election_type=0, topic_partitions=(topic,), timeout=timeout)
    if api_key == api_table.ALTER_REPLICA_LOG_DIRS:
        topic = nested(api_key, version, "AlterReplicaLogDirTopic", name=TOPIC, partitions=(0,))
        return request_of(
            api_key, version, dirs=(nested(api_key, version, "AlterReplicaLogDir", path="postgresql", topics=(topic,)),)
        )
    if api_key == api_table.ALTER_PARTITION_REASSIGNMENTS:
        partition = nested(api_key, version, "ReassignablePartition", partition_index=0, replicas=(0,))
        topic = nested(api_key, version, "ReassignableTopic", name=TOPIC, partitions=(partition,))
        return request_of(api_key, version, timeout=timeout, allow_replication_factor_change=True, topics=(topic,))
    if api_key == api_table.LIST_PARTITION_REASSIGNMENTS:
        return request_of(api_key, version, timeout=timeout, topics=None)
    if api_key == api_table.INCREMENTAL_ALTER_CONFIGS:
        config = nested(api_key, version, "AlterableConfig", name="retention.ms", config_operation=0, value="120000")
        resource = nested(
            api_key, version, "AlterConfigsResource", resource_type=2, resource_name=TOPIC, configs=(config,)
        )
        return request_of(api_key, version, resources=(resource,), validate_only=False)
    return _transaction_admin_sample(api_key, version)


# An id with a transaction open (the fixture opens it): described with its start time, which kio
# reads only when it is not -1 (no transaction open).
DESCRIBED = "versions-described"


def _transaction_admin_sample(api_key: int, version: int):
    if api_key == api_table.DESCRIBE_PRODUCERS:
        topic = nested(api_key, version, "TopicRequest", name=TOPIC, partition_indexes=(0,))
        return request_of(api_key, version, topics=(topic,))
    if api_key == api_table.DESCRIBE_TRANSACTIONS:
        return request_of(api_key, version, transactional_ids=(DESCRIBED,))
    if api_key == api_table.LIST_TRANSACTIONS:
        return request_of(
            api_key,
            version,
            state_filters=("Ongoing",),
            producer_id_filters=(),
            duration_filter=-1,
            transactional_id_pattern="versions-.*",
        )
    return _acl_sample(api_key, version)


def acl_principal(version: int) -> str:
    """The principal of the rule each DeleteAcls version deletes (prepare_samples adds it)."""
    return f"versions-acl-v{version}"


# Kafka's codes: resource type ANY, TOPIC; pattern type ANY, MATCH, LITERAL; operation ANY, READ;
# permission type ANY, ALLOW.
ANY, TOPIC_RESOURCE, MATCH, LITERAL, READ, ALLOW = 1, 2, 2, 3, 3, 3


def _acl_sample(api_key: int, version: int):
    if api_key == api_table.CREATE_ACLS:
        creation = nested(
            api_key,
            version,
            "AclCreation",
            resource_type=TOPIC_RESOURCE,
            resource_name=TOPIC,
            resource_pattern_type=LITERAL,
            principal=f"User:versions-created-v{version}",
            host="*",
            operation=READ,
            permission_type=ALLOW,
        )
        return request_of(api_key, version, creations=(creation,))
    acl_filter = dict(
        resource_type_filter=TOPIC_RESOURCE,
        resource_name_filter=TOPIC,
        pattern_type_filter=MATCH,
        principal_filter=None,
        host_filter=None,
        operation=ANY,
        permission_type=ANY,
    )
    if api_key == api_table.DESCRIBE_ACLS:
        return request_of(api_key, version, **acl_filter)
    if api_key == api_table.DESCRIBE_USER_SCRAM_CREDENTIALS:
        return request_of(api_key, version, users=None)  # every user with a credential: none here
    if api_key == api_table.ALTER_USER_SCRAM_CREDENTIALS:
        # Nothing to alter (SCRAM's alterations, for principals of a server with auth required: test_scram.py).
        return request_of(api_key, version, deletions=(), upsertions=())
    if api_key == api_table.DELETE_ACLS:
        deleted = {**acl_filter, "principal_filter": f"User:{acl_principal(version)}", "pattern_type_filter": ANY}
        return request_of(api_key, version, filters=(nested(api_key, version, "DeleteAclsFilter", **deleted),))
    return None


def _transactional_request(api_key: int, version: int, producer: RawProducer | None):
    # Without a producer, of one never initialized: a request that parses, answered with an error.
    producer = producer or RawProducer("versions-never-initialized", 0, 0)
    ids = dict(
        transactional_id=producer.transactional_id,
        producer_id=producer.producer_id,
        producer_epoch=producer.epoch,
    )
    if api_key == api_table.ADD_PARTITIONS_TO_TXN:
        topic = nested(api_key, version, "AddPartitionsToTxnTopic", name=TOPIC, partitions=(0,))
        return request_of(
            api_key,
            version,
            v3_and_below_transactional_id=producer.transactional_id,
            v3_and_below_producer_id=producer.producer_id,
            v3_and_below_producer_epoch=producer.epoch,
            v3_and_below_topics=(topic,),
        )
    if api_key == api_table.ADD_OFFSETS_TO_TXN:
        return request_of(api_key, version, group_id=GROUP, **ids)
    if api_key == api_table.END_TXN:
        return request_of(api_key, version, committed=True, **ids)
    partition = nested(
        api_key,
        version,
        "TxnOffsetCommitRequestPartition",
        partition_index=0,
        committed_offset=0,
        committed_leader_epoch=-1,
        committed_metadata=None,
    )
    return request_of(
        api_key,
        version,
        group_id=GROUP,
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        topics=(nested(api_key, version, "TxnOffsetCommitRequestTopic", name=TOPIC, partitions=(partition,)),),
        **ids,
    )


def errors_in(response) -> list[KafkaError]:
    """Every error code anywhere in the response."""
    found = []

    def walk(value):
        if isinstance(value, KafkaError):
            found.append(value)
        elif isinstance(value, tuple):
            for item in value:
                walk(item)
        elif hasattr(value, "__dataclass_fields__"):
            for name in value.__dataclass_fields__:
                walk(getattr(value, name))

    walk(response)
    return found


@pytest.fixture(scope="module")
def topic_id(bootstrap, module_kafka_server):
    return topic_uuid(module_kafka_server.client.get(f"/v1/topics/{TOPIC}").json()["topic_id"])


def prepare_samples(server) -> str:
    """What the sample requests name, made on `server` (its topic, groups, members and an open
    transaction); returns its Kafka bootstrap address."""
    create_topic(server, TOPIC, 1)
    for version in api_table.SUPPORTED_VERSIONS[api_table.DELETE_TOPICS]:
        create_topic(server, deleted_topic(version), 1)
    deleted_groups = [deleted_group(v) for v in api_table.SUPPORTED_VERSIONS[api_table.DELETE_GROUPS]]
    for group in [*deleted_groups, OFFSETS_DELETED]:
        offsets = [{"topic": TOPIC, "partition": 0, "offset": 0}]
        server.client.post(f"/v1/groups/{group}/offsets/commit", json={"offsets": offsets}).raise_for_status()
    for version in api_table.SUPPORTED_VERSIONS[api_table.DELETE_ACLS]:
        acl = {
            "principal": acl_principal(version),
            "resource_type": "Topic",
            "resource_name": TOPIC,
            "operation": "Read",
        }
        server.client.post("/v1/acls", json=acl).raise_for_status()
    address = server.extra["kafka_bootstrap"]
    prepare_groups(address)
    with RawConnection(address) as connection:
        described = init_producer(connection, DESCRIBED)
        assert add_partitions(connection, described, TOPIC, [0]) == [KafkaError.none]
    return address


@pytest.fixture(scope="module")
def bootstrap(module_kafka_server) -> str:
    return prepare_samples(module_kafka_server)


def prepare_groups(address: str) -> None:
    """The members the group samples name: GROUP's leader, Stable in generation 1, a member per
    LeaveGroup version to leave, and the id MEMBER_ID_REQUIRED gives each JoinGroup version from v4
    (JoinGroup v3 joins with "" at once)."""
    with RawConnection(address) as connection:
        joined = connection.call(join_request(3, GROUP, ""))
        ISSUED[MEMBER] = joined.member_id
        assert (joined.error_code, joined.generation_id, joined.leader) == (KafkaError.none, 1, joined.member_id)
        synced = connection.call(sample_request(api_table.SYNC_GROUP, 0))
        assert synced.error_code == KafkaError.none
        consumer = raw_groups.consumer_heartbeat(connection, CONSUMER_GROUP, "versions-member", 0, [TOPIC])
        assert consumer.error_code == KafkaError.none
        for version in api_table.SUPPORTED_VERSIONS[api_table.LEAVE_GROUP]:
            left = connection.call(join_request(3, f"versions-leave-v{version}", ""))
            assert left.error_code == KafkaError.none
            ISSUED[f"leaver-v{version}"] = left.member_id
        for version in api_table.SUPPORTED_VERSIONS[api_table.JOIN_GROUP]:
            if version >= 4:
                pending = connection.call(join_request(version, f"versions-join-v{version}", ""))
                assert pending.error_code == KafkaError.member_id_required
                ISSUED[f"joiner-v{version}"] = pending.member_id


def test_api_versions_advertises_the_table(bootstrap):
    with RawConnection(bootstrap) as connection:
        response = connection.call(sample_request(api_table.API_VERSIONS, 3))
    assert response.error_code == KafkaError.none
    assert {(k.api_key, k.min_version, k.max_version) for k in response.api_keys} == {
        (key, versions.start, versions.stop - 1) for key, versions in api_table.SUPPORTED_VERSIONS.items()
    }


@pytest.mark.parametrize(("api_key", "version"), ADVERTISED, ids=[f"key{k}-v{v}" for k, v in ADVERTISED])
def test_each_advertised_version_round_trips(bootstrap, topic_id, api_key, version):
    with RawConnection(bootstrap) as connection:
        producer = None
        if api_key in TRANSACTIONAL:
            producer = init_producer(connection, f"versions-{api_key}-{version}")
            assert add_partitions(connection, producer, TOPIC, [0]) == [KafkaError.none]
        response = connection.call(sample_request(api_key, version, producer, topic_id))
    assert type(response).__version__ == version
    assert set(errors_in(response)) <= {KafkaError.none, *ANSWERED_ERRORS.get(api_key, ())}, response


def test_an_unknown_api_versions_version_gets_v0_with_unsupported_version(bootstrap):
    request = sample_request(api_table.API_VERSIONS, 3)
    frame = bytearray(request_frame(request, correlation_id=7))
    struct.pack_into(">h", frame, 6, 99)  # the header's api_version, after the length and api_key
    with RawConnection(bootstrap) as connection:
        connection.send_bytes(bytes(frame))
        response = connection.receive(api_table.API_VERSIONS, 0, 7, response_class_of(api_table.API_VERSIONS, 0))
    assert response.error_code == KafkaError.unsupported_version
    assert {k.api_key for k in response.api_keys} == set(api_table.SUPPORTED_VERSIONS)


def _still_serving(bootstrap: str) -> None:
    with RawConnection(bootstrap) as connection:
        assert connection.call(sample_request(api_table.API_VERSIONS, 3)).error_code == KafkaError.none


def test_an_oversized_frame_is_refused_unread_and_the_node_keeps_serving(bootstrap, module_kafka_server):
    limit = module_kafka_server.settings.kafka_max_request_bytes
    with RawConnection(bootstrap) as connection:
        connection.send_bytes(struct.pack(">i", limit + 1) + b"\0" * 1024)  # the rest is never sent
        assert connection.closed_by_peer()
    _still_serving(bootstrap)


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">i", 3) + b"abc",  # shorter than a header
        struct.pack(">ihhi", 8, 3, 12, 1),  # Metadata v12 with its header cut short
        struct.pack(">ihhi", 8, 1000, 0, 1),  # an API key nobody serves
        struct.pack(">ihhi", 8, 1, 99, 1),  # a Fetch version not served
        struct.pack(">i", -5),  # a negative length
        # ApiVersions v3 whose body says a string of 100 bytes follows, and it does not
        struct.pack(">ihhih", 12, 18, 3, 1, -1) + b"\0" + bytes([101]),
    ],
    ids=["short", "truncated", "unknown-api", "unknown-version", "negative-length", "bad-body"],
)
def test_a_malformed_request_closes_the_connection_and_the_node_keeps_serving(bootstrap, frame):
    with RawConnection(bootstrap) as connection:
        connection.send_bytes(frame)
        assert connection.closed_by_peer()
    _still_serving(bootstrap)
