"""Metadata and DescribeCluster: every live node on this database as a broker
(storage/node_presence.py; one that died, a while: cluster_nodes.NodeListing, which DescribeCluster
answers as a fenced broker, only when asked for those), this node the controller, the cluster's
authorized operations when asked; Metadata's topics with each partition led by the live node every
node names alike (ListedNodes.leader: a topic's partitions dealt round-robin over the live nodes; any
node still serves any partition, as they share PostgreSQL), leader epochs unknown (-1), unknown
topics created when the request and the server allow it, the principal's operations on each topic
when asked (v8+).
DescribeCluster serves the brokers' endpoint only (KIP-919): a request for the controllers' (v1+)
is MISMATCHED_ENDPOINT_TYPE, an unknown type UNSUPPORTED_ENDPOINT_TYPE, as a Kafka broker answers.
DescribeTopicPartitions (KIP-966) describes topics as Metadata does, by pages of partitions."""

from __future__ import annotations

import datetime
import uuid

from kio.schema.errors import ErrorCode as KafkaError

from app.errors import DatabaseUnavailable
from app.kafka import api_table
from app.kafka.broker_calls import ListedNodes, LiveNode, TopicMetadata, cluster_operations, topic_operations
from app.kafka.context import CLUSTER_ID, RequestContext
from app.kafka.error_codes import METADATA_WHILE_DATABASE_UNAVAILABLE, closed_when_unconfirmed, kafka_error
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
# DescribeTopicPartitions: at most this many partitions per response whatever the request's limit
# asks (Kafka's max.request.partition.size.limit default), and at least one.
MAX_RESPONSE_PARTITIONS = 2000
# The topic id of a topic answered without one (unknown, refused), as Kafka's Uuid.ZERO_UUID.
NO_TOPIC_ID = uuid.UUID(int=0)


def _requested_names(request) -> list[str | None] | None:
    """The names asked for; None: every topic (v0: an empty list; v1+: null). A topic asked for
    by id alone (v10+) has no name here: topic_metadata_by_id answers it."""
    if request.topics is None or (request.__version__ == 0 and not request.topics):
        return None
    return [topic.name for topic in request.topics]


def _brokers(module, class_name: str, nodes: list[tuple[LiveNode, bool]]) -> tuple:
    """Metadata's or DescribeCluster's brokers (their entries' class `class_name`), each node given
    with whether it is fenced (DescribeCluster v2's is_fenced), rack null, by id."""
    return tuple(
        build(
            module,
            class_name,
            node_id=node.node_id,  # Metadata's name of the id
            broker_id=node.node_id,  # DescribeCluster's
            host=node.host,
            port=node.port,
            rack=None,
            is_fenced=fenced,
        )
        for node, fenced in sorted(nodes)
    )


def _metadata_brokers(module, listing: ListedNodes) -> tuple:
    """Metadata's brokers: every live node, and for kafka_lapsed_node_listed_ms one that died, as
    Kafka lists a dead broker until its controller fences it (librdkafka relies on it: NodeListing).
    Kafka's Metadata never lists a fenced broker; a hung node, fenced by Kafka 9 s after its last
    heartbeat, is listed here for the lapse after that (docs/kafka.md, "A node dies")."""
    return _brokers(module, "MetadataResponseBroker", [(node, False) for node in listing.every])


async def _described_brokers(context: RequestContext, request, module) -> tuple:
    """DescribeCluster's brokers, as Kafka's broker answers them: the unfenced (live) nodes, and with
    v2's include_fenced_brokers (KIP-1073) the fenced ones too, `is_fenced` true: here the nodes
    listed only because their presence lapsed (dead, stopped or hung), which Metadata still lists."""
    listing = await context.listed_nodes()
    fenced = listing.lapsed if getattr(request, "include_fenced_brokers", False) else []
    return _brokers(
        module,
        "DescribeClusterBroker",
        [(node, False) for node in listing.live] + [(node, True) for node in fenced],
    )


def operation_bits(names: list[str]) -> int:
    """Kafka's bit set of authorized operations (an operation's code is its bit)."""
    return sum(1 << OPERATION_CODES[name] for name in names)


