"""With `--auth required` the Kafka listener is a SASL listener (app/kafka/sasl.py): SASL/PLAIN with a
principal's name and one of its API keys, then the same ACLs as over HTTP. Raw requests for
Kafka's rules (what is served before authentication, wrong credentials, mechanisms), then the real
clients over SASL_PLAINTEXT; TLS is test_security_tls.py's."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import re
import shutil
import subprocess
import time

import httpx
import pytest
from confluent_kafka import KafkaError as ConfluentError
from confluent_kafka import KafkaException, Producer
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from app.kafka.record_batches import KafkaRecord
from app.kafka.sasl import INVALID_CREDENTIALS, UNAUTHENTICATED_MAX_REQUEST_BYTES
from tests.conftest import start_server_on_fresh_database, stop_in_process_server
from tests.kafka import raw_groups, raw_transactions
from tests.kafka import test_fetch_read_ahead as read_ahead
from tests.kafka import test_produce_raw as raw_produce
from tests.kafka.clients import WAIT_S, ConfluentKafka, topic_uuid
from tests.kafka.raw import RawConnection, nested, record_batch, request_of
from tests.kafka.test_alter_configs import alter_configs

ADMIN_TOKEN = "admin-secret"
TOPIC = "guarded"
OTHER_TOPIC = "unreadable"
GROUP_PREFIX = "sasl-"


@contextlib.contextmanager
def secured_on_a_database_of_its_own(postgres, name: str):
    """A server with auth required, a SASL Kafka listener and the admin's token, on database `name`."""
    server = start_server_on_fresh_database(
        postgres, name, kafka_listener="127.0.0.1:0", auth="required", admin_token=ADMIN_TOKEN
    )
    try:
        yield server
    finally:
        stop_in_process_server(server)


@pytest.fixture(scope="module")
def secured(postgres):
    with secured_on_a_database_of_its_own(postgres, "kafka_security") as server:
        with admin_client(server) as admin:
            for topic in (TOPIC, OTHER_TOPIC):
                admin.post("/v1/topics", json={"name": topic, "partitions": 1, "config": {}}).raise_for_status()
        yield server


def admin_client(server) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)


def rule(resource_type: str, name: str, operation: str, pattern_type: str = "literal") -> dict:
    return {"resource_type": resource_type, "resource_name": name, "operation": operation, "pattern_type": pattern_type}


def new_principal(server, name: str, *rules: dict) -> tuple[str, str]:
    """(key id, API key) of a new principal with these ACL rules."""
    with admin_client(server) as admin:
        admin.post("/v1/principals", json={"name": name}).raise_for_status()
        key = admin.post(f"/v1/principals/{name}/keys").json()
        for acl in rules:
            admin.post("/v1/acls", json={"principal": name, **acl}).raise_for_status()
    return key["key_id"], key["token"]


def reader_and_writer(topic: str) -> list[dict]:
    """What a producer and an assign-and-seek consumer of `topic` need."""
    return [
        rule("Topic", topic, "Write"),
        rule("Topic", topic, "Read"),
        rule("Group", GROUP_PREFIX, "Read", "prefixed"),
    ]


# ---- raw: Kafka's rules of a SASL listener


def plain(username: str, password: str, authorization_id: str = "") -> bytes:
    return f"{authorization_id}\0{username}\0{password}".encode()


def handshake(connection: RawConnection, mechanism: str = "PLAIN", version: int = 1):
    return connection.call(request_of(api_table.SASL_HANDSHAKE, version, mechanism=mechanism))


def sasl_authenticate(connection: RawConnection, auth_bytes: bytes, version: int = 2):
    return connection.call(request_of(api_table.SASL_AUTHENTICATE, version, auth_bytes=auth_bytes))


def log_in(connection: RawConnection, username: str, api_key: str, version: int = 2):
    assert handshake(connection).error_code == KafkaError.none
    return sasl_authenticate(connection, plain(username, api_key), version)


def metadata(connection: RawConnection, topic: str, operations: bool = False):
    return connection.call(
        request_of(
            api_table.METADATA,
            12,
            topics=(nested(api_table.METADATA, 12, "MetadataRequestTopic", name=topic, topic_id=None),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=operations,
        )
    )


def api_versions():
    return request_of(api_table.API_VERSIONS, 3, client_software_name="raw-test", client_software_version="1")


def every_topic():
    return request_of(
        api_table.METADATA, 12, topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )


def closes_the_connection(connection: RawConnection, request) -> bool:
    connection.send(request)
    return connection.closed_by_peer()


def topic_error(connection: RawConnection, topic: str) -> KafkaError:
    (answer,) = metadata(connection, topic).topics
    return answer.error_code


@pytest.fixture(scope="module")
def reader(secured) -> tuple[str, str]:
    """(username, API key) of a principal that may read and write TOPIC only."""
    _, api_key = new_principal(secured, "reader", *reader_and_writer(TOPIC))
    return "reader", api_key


def test_before_authentication_only_api_versions_and_sasl_are_served(secured, reader):
    bootstrap = secured.extra["kafka_bootstrap"]
    with RawConnection(bootstrap) as connection:
        versions = connection.call(api_versions())
        assert versions.error_code == KafkaError.none
        advertised = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
        assert advertised[api_table.SASL_HANDSHAKE] == (0, 1)
        assert advertised[api_table.SASL_AUTHENTICATE] == (0, 2)
        assert closes_the_connection(connection, every_topic())
    with RawConnection(bootstrap) as connection:  # after the handshake, SaslAuthenticate only
        assert handshake(connection).error_code == KafkaError.none
        assert closes_the_connection(connection, api_versions())
    with RawConnection(bootstrap) as connection:  # Kafka's sasl.server.max.receive.size before authentication
        connection.send_bytes((UNAUTHENTICATED_MAX_REQUEST_BYTES + 1).to_bytes(4, "big"))
        assert connection.closed_by_peer()


def test_an_unsupported_mechanism_is_answered_with_the_enabled_ones_and_the_connection_closes(secured):
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        answer = handshake(connection, "GSSAPI")
        assert answer.error_code == KafkaError.unsupported_sasl_mechanism
        assert answer.mechanisms == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
        assert connection.closed_by_peer()


@pytest.mark.parametrize(
    "auth_bytes",
    [
        plain("reader", "not-its-key"),
        plain("nobody", "not-a-key"),
        plain("reader", ""),
        plain("", "x"),
        b"no separators",
        b"\xff\0reader\0key",
    ],
    ids=["wrong-key", "unknown-user", "no-password", "no-username", "not-plain", "not-utf8"],
)
def test_wrong_credentials_fail_authentication_and_close_the_connection(secured, reader, auth_bytes):
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert handshake(connection).error_code == KafkaError.none
        answer = sasl_authenticate(connection, auth_bytes)
        assert answer.error_code == KafkaError.sasl_authentication_failed
        assert answer.error_message
        assert connection.closed_by_peer()


def test_another_principals_key_does_not_authenticate(secured, reader):
    _, other_key = new_principal(secured, "other-key-owner")
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        answer = log_in(connection, "reader", other_key)
        assert (answer.error_code, answer.error_message) == (KafkaError.sasl_authentication_failed, INVALID_CREDENTIALS)
        assert connection.closed_by_peer()


@pytest.mark.parametrize("version", sorted(api_table.SUPPORTED_VERSIONS[api_table.SASL_AUTHENTICATE]))
def test_each_sasl_authenticate_version_authenticates_and_the_acls_apply(secured, reader, version):
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        answer = log_in(connection, *reader, version=version)
        assert answer.error_code == KafkaError.none, answer
        if version >= 1:  # KIP-368: no re-authentication, the session does not expire
            assert answer.session_lifetime == datetime.timedelta(0)
        assert topic_error(connection, TOPIC) == KafkaError.none
        assert topic_error(connection, OTHER_TOPIC) == KafkaError.topic_authorization_failed
        assert handshake(connection).error_code == KafkaError.illegal_sasl_state  # no re-authentication
        assert sasl_authenticate(connection, plain(*reader)).error_code == KafkaError.illegal_sasl_state
        assert topic_error(connection, TOPIC) == KafkaError.none


def test_after_a_v0_handshake_the_plain_message_is_sent_unframed(secured, reader):
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert handshake(connection, version=0).error_code == KafkaError.none
        token = plain(*reader)
        connection.send_bytes(len(token).to_bytes(4, "big") + token)
        assert connection.read_exactly(4) == b"\0\0\0\0"  # PLAIN's server token: empty
        assert topic_error(connection, TOPIC) == KafkaError.none
        assert topic_error(connection, OTHER_TOPIC) == KafkaError.topic_authorization_failed
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:  # v0 cannot say why: it closes
        assert handshake(connection, version=0).error_code == KafkaError.none
        token = plain(reader[0], "wrong")
        connection.send_bytes(len(token).to_bytes(4, "big") + token)
        assert connection.closed_by_peer()


def test_an_authorization_id_other_than_the_username_is_refused(secured, reader):
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert handshake(connection).error_code == KafkaError.none
        answer = sasl_authenticate(connection, plain(*reader, authorization_id="admin"))
        assert answer.error_code == KafkaError.sasl_authentication_failed
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert handshake(connection).error_code == KafkaError.none
        assert sasl_authenticate(connection, plain(*reader, authorization_id="reader")).error_code == KafkaError.none


def test_an_open_connection_gets_acl_changes_and_is_closed_once_its_key_is_revoked(secured):
    key_id, api_key = new_principal(secured, "changing")
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, "changing", api_key).error_code == KafkaError.none
        assert topic_error(connection, OTHER_TOPIC) == KafkaError.topic_authorization_failed
        with admin_client(secured) as admin:
            admin.post(
                "/v1/acls", json={"principal": "changing", **rule("Topic", OTHER_TOPIC, "Describe")}
            ).raise_for_status()
            assert topic_error(connection, OTHER_TOPIC) == KafkaError.none
            admin.delete(f"/v1/principals/changing/keys/{key_id}").raise_for_status()
        assert closes_the_connection(connection, every_topic())


