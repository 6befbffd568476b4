"""Metadata: every live node on this database as a broker (storage/node_presence.py), this node
the leader of every partition and the controller (any node may lead any partition: they share
PostgreSQL), leader epochs unknown (-1); unknown topics created when the request and the server
allow it."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from app.kafka.context import CLUSTER_ID, RequestContext
from app.kafka.error_codes import kafka_error
from app.kafka.frames import build, response_module

NO_LEADER_EPOCH = -1
# "Authorized operations were not requested" (Kafka's Integer.MIN_VALUE).
OPERATIONS_NOT_REQUESTED = -(2**31)
# Below v4 the request has no flag, and Kafka creates topics as if it were true.
AUTO_CREATE_BEFORE_V4 = True


def _requested_names(request) -> list[str | None] | None:
    """The names asked for; None: every topic (v0: an empty list; v1+: null). A topic asked for
    by id alone (v10+) has no name here: topic_metadata_by_id answers it."""
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
            topic_authorized_operations=OPERATIONS_NOT_REQUESTED,
        )
        for topic in found
    ]
    brokers = tuple(
        build(module, "MetadataResponseBroker", node_id=node.node_id, host=node.host, port=node.port, rack=None)
        for node in await context.calls.live_nodes(context.advertised_host, context.advertised_port)
    )
    return build(
        module,
        "MetadataResponse",
        throttle_time=datetime.timedelta(0),
        brokers=brokers,
        cluster_id=CLUSTER_ID,
        controller_id=context.calls.node_id,
        topics=tuple(topics),
        cluster_authorized_operations=OPERATIONS_NOT_REQUESTED,
        error_code=KafkaError.none,  # v13+: this node never asks a client to re-bootstrap
    )