def _cluster_authorized_operations(context: RequestContext, request) -> int:
    """Kafka's bit set of the principal's operations on the Cluster when the request asks for it
    (Metadata v8-v10, DescribeCluster), else OPERATIONS_NOT_REQUESTED."""
    if not getattr(request, "include_cluster_authorized_operations", False):
        return OPERATIONS_NOT_REQUESTED
    return operation_bits(cluster_operations(context.principal))


def _topic_authorized_operations(context: RequestContext, request, topic: TopicMetadata) -> int:
    """Kafka's bit set of the principal's operations on the topic when the request asks for it
    (Metadata v8+), else OPERATIONS_NOT_REQUESTED. As Kafka, only for the topics answered by name to
    a principal that may Describe them (an unknown one included): one refused, or asked by an id no
    topic has, keeps the field's default."""
    asked = getattr(request, "include_topic_authorized_operations", False)
    if not asked or topic.name is None or kafka_error(topic.error) == KafkaError.topic_authorization_failed:
        return OPERATIONS_NOT_REQUESTED
    return operation_bits(topic_operations(context.principal, topic.name))


def _cluster(context: RequestContext, request, brokers: tuple) -> dict:
    """What Metadata and DescribeCluster answer of the cluster, in both one way: its brokers (each
    API's own), id, controller (this node) and the principal's operations on it when asked."""
    return dict(
        brokers=brokers,
        cluster_id=CLUSTER_ID,
        controller_id=context.calls.node_id,
        cluster_authorized_operations=_cluster_authorized_operations(context, request),
    )


