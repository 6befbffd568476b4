"""DescribeCluster (60): the brokers, cluster id and controller Metadata answers, to confluent-kafka's
`describe_cluster`, kafka-python's and to each version raw; the cluster's authorized operations when asked (also
Metadata v8-v10's), and Metadata v8+'s topics' (confluent-kafka's `describe_topics`); the brokers'
endpoint only. With several nodes: test_nodes.py; a principal's authorized operations: test_security.py."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient
from kafka.admin import KafkaAdminClient
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.kafka.clients import WAIT_S, create_topic
from tests.kafka.raw import RawConnection, nested, request_of

NOT_REQUESTED = -(2**31)
# Kafka's operations on the Cluster (AclEntry.supportedOperations(CLUSTER)): what a super user, as
# every caller is with auth off, may do.
CLUSTER_OPERATIONS = {
    AclOperation.CREATE,
    AclOperation.ALTER,
    AclOperation.DESCRIBE,
    AclOperation.CLUSTER_ACTION,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
    AclOperation.IDEMPOTENT_WRITE,
}
CLUSTER_OPERATION_BITS = sum(1 << operation.value for operation in CLUSTER_OPERATIONS)
# Kafka's operations on a Topic (AclEntry.supportedOperations(TOPIC)).
TOPIC_OPERATIONS = {
    AclOperation.READ,
    AclOperation.WRITE,
    AclOperation.CREATE,
    AclOperation.DESCRIBE,
    AclOperation.DELETE,
    AclOperation.ALTER,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
}
TOPIC_OPERATION_BITS = sum(1 << operation.value for operation in TOPIC_OPERATIONS)
VERSIONS = list(api_table.SUPPORTED_VERSIONS[api_table.DESCRIBE_CLUSTER])


def describe_cluster(bootstrap: str, version: int, asked: bool = False, endpoint_type: int = 1):
    with RawConnection(bootstrap) as connection:
        return connection.call(
            request_of(
                api_table.DESCRIBE_CLUSTER,
                version,
                include_cluster_authorized_operations=asked,
                endpoint_type=endpoint_type,
                include_fenced_brokers=False,
            )
        )


def metadata(bootstrap: str, version: int = 12, asked: bool = False, topics=(), topics_asked: bool = False):
    with RawConnection(bootstrap) as connection:
        return connection.call(
            request_of(
                api_table.METADATA,
                version,
                topics=tuple(
                    nested(api_table.METADATA, version, "MetadataRequestTopic", name=name, topic_id=None)
                    for name in topics
                ),
                allow_auto_topic_creation=False,
                include_cluster_authorized_operations=asked,
                include_topic_authorized_operations=topics_asked,
            )
        )


def cluster_of(response) -> tuple:
    """(cluster id, controller id, brokers as (id, host, port, rack)) of Metadata or DescribeCluster."""
    brokers = [(getattr(b, "broker_id", getattr(b, "node_id", None)), b.host, b.port, b.rack) for b in response.brokers]
    return response.cluster_id, response.controller_id, sorted(brokers)


@pytest.fixture(scope="module")
def bootstrap(module_kafka_server) -> str:
    return module_kafka_server.extra["kafka_bootstrap"]


def test_confluent_describe_cluster_answers_what_metadata_does(bootstrap):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_cluster(request_timeout=WAIT_S).result(timeout=WAIT_S)
    with_operations = admin.describe_cluster(include_authorized_operations=True, request_timeout=WAIT_S).result(
        timeout=WAIT_S
    )
    cluster_id, controller_id, brokers = cluster_of(metadata(bootstrap))
    assert described.cluster_id == cluster_id == "txbroker"
    assert described.controller.id == controller_id
    assert sorted((n.id, n.host, n.port, n.rack) for n in described.nodes) == brokers
    assert described.authorized_operations is None
    assert with_operations.cluster_id == cluster_id
    assert set(with_operations.authorized_operations) == CLUSTER_OPERATIONS


def test_kafka_python_describe_cluster_answers_what_metadata_does(bootstrap):
    """kafka-python 3's `describe_cluster` sends DescribeCluster (asking for the operations) when offered."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = admin.describe_cluster()
    finally:
        admin.close()
    cluster_id, controller_id, brokers = cluster_of(metadata(bootstrap))
    assert (described["cluster_id"], described["controller_id"]) == (cluster_id, controller_id)
    assert sorted((b["broker_id"], b["host"], b["port"], b["rack"]) for b in described["brokers"]) == brokers
    assert set(described["authorized_operations"]) == {operation.name for operation in CLUSTER_OPERATIONS}