def test_the_admin_apis_apply_the_principals_acls(secured, reader):
    """KIP-664's APIs and CreatePartitions, as a principal that may only read and write TOPIC."""
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, *reader).error_code == KafkaError.none
        described = connection.call(request_of(api_table.DESCRIBE_TRANSACTIONS, 0, transactional_ids=("any-txn",)))
        assert [t.error_code for t in described.transaction_states] == [
            KafkaError.transactional_id_authorization_failed
        ]
        listed = connection.call(
            request_of(
                api_table.LIST_TRANSACTIONS,
                2,
                state_filters=(),
                producer_id_filters=(),
                duration_filter=-1,
                transactional_id_pattern=None,
            )
        )
        assert (listed.error_code, listed.transaction_states) == (KafkaError.none, ())
        for topic, expected in ((OTHER_TOPIC, KafkaError.topic_authorization_failed), (TOPIC, KafkaError.none)):
            wanted = nested(api_table.DESCRIBE_PRODUCERS, 0, "TopicRequest", name=topic, partition_indexes=(0,))
            producers = connection.call(request_of(api_table.DESCRIBE_PRODUCERS, 0, topics=(wanted,)))
            assert [p.error_code for t in producers.topics for p in t.partitions] == [expected]
        grow = nested(api_table.CREATE_PARTITIONS, 3, "CreatePartitionsTopic", name=TOPIC, count=2, assignments=None)
        grown = connection.call(
            request_of(
                api_table.CREATE_PARTITIONS,
                3,
                topics=(grow,),
                timeout=datetime.timedelta(seconds=5),
                validate_only=False,
            )
        )
        assert [r.error_code for r in grown.results] == [KafkaError.topic_authorization_failed]
    with admin_client(secured) as admin:
        assert len(admin.get(f"/v1/topics/{TOPIC}").json()["partitions"]) == 1


# Kafka's AclOperation codes of what Describe on the Cluster lets a principal do there: Describe,
# DescribeConfigs, and IdempotentWrite (any principal's, as InitProducerId allows).
DESCRIBE, DESCRIBE_CONFIGS, IDEMPOTENT_WRITE = 8, 10, 12


def test_describe_cluster_needs_no_acl_and_answers_the_clusters_operations(secured, reader):
    """As Kafka: the brokers to any principal; the authorized operations asked for are none without
    Describe on the Cluster, and those its rules allow with it."""
    _, api_key = new_principal(secured, "cluster-describer", rule("Cluster", "txbroker-cluster", "Describe"))
    answers = {}
    for username, key in (reader, ("cluster-describer", api_key)):
        with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
            assert log_in(connection, username, key).error_code == KafkaError.none
            answers[username] = connection.call(
                request_of(api_table.DESCRIBE_CLUSTER, 1, include_cluster_authorized_operations=True, endpoint_type=1)
            )
    assert {name: (r.error_code, len(r.brokers)) for name, r in answers.items()} == {
        "reader": (KafkaError.none, 1),
        "cluster-describer": (KafkaError.none, 1),
    }
    assert answers["reader"].cluster_authorized_operations == 0
    assert answers["cluster-describer"].cluster_authorized_operations == (
        (1 << DESCRIBE) | (1 << DESCRIBE_CONFIGS) | (1 << IDEMPOTENT_WRITE)
    )


def test_describe_topics_answers_the_operations_the_principals_rules_allow(secured):
    """confluent-kafka's `describe_topics` with the authorized operations (Metadata v12's topic
    operations): what the principal's rules on the topic allow, Describe and DescribeConfigs implied
    by Read and Alter, AlterConfigs by Alter, as Kafka's authorizer answers them; a topic it may not
    Describe is refused, its operations not answered (raw Metadata)."""
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AclOperation, AdminClient

    _, api_key = new_principal(
        secured, "topic-operations", rule("Topic", TOPIC, "Read"), rule("Topic", "gua", "Alter", "prefixed")
    )
    admin = AdminClient(confluent_config(secured.extra["kafka_bootstrap"], "topic-operations", api_key))
    collection = TopicCollection([TOPIC])
    described = admin.describe_topics(collection, include_authorized_operations=True)[TOPIC].result(WAIT_S)
    assert set(described.authorized_operations) == {
        AclOperation.READ,
        AclOperation.DESCRIBE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    }
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, "topic-operations", api_key).error_code == KafkaError.none
        asked = nested(api_table.METADATA, 12, "MetadataRequestTopic", name=OTHER_TOPIC, topic_id=None)
        (refused,) = connection.call(
            request_of(
                api_table.METADATA,
                12,
                topics=(asked,),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=True,
            )
        ).topics
    assert (refused.error_code, refused.topic_authorized_operations) == (
        KafkaError.topic_authorization_failed,
        -(2**31),
    )


def test_describe_topic_partitions_applies_describe_as_metadata_does(secured, reader):
    """DescribeTopicPartitions (75) as Kafka's broker authorizes it: a topic named that the principal
    may not Describe is TOPIC_AUTHORIZATION_FAILED, after the others, without its id, partitions or
    operations; every topic (none named) leaves it out; a topic described has the operations
    Metadata v12 answers for it."""
    key = api_table.DESCRIBE_TOPIC_PARTITIONS
    username, api_key = reader

    def describe(connection: RawConnection, names: list[str]):
        return connection.call(
            request_of(
                key,
                0,
                topics=tuple(nested(key, 0, "TopicRequest", name=name) for name in names),
                response_partition_limit=2000,
                cursor=None,
            )
        ).topics

    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, username, api_key).error_code == KafkaError.none
        described, refused = describe(connection, [OTHER_TOPIC, TOPIC])
        every = describe(connection, [])
        (operations,) = metadata(connection, TOPIC, operations=True).topics
    assert (described.name, described.error_code, len(described.partitions)) == (TOPIC, KafkaError.none, 1)
    assert described.topic_authorized_operations == operations.topic_authorized_operations
    assert (refused.name, refused.error_code, refused.topic_id, refused.partitions) == (
        OTHER_TOPIC,
        KafkaError.topic_authorization_failed,
        None,  # Kafka's zero id, as kio reads it
        (),
    )
    assert refused.topic_authorized_operations == -(2**31)
    assert [t.name for t in every] == [TOPIC]


def test_elect_leaders_needs_alter_on_the_cluster(secured, reader):
    """As Kafka's controller: without Alter on the Cluster the request's error and each partition's
    is CLUSTER_AUTHORIZATION_FAILED (none answered when every partition is asked); with it, a
    partition that exists needs no election."""
    topics = (nested(api_table.ELECT_LEADERS, 2, "TopicPartitions", topic=TOPIC, partitions=(0,)),)
    _, api_key = new_principal(secured, "elector", rule("Cluster", "txbroker-cluster", "Alter"))
    answered = {}
    for username, key in (reader, ("elector", api_key)):
        with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
            assert log_in(connection, username, key).error_code == KafkaError.none
            answered[username] = [
                connection.call(request_of(api_table.ELECT_LEADERS, 2, election_type=0, topic_partitions=asked))
                for asked in (topics, None)
            ]
    for username, partition_error in (
        ("reader", KafkaError.cluster_authorization_failed),
        ("elector", KafkaError.election_not_needed),
    ):
        named, every = answered[username]
        top_error = KafkaError.none if username == "elector" else partition_error
        assert (named.error_code, every.error_code) == (top_error, top_error)
        assert [(r.topic, [p.error_code for p in r.partition_result]) for r in named.replica_election_results] == [
            (TOPIC, [partition_error])
        ]
        assert all(r.partition_result == () for r in every.replica_election_results)
    assert answered["reader"][1].replica_election_results == ()


