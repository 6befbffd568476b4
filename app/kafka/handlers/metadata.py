"""Metadata and DescribeCluster: every live node on this database as a broker
(storage/node_presence.py), this node the controller, the cluster's authorized operations when
asked; Metadata's topics with this node the leader of every partition (any node may lead any
partition: they share PostgreSQL), leader epochs unknown (-1), unknown topics created when the
request and the server allow it, the principal's operations on each topic when asked (v8+).
DescribeCluster serves the brokers' endpoint only (KIP-919): a request for the controllers' (v1+)
is MISMATCHED_ENDPOINT_TYPE, an unknown type UNSUPPORTED_ENDPOINT_TYPE, as a Kafka broker answers."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from app.kafka.broker_calls import LiveNode, TopicMetadata, cluster_operations, topic_operations
from app.kafka.context import CLUSTER_ID, RequestContext
from app.kafka.error_codes import kafka_error
from app.kafka.frames import build, response_module
from app.kafka.handlers.acls import OPERATIONS, OTHER_OPERATIONS

NO_LEADER_EPOCH = -1
# "Authorized operations were not requested" (Kafka's Integer.MIN_VALUE).
OPERATIONS_NOT_REQUESTED = -(2**31)
# Kafka's operation codes by name (its AclOperation), the bits of an authorized operations field.
OPERATION_CODES = {getattr(name, "name", name): code for code, name in {**OPERATIONS, **OTHER_OPERATIONS}.items()}
# DescribeCluster's endpoint types (KIP-919): a broker serves the first.
BROKERS_ENDPOINT, CONTROLLERS_ENDPOINT = 1, 2
NO_CONTROLLER = -1
# Below v4 the request has no flag, and Kafka creates topics as if it were true.
AUTO_CREATE_BEFORE_V4 = True
# v10 and v11 carry a topic id field, yet only v12+ may name a topic by it (KIP-516).
TOPICS_BY_ID_SINCE = 12


def _requested_names(request) -> list[str | None] | None:
    """The names asked for; None: every topic (v0: an empty list; v1+: null). A topic asked for
    by id alone (v10+) has no name here: topic_metadata_by_id answers it."""
    if request.topics is None or (request.__version__ == 0 and not request.topics):
        return None
    return [topic.name for topic in request.topics]


async def _brokers(context: RequestContext, module, class_name: str) -> tuple:
    """The brokers Metadata and DescribeCluster answer (their entries' class `class_name`): every
    live node, rack null; v2 of DescribeCluster: none fenced, as a node is listed while alive."""
    nodes: list[LiveNode] = await context.calls.live_nodes(context.advertised_host, context.advertised_port)
    return tuple(
        build(
            module,
            class_name,
            node_id=node.node_id,  # Metadata's name of the id
            broker_id=node.node_id,  # DescribeCluster's
            host=node.host,
            port=node.port,
            rack=None,
            is_fenced=False,
        )
        for node in nodes
    )


def _operation_bits(names: list[str]) -> int:
    """Kafka's bit set of authorized operations (an operation's code is its bit)."""
    return sum(1 << OPERATION_CODES[name] for name in names)


def _cluster_authorized_operations(context: RequestContext, request) -> int:
    """Kafka's bit set of the principal's operations on the Cluster when the request asks for it
    (Metadata v8-v10, DescribeCluster), else OPERATIONS_NOT_REQUESTED."""
    if not getattr(request, "include_cluster_authorized_operations", False):
        return OPERATIONS_NOT_REQUESTED
    return _operation_bits(cluster_operations(context.principal))


def _topic_authorized_operations(context: RequestContext, request, topic: TopicMetadata) -> int:
    """Kafka's bit set of the principal's operations on the topic when the request asks for it
    (Metadata v8+), else OPERATIONS_NOT_REQUESTED. As Kafka, only for the topics answered by name to
    a principal that may Describe them (an unknown one included): one refused, or asked by an id no
    topic has, keeps the field's default."""
    asked = getattr(request, "include_topic_authorized_operations", False)
    if not asked or topic.name is None or kafka_error(topic.error) == KafkaError.topic_authorization_failed:
        return OPERATIONS_NOT_REQUESTED
    return _operation_bits(topic_operations(context.principal, topic.name))


async def _cluster(context: RequestContext, request, module, broker_class: str) -> dict:
    """What Metadata and DescribeCluster answer of the cluster, in both one way: its brokers, id,
    controller (this node) and the principal's operations on it when asked."""
    return dict(
        brokers=await _brokers(context, module, broker_class),
        cluster_id=CLUSTER_ID,
        controller_id=context.calls.node_id,
        cluster_authorized_operations=_cluster_authorized_operations(context, request),
    )