@pytest.mark.parametrize("version", VERSIONS)
def test_each_version_answers_metadatas_brokers_and_the_operations_when_asked(bootstrap, version):
    expected = cluster_of(metadata(bootstrap))
    for asked, operations in ((False, NOT_REQUESTED), (True, CLUSTER_OPERATION_BITS)):
        response = describe_cluster(bootstrap, version, asked)
        assert (response.error_code, response.error_message) == (KafkaError.none, None)
        assert cluster_of(response) == expected
        assert response.cluster_authorized_operations == operations
        assert getattr(response, "endpoint_type", 1) == 1
        assert all(not getattr(broker, "is_fenced", False) for broker in response.brokers)


@pytest.mark.parametrize(
    ("endpoint_type", "error"),
    [(2, KafkaError.mismatched_endpoint_type), (0, KafkaError.unsupported_endpoint_type)],
    ids=["controllers", "unknown"],
)
def test_only_the_brokers_endpoint_is_described(bootstrap, endpoint_type, error):
    response = describe_cluster(bootstrap, 1, endpoint_type=endpoint_type)
    assert response.error_code == error
    assert f"endpoint type {endpoint_type}" in response.error_message
    assert response.brokers == ()


@pytest.mark.parametrize("version", [8, 9, 10])
def test_metadata_answers_the_clusters_operations_when_asked(bootstrap, version):
    assert metadata(bootstrap, version, asked=True).cluster_authorized_operations == CLUSTER_OPERATION_BITS
    assert metadata(bootstrap, version).cluster_authorized_operations == NOT_REQUESTED


def test_confluent_describe_topics_answers_every_topic_operation_without_auth(module_kafka_server, bootstrap):
    """With auth off every caller may do everything, as a Kafka broker without an authorizer
    answers every operation a topic supports."""
    create_topic(module_kafka_server, "operations-described")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    collection = TopicCollection(["operations-described"])
    asked = admin.describe_topics(collection, include_authorized_operations=True)["operations-described"]
    not_asked = admin.describe_topics(collection)["operations-described"]
    assert set(asked.result(WAIT_S).authorized_operations) == TOPIC_OPERATIONS
    assert not_asked.result(WAIT_S).authorized_operations is None


def test_kafka_python_describe_topics_answers_every_topic_operation_without_auth(module_kafka_server, bootstrap):
    """kafka-python 3's `describe_topics` always asks (Metadata v12), and names the operations."""
    create_topic(module_kafka_server, "operations-python")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        (described,) = admin.describe_topics(["operations-python"])
    finally:
        admin.close()
    assert set(described["authorized_operations"]) == {operation.name for operation in TOPIC_OPERATIONS}


@pytest.mark.parametrize("version", range(8, 14))
def test_metadata_answers_each_topics_operations_when_asked(module_kafka_server, bootstrap, version):
    """From v8, known topics and unknown ones alike (as Kafka: any topic the principal may Describe)."""
    known = f"operations-raw-v{version}"
    create_topic(module_kafka_server, known)
    topics = (known, "operations-unknown")
    asked = metadata(bootstrap, version, topics=topics, topics_asked=True).topics
    assert [(t.name, t.topic_authorized_operations) for t in asked] == [
        (known, TOPIC_OPERATION_BITS),
        ("operations-unknown", TOPIC_OPERATION_BITS),
    ]
    assert asked[1].error_code == KafkaError.unknown_topic_or_partition
    not_asked = metadata(bootstrap, version, topics=topics).topics
    assert [t.topic_authorized_operations for t in not_asked] == [NOT_REQUESTED, NOT_REQUESTED]