def test_describe_log_dirs_needs_describe_on_the_cluster(secured, reader):
    """As a Kafka broker: without Describe on the Cluster no log dir is described and the request's
    error (v3+) is CLUSTER_AUTHORIZATION_FAILED; with it, the topics' partitions are."""
    _, api_key = new_principal(secured, "log-dirs", rule("Cluster", "txbroker-cluster", "Describe"))
    answered = {}
    for username, key in (reader, ("log-dirs", api_key)):
        with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
            assert log_in(connection, username, key).error_code == KafkaError.none
            answered[username] = connection.call(request_of(api_table.DESCRIBE_LOG_DIRS, 4, topics=None))
    assert (answered["reader"].error_code, answered["reader"].results) == (
        KafkaError.cluster_authorization_failed,
        (),
    )
    (log_dir,) = answered["log-dirs"].results
    assert answered["log-dirs"].error_code == KafkaError.none
    assert {TOPIC, OTHER_TOPIC} <= {topic.name for topic in log_dir.topics}


def test_describing_the_brokers_configs_needs_describe_on_the_cluster(secured, reader):
    """As a Kafka broker, which asks DescribeConfigs on the Cluster: without Describe on it the
    broker resource is CLUSTER_AUTHORIZATION_FAILED and no config is shown; with it, every one is,
    the listener's protocol SASL_PLAINTEXT."""
    _, api_key = new_principal(secured, "broker-configs", rule("Cluster", "txbroker-cluster", "Describe"))
    answered = {}
    for username, key in (reader, ("broker-configs", api_key)):
        with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
            assert log_in(connection, username, key).error_code == KafkaError.none
            (answered[username],) = connection.call(
                request_of(
                    api_table.DESCRIBE_CONFIGS,
                    4,
                    resources=(
                        nested(
                            api_table.DESCRIBE_CONFIGS,
                            4,
                            "DescribeConfigsResource",
                            resource_type=4,
                            resource_name="",
                            configuration_keys=None,
                        ),
                    ),
                    include_synonyms=False,
                    include_documentation=False,
                )
            ).results
    assert (answered["reader"].error_code, answered["reader"].configs) == (KafkaError.cluster_authorization_failed, ())
    configs = {config.name: config.value for config in answered["broker-configs"].configs}
    assert configs["advertised.listeners"] == f"SASL_PLAINTEXT://{secured.extra['kafka_bootstrap']}"


def test_a_groups_configs_need_describe_and_alter_on_the_group(secured, reader):
    """As a Kafka broker, which asks DescribeConfigs and AlterConfigs on the Group (txbroker's
    Describe and Alter stand for them, as a topic's): without them, GROUP_AUTHORIZATION_FAILED, no
    config shown and none changed."""
    group, session = f"{GROUP_PREFIX}configs", "consumer.session.timeout.ms"
    _, describer_key = new_principal(secured, "group-configs-describer", rule("Group", group, "Describe"))
    _, alterer_key = new_principal(secured, "group-configs-alterer", rule("Group", group, "Alter"))

    def described(username: str, key: str):
        with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
            assert log_in(connection, username, key).error_code == KafkaError.none
            resource = nested(
                api_table.DESCRIBE_CONFIGS,
                4,
                "DescribeConfigsResource",
                resource_type=32,
                resource_name=group,
                configuration_keys=(session,),
            )
            (result,) = connection.call(
                request_of(
                    api_table.DESCRIBE_CONFIGS,
                    4,
                    resources=(resource,),
                    include_synonyms=False,
                    include_documentation=False,
                )
            ).results
        return result.error_code, [(config.name, config.value) for config in result.configs]

    def altered(username: str, key: str, value: str):
        with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
            assert log_in(connection, username, key).error_code == KafkaError.none
            request = alter_configs(1, [(32, group, {session: value})], key=api_table.INCREMENTAL_ALTER_CONFIGS)
            (answer,) = connection.call(request).responses
        return answer.error_code

    # The reader may Read groups prefixed GROUP_PREFIX (which implies Describe), not Alter them.
    assert altered(*reader, "50000") == KafkaError.group_authorization_failed
    assert altered("group-configs-describer", describer_key, "50000") == KafkaError.group_authorization_failed
    assert described("group-configs-describer", describer_key) == (KafkaError.none, [(session, "45000")])
    assert altered("group-configs-alterer", alterer_key, "50000") == KafkaError.none
    assert described("group-configs-describer", describer_key) == (KafkaError.none, [(session, "50000")])
    _, stranger_key = new_principal(secured, "group-configs-stranger", rule("Group", "another-group", "Describe"))
    assert described("group-configs-stranger", stranger_key) == (KafkaError.group_authorization_failed, [])


def test_moving_replicas_needs_alter_and_listing_reassignments_describe_on_the_cluster(secured, reader):
    """As a Kafka broker: without Alter on the Cluster, AlterPartitionReassignments fails as a
    whole and AlterReplicaLogDirs each partition, CLUSTER_AUTHORIZATION_FAILED; without Describe on
    it, ListPartitionReassignments does."""
    timeout = datetime.timedelta(seconds=30)
    reassignment = request_of(
        api_table.ALTER_PARTITION_REASSIGNMENTS,
        0,
        timeout=timeout,
        topics=(
            nested(
                api_table.ALTER_PARTITION_REASSIGNMENTS,
                0,
                "ReassignableTopic",
                name=TOPIC,
                partitions=(
                    nested(
                        api_table.ALTER_PARTITION_REASSIGNMENTS,
                        0,
                        "ReassignablePartition",
                        partition_index=0,
                        replicas=(0,),
                    ),
                ),
            ),
        ),
    )
    log_dir_move = request_of(
        api_table.ALTER_REPLICA_LOG_DIRS,
        2,
        dirs=(
            nested(
                api_table.ALTER_REPLICA_LOG_DIRS,
                2,
                "AlterReplicaLogDir",
                path="postgresql",
                topics=(
                    nested(api_table.ALTER_REPLICA_LOG_DIRS, 2, "AlterReplicaLogDirTopic", name=TOPIC, partitions=(0,)),
                ),
            ),
        ),
    )
    listing = request_of(api_table.LIST_PARTITION_REASSIGNMENTS, 0, timeout=timeout, topics=None)
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, *reader).error_code == KafkaError.none
        reassigned = connection.call(reassignment)
        moved = connection.call(log_dir_move)
        listed = connection.call(listing)
    assert reassigned.error_code == KafkaError.cluster_authorization_failed
    assert [p.error_code for t in reassigned.responses for p in t.partitions] == [
        KafkaError.cluster_authorization_failed
    ]
    assert [p.error_code for t in moved.results for p in t.partitions] == [KafkaError.cluster_authorization_failed]
    assert listed.error_code == KafkaError.cluster_authorization_failed


def test_altering_a_topics_configs_needs_alter_on_it(secured):
    """AlterConfigs: TOPIC_AUTHORIZATION_FAILED for the topic the principal may not alter only; the
    other's configs are replaced."""
    _, api_key = new_principal(secured, "config-alterer", rule("Topic", TOPIC, "Alter"))
    # delete.retention.ms: harmless to the other tests' records (TOPIC's cleanup policy is delete).
    configs = (nested(api_table.ALTER_CONFIGS, 2, "AlterableConfig", name="delete.retention.ms", value="3600000"),)
    resources = tuple(
        nested(
            api_table.ALTER_CONFIGS, 2, "AlterConfigsResource", resource_type=2, resource_name=topic, configs=configs
        )
        for topic in (OTHER_TOPIC, TOPIC)
    )
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, "config-alterer", api_key).error_code == KafkaError.none
        response = connection.call(request_of(api_table.ALTER_CONFIGS, 2, resources=resources, validate_only=False))
    assert [(r.resource_name, r.error_code) for r in response.responses] == [
        (OTHER_TOPIC, KafkaError.topic_authorization_failed),
        (TOPIC, KafkaError.none),
    ]
    with admin_client(secured) as admin:
        assert admin.get(f"/v1/topics/{TOPIC}").json()["config"]["delete_retention_ms"] == 3_600_000
        assert admin.get(f"/v1/topics/{OTHER_TOPIC}").json()["config"]["delete_retention_ms"] == 86_400_000


def test_a_topic_created_without_describe_on_it_is_answered_without_its_configs(secured):
    """CreateTopics v5+ as Kafka's controller answers a principal that may create a topic but not
    describe its configs (Kafka: DescribeConfigs, txbroker's Describe): the topic is created, its
    config error TOPIC_AUTHORIZATION_FAILED, its counts unknown (-1) and no configs; with Describe
    (Alter implies it), its configs."""
    _, api_key = new_principal(
        secured,
        "topic-creator",
        rule("Topic", "created-blind-", "Create", "prefixed"),
        rule("Topic", "created-seen-", "Create", "prefixed"),
        rule("Topic", "created-seen-", "Alter", "prefixed"),
    )
    topics = tuple(
        nested(
            api_table.CREATE_TOPICS,
            7,
            "CreatableTopic",
            name=name,
            num_partitions=2,
            replication_factor=-1,
            assignments=(),
            configs=(),
        )
        for name in ("created-blind-1", "created-seen-1")
    )
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, "topic-creator", api_key).error_code == KafkaError.none
        blind, seen = connection.call(
            request_of(
                api_table.CREATE_TOPICS, 7, topics=topics, timeout=datetime.timedelta(seconds=30), validate_only=False
            )
        ).topics
    assert (blind.error_code, blind.topic_config_error_code) == (KafkaError.none, KafkaError.topic_authorization_failed)
    assert (blind.num_partitions, blind.replication_factor, blind.configs) == (-1, -1, ())
    assert (seen.error_code, seen.topic_config_error_code) == (KafkaError.none, KafkaError.none)
    assert (seen.num_partitions, seen.replication_factor) == (2, 1)
    assert "retention.ms" in {config.name for config in seen.configs}
    with admin_client(secured) as admin:
        assert len(admin.get("/v1/topics/created-blind-1").json()["partitions"]) == 2