def _partition(module, class_name: str, listing: ListedNodes, topic: str, index: int) -> object:
    """A partition as Metadata and DescribeTopicPartitions describe it: led by the live node every
    node names (ListedNodes.leader: a function of the partition and the live nodes, so that each
    node answers the same leader, as Kafka's brokers do), its one replica and in-sync replica; no
    eligible leader replicas (KIP-966: a partition of one replica has none to elect from), none
    offline."""
    leader = listing.leader(topic, index)
    return build(
        module,
        class_name,
        error_code=KafkaError.none,
        partition_index=index,
        leader_id=leader,
        leader_epoch=NO_LEADER_EPOCH,
        replica_nodes=(leader,),
        isr_nodes=(leader,),
        eligible_leader_replicas=(),
        last_known_elr=(),
        offline_replicas=(),
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
    # Every topic, unconfirmed by the synchronous standby: no topic to answer LEADER_NOT_AVAILABLE on,
    # and a list without the topics would be taken for their deletion (a pattern subscription's).
    with closed_when_unconfirmed("Metadata of every topic"):
        found = await context.calls.topic_metadata(
            context.principal,
            context.client_address,
            None if names is None else [name for name in names if name is not None],
            allow_create,
        )
    if names is not None:  # v10+: topics asked by id alone (KIP-516)
        by_id = [topic.topic_id for topic in request.topics if topic.name is None]
        if by_id:
            found += await context.calls.topic_metadata_by_id(context.principal, by_id)
    listing = await context.listed_nodes()
    topics = [
        build(
            module,
            "MetadataResponseTopic",
            error_code=kafka_error(topic.error, METADATA_WHILE_DATABASE_UNAVAILABLE),
            name=topic.name,
            topic_id=topic.topic_uuid,
            is_internal=topic.is_internal,
            partitions=tuple(
                _partition(module, "MetadataResponsePartition", listing, topic.name, index)
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
        **_cluster(context, request, _metadata_brokers(module, listing)),
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
    """DescribeCluster (60): the cluster id and controller Metadata answers, and its brokers but the
    lapsed nodes, Kafka's fenced brokers, which only v2's include_fenced_brokers asks for (flagged
    is_fenced: _described_brokers). As Kafka, it needs no ACL: without Describe on the Cluster the
    authorized operations asked for are none (0)."""
    module = response_module(api_table.DESCRIBE_CLUSTER, context.api_version)
    error = _endpoint_error(getattr(request, "endpoint_type", BROKERS_ENDPOINT))  # v0: the brokers'
    if error is None:
        cluster = _cluster(context, request, await _described_brokers(context, request, module))
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


def _java_order(name: str) -> bytes:
    """The key that orders topic names as Kafka's broker compares them (Java's String.compareTo, by
    UTF-16 code unit): pages follow that order, and a cursor names where the next one starts."""
    return name.encode("utf-16-be", "surrogatepass")


def _page_topic(
    module, topic: TopicMetadata, partitions: tuple = (), operations: int = OPERATIONS_NOT_REQUESTED, error=None
) -> object:
    return build(
        module,
        "DescribeTopicPartitionsResponseTopic",
        error_code=kafka_error(topic.error) if error is None else error,
        name=topic.name,
        topic_id=topic.topic_uuid or NO_TOPIC_ID,
        is_internal=topic.is_internal,
        partitions=partitions,
        topic_authorized_operations=operations,
    )


def _page(module, topics: list, next_cursor=None) -> object:
    return build(
        module,
        "DescribeTopicPartitionsResponse",
        throttle_time=datetime.timedelta(0),
        topics=tuple(topics),
        next_cursor=next_cursor,
    )


def _cursor_refused(request) -> bool:
    """Whether Kafka refuses the request whole (INVALID_REQUEST, the response having no room for a
    message): its cursor names a topic the request does not ask for, or a negative partition."""
    cursor = request.cursor
    if cursor is None:
        return False
    named = {topic.name for topic in request.topics}
    return (bool(named) and cursor.topic_name not in named) or cursor.partition_index < 0


async def describe_topic_partitions(context: RequestContext, request) -> object:
    """DescribeTopicPartitions (75, KIP-966): the topics named (none named: every topic the principal
    may Describe), from the cursor's topic and partition on, in Kafka's order of names, at most
    `response_partition_limit` partitions (within 1..MAX_RESPONSE_PARTITIONS); where the page ends
    inside the topics asked, `next_cursor` says where the next starts. As Kafka's broker: a named
    topic the principal may not Describe is TOPIC_AUTHORIZATION_FAILED (after the others, without
    its id), one that does not exist UNKNOWN_TOPIC_OR_PARTITION (INVALID_TOPIC_EXCEPTION for a name
    no topic could have); each topic answered has the principal's authorized operations (the
    request has no flag: Kafka always answers them); a cursor outside the topics asked, or with a
    negative partition, refuses the request whole (each topic INVALID_REQUEST)."""
    module = response_module(api_table.DESCRIBE_TOPIC_PARTITIONS, context.api_version)
    if _cursor_refused(request):
        return _page(
            module,
            [
                _page_topic(module, TopicMetadata(topic.name, None), error=KafkaError.invalid_request)
                for topic in request.topics
            ],
        )
    cursor = request.cursor
    first = "" if cursor is None else cursor.topic_name
    names = None
    if request.topics:
        names = sorted({t.name for t in request.topics if _java_order(t.name) >= _java_order(first)}, key=_java_order)
    # Kafka's admin client hands a topic's error to its caller: one unconfirmed by the synchronous
    # standby closes the connection instead, and the client asks again.
    with closed_when_unconfirmed("DescribeTopicPartitions"):
        found = await context.calls.topic_metadata(context.principal, context.client_address, names, False)
        unconfirmed = next((t.error for t in found if isinstance(t.error, DatabaseUnavailable)), None)
        if unconfirmed is not None:
            raise unconfirmed
    if names is None:
        found = sorted(
            (t for t in found if _java_order(t.name) >= _java_order(first)), key=lambda t: _java_order(t.name)
        )
    refused = [t for t in found if kafka_error(t.error) == KafkaError.topic_authorization_failed]
    listing = await context.listed_nodes()
    remaining = max(min(MAX_RESPONSE_PARTITIONS, request.response_partition_limit), 1)
    answered, next_cursor = [], None
    for topic in (t for t in found if t not in refused):
        if remaining == 0:  # the page is full: the next one starts at this topic
            next_cursor = build(module, "Cursor", topic_name=topic.name, partition_index=0)
            break
        start = cursor.partition_index if cursor is not None and topic.name == first else 0
        end = min(topic.partition_count, start + remaining)
        partitions = tuple(
            _partition(module, "DescribeTopicPartitionsResponsePartition", listing, topic.name, index)
            for index in range(start, end)
        )
        operations = operation_bits(topic_operations(context.principal, topic.name))
        answered.append(_page_topic(module, topic, partitions, operations))
        if end < topic.partition_count:
            next_cursor = build(module, "Cursor", topic_name=topic.name, partition_index=end)
            break
        remaining -= len(partitions)
    answered += [_page_topic(module, topic) for topic in refused]  # without an id, as Kafka's broker
    return _page(module, answered, next_cursor)