def _asks_by_id_before_v12(request) -> bool:
    """True for a v10 or v11 request naming a topic by id, or without a name: only v12+ may (a
    v10/v11 answer has no room for a topic without a name), and Kafka refuses it whole."""
    if not 10 <= request.__version__ < TOPICS_BY_ID_SINCE or request.topics is None:
        return False
    return any(topic.name is None or (topic.topic_id is not None and topic.topic_id.int) for topic in request.topics)


def _refused(module, request) -> object:
    """Kafka's answer to a Metadata request it refuses whole: each topic asked, INVALID_REQUEST, with
    no partitions and no brokers (MetadataRequest.getErrorResponse)."""
    topics = tuple(
        build(
            module,
            "MetadataResponseTopic",
            error_code=KafkaError.invalid_request,
            name=topic.name or "",
            topic_id=topic.topic_id,
            is_internal=False,
            partitions=(),
            topic_authorized_operations=OPERATIONS_NOT_REQUESTED,
        )
        for topic in request.topics
    )
    return build(
        module,
        "MetadataResponse",
        throttle_time=datetime.timedelta(0),
        brokers=(),
        cluster_id=None,
        controller_id=NO_CONTROLLER,
        cluster_authorized_operations=OPERATIONS_NOT_REQUESTED,
        topics=topics,
        error_code=KafkaError.none,
    )


async def handle(context: RequestContext, request) -> object:
    module = response_module(api_table.METADATA, context.api_version)
    if _asks_by_id_before_v12(request):
        return _refused(module, request)
    names = _requested_names(request)
    allow_create = getattr(request, "allow_auto_topic_creation", AUTO_CREATE_BEFORE_V4)
    found = await context.calls.topic_metadata(
        context.principal, None if names is None else [name for name in names if name is not None], allow_create
    )
    if names is not None:  # v10+: topics asked by id alone (KIP-516)
        by_id = [topic.topic_id for topic in request.topics if topic.name is None]
        if by_id:
            found += await context.calls.topic_metadata_by_id(context.principal, by_id)
    topics = [
        build(
            module,
            "MetadataResponseTopic",
            error_code=kafka_error(topic.error),
            name=topic.name,
            topic_id=topic.topic_uuid,
            is_internal=topic.is_internal,
            partitions=tuple(
                build(
                    module,
                    "MetadataResponsePartition",
                    error_code=KafkaError.none,
                    partition_index=index,
                    leader_id=context.calls.node_id,
                    leader_epoch=NO_LEADER_EPOCH,
                    replica_nodes=(context.calls.node_id,),
                    isr_nodes=(context.calls.node_id,),
                    offline_replicas=(),
                )
                for index in range(topic.partition_count)
            ),
            topic_authorized_operations=_topic_authorized_operations(context, request, topic),
        )
        for topic in found
    ]
    return build(
        module,
        "MetadataResponse",
        throttle_time=datetime.timedelta(0),
        **await _cluster(context, request, module, "MetadataResponseBroker"),
        topics=tuple(topics),
        error_code=KafkaError.none,  # v13+: this node never asks a client to re-bootstrap
    )


def _endpoint_error(endpoint_type: int) -> tuple[KafkaError, str] | None:
    if endpoint_type == BROKERS_ENDPOINT:
        return None
    if endpoint_type == CONTROLLERS_ENDPOINT:
        return (
            KafkaError.mismatched_endpoint_type,
            f"endpoint type {endpoint_type} (controllers) asked of a broker: txbroker's nodes are brokers only, "
            f"ask for endpoint type {BROKERS_ENDPOINT} (brokers)",
        )
    return (
        KafkaError.unsupported_endpoint_type,
        f"unsupported endpoint type {endpoint_type}: expected {BROKERS_ENDPOINT} (brokers)",
    )


async def describe_cluster(context: RequestContext, request) -> object:
    """DescribeCluster (60): the brokers, cluster id and controller Metadata answers. As Kafka, it
    needs no ACL: without Describe on the Cluster the authorized operations asked for are none (0)."""
    module = response_module(api_table.DESCRIBE_CLUSTER, context.api_version)
    error = _endpoint_error(getattr(request, "endpoint_type", BROKERS_ENDPOINT))  # v0: the brokers'
    if error is None:
        cluster = await _cluster(context, request, module, "DescribeClusterBroker")
    else:  # nothing but the error, as Kafka
        cluster = dict(brokers=(), cluster_id="", controller_id=NO_CONTROLLER)
    error_code, error_message = error or (KafkaError.none, None)
    return build(
        module,
        "DescribeClusterResponse",
        throttle_time=datetime.timedelta(0),
        error_code=error_code,
        error_message=error_message,
        endpoint_type=BROKERS_ENDPOINT,
        **cluster,
    )