# ---- the real clients over SASL_PLAINTEXT


def confluent_security(username: str, api_key: str, **extra) -> dict:
    """What confluent-kafka's config adds for SASL/PLAIN (tests.kafka.clients takes it as extra config)."""
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": username,
        "sasl.password": api_key,
        **extra,
    }


def confluent_config(bootstrap: str, username: str, api_key: str, **extra) -> dict:
    return {"bootstrap.servers": bootstrap, **confluent_security(username, api_key, **extra)}


def python_config(bootstrap: str, username: str, api_key: str, **extra) -> dict:
    """kafka-python's and aiokafka's (the same names)."""
    return {
        "bootstrap_servers": bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": username,
        "sasl_plain_password": api_key,
        **extra,
    }


def confluent_produce(config: dict, topic: str, values: list[bytes]) -> list:
    """The delivery errors (None each when delivered)."""
    producer = Producer(config)
    errors = []
    for value in values:
        producer.produce(topic, value=value, on_delivery=lambda error, _message: errors.append(error))
    assert producer.flush(WAIT_S) == 0
    return errors


def kafka_python_produce(config: dict, topic: str, values: list[bytes]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(**config)
    try:
        for future in [producer.send(topic, value=value) for value in values]:
            future.get(WAIT_S)
    finally:
        producer.close(WAIT_S)


def kafka_python_consume(config: dict, topic: str, count: int) -> list[bytes]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(group_id=None, enable_auto_commit=False, **config)
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        values = []
        deadline = time.monotonic() + WAIT_S
        while len(values) < count and time.monotonic() < deadline:
            values += [record.value for record in consumer.poll(timeout_ms=1000).get(partition, [])]
        return values
    finally:
        consumer.close()


async def aiokafka_produce(config: dict, topic: str, values: list[bytes]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(**config)
    try:
        await producer.start()
        for value in values:
            await producer.send_and_wait(topic, value=value)
    finally:
        await producer.stop()


async def aiokafka_consume(config: dict, topic: str, count: int) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, **config)
    await consumer.start()
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        values = []
        deadline = time.monotonic() + WAIT_S
        while len(values) < count and time.monotonic() < deadline:
            batches = await consumer.getmany(partition, timeout_ms=1000)
            values += [record.value for record in batches.get(partition, [])]
        return values
    finally:
        await consumer.stop()


def confluent_consume(server, topic: str, count: int, **config) -> list[bytes]:
    received = ConfluentKafka().consume(server, topic, 0, count, **{"group.id": GROUP_PREFIX + "confluent", **config})
    return [record.value for record in received]


def round_trip(client: str, server, username: str, api_key: str, topic: str, values: list[bytes], **tls):
    """Produces `values` to partition 0 of `topic` with the client, then reads the partition back."""
    if client == "confluent-kafka":
        security = confluent_security(username, api_key, **tls)
        ConfluentKafka().produce(server, topic, [{"value": value} for value in values], **security)
        return confluent_consume(server, topic, len(values), **security)
    config = python_config(server.extra["kafka_bootstrap"], username, api_key, **tls)
    if client == "kafka-python":
        kafka_python_produce(config, topic, values)
        return kafka_python_consume(config, topic, len(values))
    asyncio.run(aiokafka_produce(config, topic, values))
    return asyncio.run(aiokafka_consume(config, topic, len(values)))


CLIENTS = ["confluent-kafka", "kafka-python", "aiokafka"]


@pytest.mark.parametrize("client", CLIENTS)
def test_an_authorized_principal_produces_and_consumes(secured, client):
    topic = f"sasl-{client}"
    with admin_client(secured) as admin:
        admin.post("/v1/topics", json={"name": topic, "partitions": 1, "config": {}}).raise_for_status()
    _, api_key = new_principal(secured, f"user-{client}", *reader_and_writer(topic))
    values = [f"{client}-{i}".encode() for i in range(3)]
    assert round_trip(client, secured, f"user-{client}", api_key, topic, values) == values


def test_a_principal_without_the_topics_acl_is_refused_by_each_client(secured, reader):
    bootstrap = secured.extra["kafka_bootstrap"]
    errors = confluent_produce(
        confluent_config(bootstrap, *reader, **{"message.timeout.ms": 30000}), OTHER_TOPIC, [b"x"]
    )
    assert [error.code() for error in errors] == [ConfluentError.TOPIC_AUTHORIZATION_FAILED]

    from aiokafka.errors import TopicAuthorizationFailedError as AioTopicAuthorizationFailed
    from kafka.errors import TopicAuthorizationFailedError

    with pytest.raises(TopicAuthorizationFailedError):
        kafka_python_produce(python_config(bootstrap, *reader), OTHER_TOPIC, [b"x"])
    with pytest.raises(AioTopicAuthorizationFailed):
        asyncio.run(aiokafka_produce(python_config(bootstrap, *reader), OTHER_TOPIC, [b"x"]))
    with admin_client(secured) as admin:
        assert admin.get(f"/v1/topics/{OTHER_TOPIC}").json()["partitions"][0]["high_watermark"] == 0


def assert_confluent_kafka_fails_authentication(config: dict) -> None:
    """A confluent-kafka producer with `config` reports an authentication error with Kafka's message."""
    failures = []
    producer = Producer({**config, "error_cb": failures.append})
    deadline = time.monotonic() + WAIT_S
    while not failures and time.monotonic() < deadline:
        producer.poll(0.2)
    assert failures and failures[0].code() == ConfluentError._AUTHENTICATION, failures
    assert INVALID_CREDENTIALS in failures[0].str()
    del producer  # it would keep retrying


def test_a_wrong_api_key_fails_each_clients_authentication(secured, reader, caplog):
    bootstrap = secured.extra["kafka_bootstrap"]
    username = reader[0]
    assert_confluent_kafka_fails_authentication(confluent_config(bootstrap, username, "wrong"))

    # kafka-python retries a failed authentication until its bootstrap times out; aiokafka gives up at once.
    # Both log why: Kafka's error and message, as the listener sent them.
    from aiokafka.errors import KafkaConnectionError
    from kafka.errors import KafkaTimeoutError

    with pytest.raises(KafkaTimeoutError):
        kafka_python_produce(python_config(bootstrap, username, "wrong", bootstrap_timeout_ms=2000), TOPIC, [b"x"])
    assert f"SaslAuthenticationFailedError: {INVALID_CREDENTIALS}" in caplog.text
    caplog.clear()
    with pytest.raises(KafkaConnectionError):
        asyncio.run(aiokafka_produce(python_config(bootstrap, username, "wrong"), TOPIC, [b"x"]))
    assert f"SaslAuthenticationFailed: {INVALID_CREDENTIALS}" in caplog.text


@pytest.mark.skipif(shutil.which("kcat") is None, reason="needs kcat")
def test_kcat_produces_and_consumes_over_sasl(secured):
    """Debian's kcat (librdkafka 2.0) uses SASL only when SaslHandshake is advertised from v0."""
    _, api_key = new_principal(secured, "kcat-user", *reader_and_writer("sasl-kcat"))
    with admin_client(secured) as admin:
        admin.post("/v1/topics", json={"name": "sasl-kcat", "partitions": 1, "config": {}}).raise_for_status()
    kcat = ["kcat", "-b", secured.extra["kafka_bootstrap"], "-X", "security.protocol=SASL_PLAINTEXT"]
    kcat += ["-X", "sasl.mechanisms=PLAIN", "-X", "sasl.username=kcat-user", "-X", f"sasl.password={api_key}"]
    produced = subprocess.run(
        [*kcat, "-P", "-t", "sasl-kcat"], input=b"one\ntwo\n", capture_output=True, timeout=WAIT_S
    )
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run([*kcat, "-C", "-t", "sasl-kcat", "-e"], capture_output=True, timeout=WAIT_S)
    assert (consumed.returncode, consumed.stdout) == (0, b"one\ntwo\n"), consumed.stderr


# ---- transactions over SASL: the TransactionalId ACLs


def test_a_transaction_over_sasl_needs_the_transactional_id_acl(secured):
    topic = "sasl-transactions"
    with admin_client(secured) as admin:
        admin.post("/v1/topics", json={"name": topic, "partitions": 2, "config": {}}).raise_for_status()
    rules = [*reader_and_writer(topic), rule("TransactionalId", "sasl-tx-", "Write", "prefixed")]
    _, api_key = new_principal(secured, "transactor", *rules)
    bootstrap = secured.extra["kafka_bootstrap"]

    refused = Producer(confluent_config(bootstrap, "transactor", api_key, **{"transactional.id": "other-tx"}))
    with pytest.raises(KafkaException) as denied:
        refused.init_transactions(WAIT_S)
    assert denied.value.args[0].code() == ConfluentError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED

    producer = Producer(confluent_config(bootstrap, "transactor", api_key, **{"transactional.id": "sasl-tx-1"}))
    producer.init_transactions(WAIT_S)
    for commit, value in ((False, b"aborted"), (True, b"committed")):
        producer.begin_transaction()
        for partition in (0, 1):
            producer.produce(topic, value=value, partition=partition)
        assert producer.flush(WAIT_S) == 0
        (producer.commit_transaction if commit else producer.abort_transaction)(WAIT_S)
    committed = confluent_consume(
        secured, topic, 1, isolation="read_committed", **confluent_security("transactor", api_key)
    )
    assert committed == [b"committed"]


def test_add_partitions_refused_for_a_topic_answers_a_partition_named_twice_once(secured):
    """Regression: a request refused for a topic the principal may not write answered each mention
    of a partition named twice. Kafka's broker answers such a request from a map by partition
    (TOPIC_AUTHORIZATION_FAILED, the others OPERATION_NOT_ATTEMPTED), each partition once, and adds
    nothing (KafkaApis.handleAddPartitionsToTxnRequest). Regression too: a partition of a topic it
    may write that does not exist was not attempted; Kafka checks it after the ACLs,
    UNKNOWN_TOPIC_OR_PARTITION."""
    _, api_key = new_principal(
        secured, "txn-adder", rule("Topic", TOPIC, "Write"), rule("TransactionalId", "sasl-add-", "Write", "prefixed")
    )
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, "txn-adder", api_key).error_code == KafkaError.none
        producer = raw_transactions.init_producer(connection, "sasl-add-1")
        answers = raw_transactions.add_partitions_of(connection, producer, [(TOPIC, [0, 0, 5]), (OTHER_TOPIC, [0])])
    assert sorted(answers) == [
        (TOPIC, 0, KafkaError.operation_not_attempted),
        (TOPIC, 5, KafkaError.unknown_topic_or_partition),
        (OTHER_TOPIC, 0, KafkaError.topic_authorization_failed),
    ]


