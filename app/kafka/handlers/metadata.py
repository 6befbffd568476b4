"""Metadata: this node as the only broker (NODE_ID) and the leader of every partition, leader
epochs unknown (-1); unknown topics created when the request and the server allow it."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from app.kafka.context import CLUSTER_ID, NODE_ID, RequestContext
from app.kafka.error_codes import kafka_error
from app.kafka.frames import build, response_module

NO_LEADER_EPOCH = -1
# "Authorized operations were not requested" (Kafka's Integer.MIN_VALUE).
OPERATIONS_NOT_REQUESTED = -(2**31)
# Below v4 the request has no flag, and Kafka creates topics as if it were true.
AUTO_CREATE_BEFORE_V4 = True


def _requested_names(request) -> list[str | None] | None:
    """The names asked for; None: every topic (v0: an empty list; v1+: null). A topic asked for
    by id alone (v10+) has no name here."""
    if request.topics is None or (request.__version__ == 0 and not request.topics):
        return None
    return [topic.name for topic in request.topics]


async def handle(context: RequestContext, request) -> object:
    module = response_module(api_table.METADATA, context.api_version)
    names = _requested_names(request)
    allow_create = getattr(request, "allow_auto_topic_creation", AUTO_CREATE_BEFORE_V4)
    found = await context.calls.topic_metadata(
        context.principal, None if names is None else [name for name in names if name is not None], allow_create
    )
    topics = [
        build(
            module,
            "MetadataResponseTopic",
            error_code=kafka_error(topic.error),
            name=topic.name,
            topic_id=None,
            is_internal=topic.is_internal,
            partitions=tuple(
                build(
                    module,
                    "MetadataResponsePartition",
                    error_code=KafkaError.none,
                    partition_index=index,
                    leader_id=NODE_ID,
                    leader_epoch=NO_LEADER_EPOCH,
                    replica_nodes=(NODE_ID,),
                    isr_nodes=(NODE_ID,),
                    offline_replicas=(),
                )
                for index in range(topic.partition_count)
            ),
            topic_authorized_operations=OPERATIONS_NOT_REQUESTED,
        )
        for topic in found
    ]
    if names is not None:
        topics += [
            build(
                module,
                "MetadataResponseTopic",
                error_code=KafkaError.unknown_topic_id,
                name=None,
                topic_id=topic.topic_id,
                partitions=(),
                topic_authorized_operations=OPERATIONS_NOT_REQUESTED,
            )
            for topic in request.topics
            if topic.name is None
        ]
    broker = build(
        module,
        "MetadataResponseBroker",
        node_id=NODE_ID,
        host=context.advertised_host,
        port=context.advertised_port,
        rack=None,
    )
    return build(
        module,
        "MetadataResponse",
        throttle_time=datetime.timedelta(0),
        brokers=(broker,),
        cluster_id=CLUSTER_ID,
        controller_id=NODE_ID,
        topics=tuple(topics),
        cluster_authorized_operations=OPERATIONS_NOT_REQUESTED,
    )