def test_find_coordinator_needs_describe_on_the_group_or_the_transactional_id(secured):
    """Regression: FindCoordinator answered this node for any key. Kafka's broker first checks
    Describe on the group (GROUP_AUTHORIZATION_FAILED) or on the transactional id
    (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), answering no node (-1) when refused
    (KafkaApis.getCoordinator); Read on a group and Write on a transactional id imply Describe."""
    key = api_table.FIND_COORDINATOR
    _, api_key = new_principal(
        secured,
        "coordinator-finder",
        rule("Group", "sasl-find-", "Read", "prefixed"),
        rule("TransactionalId", "sasl-find-", "Write", "prefixed"),
    )

    def find(connection: RawConnection, version: int, key_type: int, *keys: str):
        request = request_of(key, version, key=keys[0], key_type=key_type, coordinator_keys=keys)
        response = connection.call(request)
        if version < 4:
            return [(keys[0], response.error_code, response.node_id)]
        return [(c.key, c.error_code, c.node_id) for c in response.coordinators]

    node = 0  # the node's id (TXBROKER_NODE_ID, 0 unless set)
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, "coordinator-finder", api_key).error_code == KafkaError.none
        groups = find(connection, 4, 0, "sasl-find-group", "someone-elses")
        transactional_ids = find(connection, 4, 1, "sasl-find-tx", "someone-elses")
        old_group = find(connection, 3, 0, "someone-elses")
        old_transactional_id = find(connection, 1, 1, "someone-elses")
        allowed_v0 = find(connection, 0, 0, "sasl-find-group")
    assert groups == [
        ("sasl-find-group", KafkaError.none, node),
        ("someone-elses", KafkaError.group_authorization_failed, -1),
    ]
    assert transactional_ids == [
        ("sasl-find-tx", KafkaError.none, node),
        ("someone-elses", KafkaError.transactional_id_authorization_failed, -1),
    ]
    assert old_group == [("someone-elses", KafkaError.group_authorization_failed, -1)]
    assert old_transactional_id == [("someone-elses", KafkaError.transactional_id_authorization_failed, -1)]
    assert allowed_v0 == [("sasl-find-group", KafkaError.none, node)]


# ---- DeleteGroups: Delete on the group, over both doors


def test_deleting_a_group_needs_delete_on_it(secured):
    """GROUP_AUTHORIZATION_FAILED for the group the principal may not delete only; the other goes."""
    allowed, denied = "sasl-deletable", "sasl-kept"
    with admin_client(secured) as admin:
        for group in (allowed, denied):
            offsets = [{"topic": TOPIC, "partition": 0, "offset": 1}]
            admin.post(f"/v1/groups/{group}/offsets/commit", json={"offsets": offsets}).raise_for_status()
    _, api_key = new_principal(secured, "group-deleter", rule("Group", allowed, "Delete"))
    with httpx.Client(base_url=secured.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30) as client:
        refused = client.delete(f"/v1/groups/{denied}")
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "GROUP_AUTHORIZATION_FAILED")
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, "group-deleter", api_key).error_code == KafkaError.none
        response = connection.call(request_of(api_table.DELETE_GROUPS, 2, groups_names=(denied, allowed)))
    assert [(r.group_id, r.error_code) for r in response.results] == [
        (denied, KafkaError.group_authorization_failed),
        (allowed, KafkaError.none),
    ]
    with admin_client(secured) as admin:
        assert admin.get(f"/v1/groups/{allowed}").status_code == 404
        assert admin.get(f"/v1/groups/{denied}").json()["offsets"][0]["offset"] == 1


# Kafka's AclOperation codes of a Group's operations (AclEntry.supportedOperations(GROUP)).
READ, DELETE = 3, 6


def test_describing_a_group_answers_the_operations_the_principals_rules_allow(secured):
    """DescribeGroups v3+ and ConsumerGroupDescribe answer the principal's operations on a group
    described without error when asked, as Kafka's KafkaApis sets them (Read implies Describe);
    not asked, or for a group not described (ConsumerGroupDescribe of a classic group), Kafka's
    INT32_MIN. Regression: both answered INT32_MIN even when asked."""
    classic, consumer = "sasl-classic-ops", "sasl-consumer-ops"
    with admin_client(secured) as admin:
        offsets = [{"topic": TOPIC, "partition": 0, "offset": 1}]
        admin.post(f"/v1/groups/{classic}/offsets/commit", json={"offsets": offsets}).raise_for_status()
    # Read on every group of the prefix, Delete on the consumer group as well.
    rules = [
        rule("Group", "sasl-", "Read", "prefixed"),
        rule("Group", consumer, "Delete"),
        rule("Topic", TOPIC, "Read"),
    ]
    _, api_key = new_principal(secured, "group-describer", *rules)
    not_asked = -(2**31)
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, "group-describer", api_key).error_code == KafkaError.none
        joined = raw_groups.consumer_heartbeat(connection, consumer, "ops-member", 0, [TOPIC])
        assert joined.error_code == KafkaError.none

        def describe_groups(include: bool):
            request = request_of(api_table.DESCRIBE_GROUPS, 5, groups=(classic,), include_authorized_operations=include)
            (group,) = connection.call(request).groups
            return group.error_code, group.authorized_operations

        def consumer_group_describe(include: bool):
            request = request_of(
                api_table.CONSUMER_GROUP_DESCRIBE,
                0,
                group_ids=(consumer, classic),
                include_authorized_operations=include,
            )
            return [(g.error_code, g.authorized_operations) for g in connection.call(request).groups]

        # Kafka 4's DescribeConfigs on a group is txbroker's Describe, which Read implies.
        readable = (1 << READ) | (1 << DESCRIBE) | (1 << DESCRIBE_CONFIGS)
        assert describe_groups(True) == (KafkaError.none, readable)
        assert describe_groups(False) == (KafkaError.none, not_asked)
        assert consumer_group_describe(True) == [
            (KafkaError.none, readable | (1 << DELETE)),
            (KafkaError.group_id_not_found, not_asked),
        ]
        assert consumer_group_describe(False)[0] == (KafkaError.none, not_asked)
        raw_groups.consumer_heartbeat(connection, consumer, "ops-member", -1)


def test_deleting_offsets_needs_delete_on_the_group_and_read_on_the_topic(secured):
    """OffsetDelete: without Delete on the group, GROUP_AUTHORIZATION_FAILED for the request; without
    Read on a topic, TOPIC_AUTHORIZATION_FAILED for that topic's partitions only."""
    group = "sasl-offsets"
    with admin_client(secured) as admin:
        offsets = [{"topic": topic, "partition": 0, "offset": 1} for topic in (TOPIC, OTHER_TOPIC)]
        admin.post(f"/v1/groups/{group}/offsets/commit", json={"offsets": offsets}).raise_for_status()
    _, may_delete = new_principal(
        secured, "offsets-deleter", rule("Group", group, "Delete"), rule("Topic", TOPIC, "Read")
    )
    _, may_not = new_principal(secured, "offsets-reader", rule("Group", group, "Read"), rule("Topic", TOPIC, "Read"))

    def offset_delete(username: str, api_key: str):
        partition = nested(api_table.OFFSET_DELETE, 0, "OffsetDeleteRequestPartition", partition_index=0)
        topics = tuple(
            nested(api_table.OFFSET_DELETE, 0, "OffsetDeleteRequestTopic", name=topic, partitions=(partition,))
            for topic in (TOPIC, OTHER_TOPIC)
        )
        with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
            assert log_in(connection, username, api_key).error_code == KafkaError.none
            return connection.call(request_of(api_table.OFFSET_DELETE, 0, group_id=group, topics=topics))

    refused = offset_delete("offsets-reader", may_not)
    assert (refused.error_code, refused.topics) == (KafkaError.group_authorization_failed, ())
    answered = offset_delete("offsets-deleter", may_delete)
    assert answered.error_code == KafkaError.none
    assert [(t.name, t.partitions[0].error_code) for t in answered.topics] == [
        (TOPIC, KafkaError.none),
        (OTHER_TOPIC, KafkaError.topic_authorization_failed),
    ]
    with httpx.Client(base_url=secured.url, headers={"Authorization": f"Bearer {may_delete}"}, timeout=30) as client:
        body = {"partitions": [{"topic": OTHER_TOPIC, "partition": 0}]}
        denied = client.post(f"/v1/groups/{group}/offsets/delete", json=body)
        assert (denied.status_code, denied.json()["error"]["code"]) == (403, "TOPIC_AUTHORIZATION_FAILED")
    with admin_client(secured) as admin:
        left = admin.post(f"/v1/groups/{group}/offsets/fetch", json={"partitions": None}).json()["offsets"]
        assert [(o["topic"], o["offset"]) for o in left] == [(OTHER_TOPIC, 1)]


def test_fetching_offsets_with_require_stable_refuses_a_topic_the_principal_may_not_describe_first(secured):
    """Regression: OffsetFetch with require_stable answered UNSTABLE_OFFSET_COMMIT for a topic the
    principal may not Describe, where it answers TOPIC_AUTHORIZATION_FAILED without require_stable:
    so a principal with only Describe on the group learned that a transaction commits an offset of
    that topic. Kafka's broker asks its group coordinator only about the topics the principal may
    Describe (KafkaApis.fetchOffsetsForGroup): the others are TOPIC_AUTHORIZATION_FAILED either way."""
    group = "sasl-stable"
    _, committer = new_principal(
        secured,
        "stable-committer",
        rule("TransactionalId", "sasl-stable-", "Write", "prefixed"),
        rule("Group", group, "Read"),
        rule("Topic", OTHER_TOPIC, "Read"),
    )
    _, group_only = new_principal(secured, "stable-group-viewer", rule("Group", group, "Describe"))
    _, with_topic = new_principal(
        secured, "stable-topic-viewer", rule("Group", group, "Describe"), rule("Topic", OTHER_TOPIC, "Describe")
    )

    def offset_fetch(username: str, api_key: str, require_stable: bool) -> KafkaError:
        key = api_table.OFFSET_FETCH
        topic = nested(key, 8, "OffsetFetchRequestTopics", name=OTHER_TOPIC, partition_indexes=(0,))
        asked = nested(key, 8, "OffsetFetchRequestGroup", group_id=group, topics=(topic,))
        with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
            assert log_in(connection, username, api_key).error_code == KafkaError.none
            response = connection.call(request_of(key, 8, groups=(asked,), require_stable=require_stable))
        [[[partition]]] = [[t.partitions for t in g.topics] for g in response.groups]
        return partition.error_code

    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, "stable-committer", committer).error_code == KafkaError.none
        producer = raw_transactions.init_producer(connection, "sasl-stable-1")
        assert raw_transactions.add_offsets(connection, producer, group) == KafkaError.none
        assert raw_transactions.txn_offset_commit(connection, producer, group, OTHER_TOPIC, 5) == [KafkaError.none]
        try:
            # The commit awaits its transaction's outcome: a principal that may see the topic is told so.
            assert offset_fetch("stable-topic-viewer", with_topic, True) == KafkaError.unstable_offset_commit
            assert offset_fetch("stable-group-viewer", group_only, False) == KafkaError.topic_authorization_failed
            assert offset_fetch("stable-group-viewer", group_only, True) == KafkaError.topic_authorization_failed
        finally:
            assert raw_transactions.end_txn(connection, producer, False, 3).error_code == KafkaError.none


def test_a_topic_named_by_id_is_refused_without_its_name_to_a_principal_that_may_not_describe_it(secured):
    """Regression: DeleteTopics v6 and Produce v13, which name a topic by its id, refused a topic the
    principal may not Describe with a message naming it, where Metadata by id refuses it without its
    name (the id is no secret, the name may be: Kafka's rule). A principal that may Describe the
    topic is still told its name."""
    with admin_client(secured) as admin:
        topic_id = topic_uuid(admin.get(f"/v1/topics/{OTHER_TOPIC}").json()["topic_id"])
    _, stranger = new_principal(secured, "by-id-stranger")
    _, describer = new_principal(secured, "by-id-describer", rule("Topic", OTHER_TOPIC, "Describe"))
    timeout = datetime.timedelta(seconds=30)

    def refusals(username: str, api_key: str) -> list[tuple[KafkaError, str]]:
        delete = api_table.DELETE_TOPICS
        by_id = nested(delete, 6, "DeleteTopicState", name=None, topic_id=topic_id)
        produce = api_table.PRODUCE
        batch = record_batch([KafkaRecord(1_700_000_000_000, None, b"v", [])])
        partition = nested(produce, 13, "PartitionProduceData", index=0, records=batch)
        with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
            assert log_in(connection, username, api_key).error_code == KafkaError.none
            [deleted] = connection.call(request_of(delete, 6, topics=(by_id,), timeout=timeout)).responses
            [[produced]] = [
                t.partition_responses
                for t in connection.call(
                    request_of(
                        produce,
                        13,
                        transactional_id=None,
                        acks=-1,
                        timeout=timeout,
                        topic_data=(
                            nested(produce, 13, "TopicProduceData", topic_id=topic_id, partition_data=(partition,)),
                        ),
                    )
                ).responses
            ]
        assert deleted.name is None
        return [(deleted.error_code, deleted.error_message), (produced.error_code, produced.error_message)]

    for code, message in refusals("by-id-stranger", stranger):
        assert code == KafkaError.topic_authorization_failed
        assert str(topic_id) in message and OTHER_TOPIC not in message, message
    for code, message in refusals("by-id-describer", describer):
        assert code == KafkaError.topic_authorization_failed
        assert OTHER_TOPIC in message, message
    with admin_client(secured) as admin:
        assert admin.get(f"/v1/topics/{OTHER_TOPIC}").status_code == 200


def test_a_fetch_read_ahead_is_never_answered_once_read_is_revoked(secured):
    """Regression guard: a consumer left behind by its answer has its next Fetch read ahead
    (app/coordinator/fetch.py, ReadAhead), under the authorization of the Fetch before. Read revoked
    in between, that next Fetch is TOPIC_AUTHORIZATION_FAILED with no records, never the batches
    read ahead; given back, the reads go on."""
    topic = "sasl-read-ahead"
    with admin_client(secured) as admin:
        admin.post("/v1/topics", json={"name": topic, "partitions": 1, "config": {}}).raise_for_status()
    _, api_key = new_principal(secured, "read-ahead-reader", rule("Topic", topic, "Write"))

    def grant_read() -> int:
        with admin_client(secured) as admin:
            granted = admin.post("/v1/acls", json={"principal": "read-ahead-reader", **rule("Topic", topic, "Read")})
            return granted.raise_for_status().json()["acl_id"]

    def fetches_read_ahead() -> str:
        with admin_client(secured) as admin:
            metrics = admin.get("/metrics").text
        return re.search(r"^txbroker_kafka_fetches_read_ahead_total (\S+)$", metrics, re.MULTILINE).group(1)

    read_acl = grant_read()
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, "read-ahead-reader", api_key).error_code == KafkaError.none
        read_ahead.produce_batches(connection, topic, 0, [read_ahead.batch_of(v) for v in ("v0", "v1", "v2")])
        for offset in (0, 1):  # the second answered from the read ahead after the first (counted)
            taken_before = fetches_read_ahead()
            answer = read_ahead.fetch_one_batch(secured, connection, topic, offset, version=read_ahead.BY_NAME)
            assert read_ahead.values_of(answer) == [(offset, f"v{offset}".encode())]
            time.sleep(read_ahead.READ_AHEAD_SETTLES_S)  # the next fetch is read ahead meanwhile
        assert fetches_read_ahead() != taken_before
        with admin_client(secured) as admin:
            admin.delete(f"/v1/acls/{read_acl}").raise_for_status()
        taken_before = fetches_read_ahead()
        refused = read_ahead.fetch_one_batch(secured, connection, topic, 2, version=read_ahead.BY_NAME)
        assert (refused.error_code, bytes(refused.records)) == (KafkaError.topic_authorization_failed, b"")
        assert fetches_read_ahead() == taken_before
        grant_read()
        again = read_ahead.fetch_one_batch(secured, connection, topic, 2, version=read_ahead.BY_NAME)
        assert read_ahead.values_of(again) == [(2, b"v2")]


def test_only_its_owner_bumps_an_idempotent_producers_epoch(secured):
    """Regression: any principal, with no ACL at all, could bump the epoch of another principal's
    idempotent producer (InitProducerId with its id and epoch, KIP-360), fencing it on every
    partition: ids are issued in sequence, and the epoch is told by the refusal of a wrong one. A
    producer id is now its principal's: another gets a new id, as Kafka answers every idempotent
    InitProducerId, and the owner's producer writes on; the owner's own bump still bumps."""
    _, owner_key = new_principal(secured, "idempotent-owner", rule("Topic", TOPIC, "Write"))
    _, stranger_key = new_principal(secured, "idempotent-stranger")

    def produce(connection: RawConnection, producer_id: int, epoch: int, sequence: int) -> KafkaError:
        batch = record_batch(
            [KafkaRecord(1_700_000_000_000, None, b"v", [])],
            producer_id=producer_id,
            epoch=epoch,
            base_sequence=sequence,
        )
        return raw_produce.answer_of(connection.call(raw_produce.produce_request(TOPIC, 0, batch)))[0]

    bootstrap = secured.extra["kafka_bootstrap"]
    with RawConnection(bootstrap) as owner, RawConnection(bootstrap) as stranger:
        assert log_in(owner, "idempotent-owner", owner_key).error_code == KafkaError.none
        assert log_in(stranger, "idempotent-stranger", stranger_key).error_code == KafkaError.none
        producer_id, epoch = raw_produce.init_producer(owner)
        assert produce(owner, producer_id, epoch, 0) == KafkaError.none
        for asked_epoch in (epoch, epoch + 1):  # its epoch, and the one a bump would answer
            other_id, other_epoch = raw_produce.init_producer(stranger, producer_id, asked_epoch)
            assert (other_id != producer_id, other_epoch) == (True, 0)
        assert produce(owner, producer_id, epoch, 1) == KafkaError.none
        assert raw_produce.init_producer(owner, producer_id, epoch) == (producer_id, epoch + 1)
        assert produce(owner, producer_id, epoch + 1, 0) == KafkaError.none


# ---- ACLs over Kafka (CreateAcls, DescribeAcls, DeleteAcls): HTTP's /v1/acls rules, one set


def http_rules(server, principal: str) -> list[tuple]:
    with admin_client(server) as admin:
        found = admin.get("/v1/acls", params={"principal": principal}).json()["acls"]
    return [(a["resource_type"], a["pattern_type"], a["resource_name"], a["operation"], a["permission"]) for a in found]


def can_describe(server, username: str, api_key: str, topic: str) -> bool:
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, username, api_key).error_code == KafkaError.none
        return topic_error(connection, topic) == KafkaError.none


def test_confluent_kafka_creates_describes_and_deletes_acls_that_http_shows_and_enforces(secured):
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    _, api_key = new_principal(secured, "acl-target")
    assert not can_describe(secured, "acl-target", api_key, OTHER_TOPIC)
    admin = AdminClient(confluent_config(secured.extra["kafka_bootstrap"], "admin", ADMIN_TOKEN))
    bindings = [
        AclBinding(
            ResourceType.TOPIC,
            OTHER_TOPIC,
            ResourcePatternType.LITERAL,
            "User:acl-target",
            "*",
            AclOperation.DESCRIBE,
            AclPermissionType.ALLOW,
        ),
        AclBinding(
            ResourceType.GROUP,
            "acl-",
            ResourcePatternType.PREFIXED,
            "User:acl-target",
            "*",
            AclOperation.READ,
            AclPermissionType.DENY,
        ),
    ]
    for future in admin.create_acls(bindings, request_timeout=WAIT_S).values():
        assert future.result() is None
    assert http_rules(secured, "acl-target") == [
        ("Topic", "literal", OTHER_TOPIC, "Describe", "allow"),
        ("Group", "prefixed", "acl-", "Read", "deny"),
    ]
    assert can_describe(secured, "acl-target", api_key, OTHER_TOPIC)

    # MATCH: the rules that apply to the group "acl-members" (the prefixed one), none of the topic's.
    matching = AclBindingFilter(
        ResourceType.GROUP,
        "acl-members",
        ResourcePatternType.MATCH,
        None,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    assert admin.describe_acls(matching, request_timeout=WAIT_S).result() == [bindings[1]]

    of_the_topic = AclBindingFilter(
        ResourceType.ANY,
        OTHER_TOPIC,
        ResourcePatternType.ANY,
        "User:acl-target",
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    (deleted,) = admin.delete_acls([of_the_topic], request_timeout=WAIT_S).values()
    assert deleted.result() == [bindings[0]]
    assert http_rules(secured, "acl-target") == [("Group", "prefixed", "acl-", "Read", "deny")]
    assert not can_describe(secured, "acl-target", api_key, OTHER_TOPIC)


def test_kafka_python_creates_describes_and_deletes_acls(secured):
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePattern,
        ResourcePatternFilter,
        ResourceType,
    )

    new_principal(secured, "python-acl")
    acl = ACL(
        principal="User:python-acl",
        host="*",
        operation=ACLOperation.WRITE,
        permission_type=ACLPermissionType.ALLOW,
        resource_pattern=ResourcePattern(ResourceType.TRANSACTIONAL_ID, "python-", ACLResourcePatternType.PREFIXED),
    )
    acl_filter = ACLFilter(
        principal="User:python-acl",
        host="*",
        operation=ACLOperation.ANY,
        permission_type=ACLPermissionType.ANY,
        resource_pattern=ResourcePatternFilter(ResourceType.ANY, None, ACLResourcePatternType.ANY),
    )
    admin = KafkaAdminClient(**python_config(secured.extra["kafka_bootstrap"], "admin", ADMIN_TOKEN))
    try:
        assert admin.create_acls([acl]) == {"succeeded": [acl], "failed": []}
        assert http_rules(secured, "python-acl") == [("TransactionalId", "prefixed", "python-", "Write", "allow")]
        described, _ = admin.describe_acls(acl_filter)
        assert described == [acl]
        ((_, deleted, error),) = admin.delete_acls([acl_filter])
        assert (deleted, error.errno) == ([acl], 0)
        assert admin.describe_acls(acl_filter)[0] == []
    finally:
        admin.close()
    assert http_rules(secured, "python-acl") == []


def every_rule_filter(principal: str | None = None) -> dict:
    """A DescribeAcls / DeleteAcls filter of every rule (of `principal`, "User:NAME", when given)."""
    return dict(
        resource_type_filter=ANY_CODE,
        resource_name_filter=None,
        pattern_type_filter=ANY_CODE,
        principal_filter=principal,
        host_filter=None,
        operation=ANY_CODE,
        permission_type=ANY_CODE,
    )


def describe_acls_of(connection: RawConnection, principal: str | None):
    return connection.call(request_of(api_table.DESCRIBE_ACLS, 3, **every_rule_filter(principal)))


# Kafka's codes: ANY in each enum of a filter; resource types, pattern types, operations, permissions.
ANY_CODE = 1
TOPIC_CODE, CLUSTER_CODE, LITERAL_CODE, PREFIXED_CODE = 2, 4, 3, 4
READ_CODE, ALTER_CODE, DESCRIBE_CODE, DESCRIBE_CONFIGS_CODE, ALLOW_CODE = 3, 7, 8, 10, 3


def test_a_rule_made_over_http_is_described_over_kafka(secured):
    _, api_key = new_principal(
        secured,
        "http-made",
        rule("Cluster", "txbroker-cluster", "Describe"),
        rule("Topic", "http-", "Read", "prefixed"),
    )
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, "http-made", api_key).error_code == KafkaError.none
        described = describe_acls_of(connection, "User:http-made")
    assert described.error_code == KafkaError.none
    assert [
        (
            r.resource_type,
            r.resource_name,
            r.pattern_type,
            [(a.principal, a.host, a.operation, a.permission_type) for a in r.acls],
        )
        for r in described.resources
    ] == [
        (CLUSTER_CODE, "kafka-cluster", LITERAL_CODE, [("User:http-made", "*", DESCRIBE_CODE, ALLOW_CODE)]),
        (TOPIC_CODE, "http-", PREFIXED_CODE, [("User:http-made", "*", READ_CODE, ALLOW_CODE)]),
    ]


def creation(principal: str, host: str = "*", operation: int = READ_CODE, resource_type: int = TOPIC_CODE, name=TOPIC):
    return nested(
        api_table.CREATE_ACLS,
        3,
        "AclCreation",
        resource_type=resource_type,
        resource_name=name,
        resource_pattern_type=LITERAL_CODE,
        principal=principal,
        host=host,
        operation=operation,
        permission_type=ALLOW_CODE,
    )


def test_acl_creations_txbroker_cannot_hold_are_refused_each_with_a_message(secured):
    new_principal(secured, "refused-acl")
    creations = (
        creation("User:refused-acl", host="10.0.0.1"),
        creation("Group:refused-acl"),
        creation("User:refused-acl", operation=DESCRIBE_CONFIGS_CODE),
        creation("User:refused-acl", operation=ALTER_CODE, resource_type=CLUSTER_CODE, name="kafka-cluster"),
    )
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, "admin", ADMIN_TOKEN).error_code == KafkaError.none
        created = connection.call(request_of(api_table.CREATE_ACLS, 3, creations=creations))
    assert [r.error_code for r in created.results] == [KafkaError.invalid_request] * 3 + [KafkaError.none]
    host, principal_type, operation, _ = [r.error_message for r in created.results]
    assert "'10.0.0.1'" in host and "every host" in host
    assert "'Group:refused-acl'" in principal_type and "User:NAME" in principal_type
    assert "DESCRIBE_CONFIGS" in operation
    assert http_rules(secured, "refused-acl") == [("Cluster", "literal", "txbroker-cluster", "Alter", "allow")]


# The longest identifier txbroker stores, an ACL rule's resource name among them (docs/api.md).
MAX_IDENTIFIER_BYTES = 1024


def test_an_acl_resource_name_over_the_identifier_limit_is_refused_as_over_http(secured):
    """The core's ACL addition holds the limit HTTP's /v1/acls answers 400 for (1024 bytes in
    UTF-8): over Kafka that creation alone is INVALID_REQUEST with the message, as Kafka answers
    a creation it refuses (AclControlManager); a name at the limit is created."""
    new_principal(secured, "long-acl")
    at_limit, over_limit = "t" * MAX_IDENTIFIER_BYTES, "\N{GRINNING FACE}" * (MAX_IDENTIFIER_BYTES // 4 + 1)
    creations = (creation("User:long-acl", name=over_limit), creation("User:long-acl", name=at_limit))
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, "admin", ADMIN_TOKEN).error_code == KafkaError.none
        created = connection.call(request_of(api_table.CREATE_ACLS, 3, creations=creations))
    assert [r.error_code for r in created.results] == [KafkaError.invalid_request, KafkaError.none]
    refused = created.results[0].error_message
    assert "resource_name" in refused and f"{len(over_limit.encode())} bytes" in refused
    assert http_rules(secured, "long-acl") == [("Topic", "literal", at_limit, "Read", "allow")]


def test_the_acl_apis_need_alter_or_describe_on_the_cluster(secured):
    """Without Alter on the Cluster nothing is created or deleted (CLUSTER_AUTHORIZATION_FAILED);
    without Describe on it nothing is described; a rule's own principal is no exception."""
    _, api_key = new_principal(secured, "no-cluster-acl", rule("Topic", TOPIC, "All"))
    delete_every_rule = nested(api_table.DELETE_ACLS, 3, "DeleteAclsFilter", **every_rule_filter())
    with admin_client(secured) as admin:
        every_rule = admin.get("/v1/acls").json()["acls"]
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, "no-cluster-acl", api_key).error_code == KafkaError.none
        created = connection.call(request_of(api_table.CREATE_ACLS, 3, creations=(creation("User:no-cluster-acl"),)))
        deleted = connection.call(request_of(api_table.DELETE_ACLS, 3, filters=(delete_every_rule,)))
        described = describe_acls_of(connection, None)
    assert [r.error_code for r in created.results] == [KafkaError.cluster_authorization_failed]
    assert [(r.error_code, r.matching_acls) for r in deleted.filter_results] == [
        (KafkaError.cluster_authorization_failed, ())
    ]
    assert (described.error_code, described.resources) == (KafkaError.cluster_authorization_failed, ())
    with admin_client(secured) as admin:
        assert admin.get("/v1/acls").json()["acls"] == every_rule


def test_a_consumer_group_heartbeat_needs_read_on_the_group_and_describe_on_its_topics(secured, reader):
    """KIP-848's ConsumerGroupHeartbeat: Read on the group, Describe on each topic named; a regular
    expression subscribes the member only to the matching topics its principal may Describe."""
    guarded = topic_uuid(admin_client(secured).get(f"/v1/topics/{TOPIC}").json()["topic_id"])
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, *reader).error_code == KafkaError.none
        denied = raw_groups.consumer_heartbeat(connection, "not-sasl-group", "member-a", 0, [TOPIC])
        assert denied.error_code == KafkaError.group_authorization_failed
        hidden = raw_groups.consumer_heartbeat(connection, f"{GROUP_PREFIX}cgh", "member-a", 0, [OTHER_TOPIC])
        assert hidden.error_code == KafkaError.topic_authorization_failed
        joined = raw_groups.consumer_heartbeat(
            connection, f"{GROUP_PREFIX}cgh", "member-a", 0, [], regex=f"({TOPIC}|{OTHER_TOPIC})"
        )
        assert joined.error_code == KafkaError.none
        # The group resolves the regex after answering the heartbeat that brought it (as Kafka).
        matched = raw_groups.consumer_heartbeat(connection, f"{GROUP_PREFIX}cgh", "member-a", joined.member_epoch)
        assert matched.error_code == KafkaError.none
        assert raw_groups.assigned(matched) == {guarded: [0]}


def test_members_of_one_group_with_different_principals_get_only_the_regex_topics_each_may_describe(secured, reader):
    """The group resolves a regular expression once for all its members (as Kafka's coordinator),
    but members may have different principals: each is only ever assigned the topics its own
    principal may Describe (Kafka filters the resolution with the principal of the member whose
    heartbeat started it, which could give another member a topic it may not Describe, or hide one
    it may). A topic created later is taken as describable by the members that have not heartbeat
    since, and checked against each one's principal at its own heartbeat, before anything of it is
    given to that member."""
    admin = admin_client(secured)
    guarded = topic_uuid(admin.get(f"/v1/topics/{TOPIC}").json()["topic_id"])
    other = topic_uuid(admin.get(f"/v1/topics/{OTHER_TOPIC}").json()["topic_id"])
    wide = new_principal(
        secured,
        "wide-reader",
        rule("Topic", TOPIC, "Read"),
        rule("Topic", OTHER_TOPIC, "Read", "prefixed"),
        rule("Group", GROUP_PREFIX, "Read", "prefixed"),
    )[1]
    group, regex = f"{GROUP_PREFIX}cgh-principals", f"({TOPIC}|{OTHER_TOPIC}.*)"
    with (
        RawConnection(secured.extra["kafka_bootstrap"]) as narrow,
        RawConnection(secured.extra["kafka_bootstrap"]) as broad,
    ):
        assert log_in(narrow, *reader).error_code == KafkaError.none
        assert log_in(broad, "wide-reader", wide).error_code == KafkaError.none
        given = {"narrow": set(), "broad": set()}
        answers = {
            "narrow": raw_groups.consumer_heartbeat(narrow, group, "member-narrow", 0, [], regex=regex),
            "broad": raw_groups.consumer_heartbeat(broad, group, "member-broad", 0, [], regex=regex),
        }
        owned = {"narrow": {}, "broad": {}}

        def heartbeats(rounds: int) -> None:
            for _ in range(rounds):
                for name, connection in (("broad", broad), ("narrow", narrow)):
                    answer = raw_groups.consumer_heartbeat(
                        connection,
                        group,
                        f"member-{name}",
                        answers[name].member_epoch,
                        owned=sorted(owned[name].items()),
                    )
                    assert answer.error_code == KafkaError.none, answer.error_message
                    if answer.assignment is not None:
                        owned[name] = raw_groups.assigned(answer)
                        given[name] |= set(owned[name])
                    answers[name] = answer

        heartbeats(4)
        assert owned == {"narrow": {guarded: [0]}, "broad": {other: [0]}}
        admin.post(
            "/v1/topics", json={"name": f"{OTHER_TOPIC}-later", "partitions": 2, "config": {}}
        ).raise_for_status()
        later = topic_uuid(admin.get(f"/v1/topics/{OTHER_TOPIC}-later").json()["topic_id"])
        heartbeats(5)
        assert owned == {"narrow": {guarded: [0]}, "broad": {other: [0], later: [0, 1]}}
        assert given["narrow"] == {guarded}, "the narrow principal's member was given a topic it may not Describe"
