"""ListOffsets: earliest (-2), latest (-1: the high watermark, or the last stable offset under
read_committed), from v7 the record with the greatest timestamp (-3, KIP-734), or the first offset
at or after a time, per partition. From v8 the earliest local offset (-4, KIP-405) and from v9 the
latest tiered one (-5, KIP-1005), answered as a Kafka broker without tiered storage answers them:
every record is local, so -4 is the earliest offset, and none is tiered, so -5 is offset -1 (for a
partition that exists). v10's timeout (KIP-1075) bounds reads from remote storage, which there is
none of: it is not needed. As a Kafka broker: another negative timestamp (one below the version
that defines it included) is UNSUPPORTED_VERSION, and a partition named twice is INVALID_REQUEST,
each of its mentions."""

from __future__ import annotations

import datetime
from collections import Counter

from kio.schema.errors import ErrorCode as KafkaError

from app.errors import BrokerError
from app.kafka import api_table
from app.kafka.broker_calls import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP
from app.kafka.context import RequestContext
from app.kafka.error_codes import READ_WHILE_DATABASE_UNAVAILABLE, kafka_error
from app.kafka.frames import build, response_module

READ_COMMITTED = 1
NO_OFFSET = -1
NO_TIMESTAMP = -1
NO_LEADER_EPOCH = -1
EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5
# The negative timestamps served, each from the version that defines it (Kafka's ReplicaManager
# table): latest and earliest (the contract's sentinels, HTTP's too), Kafka's max timestamp, the
# earliest local offset and the latest tiered one.
SENTINELS_SINCE = {
    LATEST_TIMESTAMP: 0,
    EARLIEST_TIMESTAMP: 0,
    MAX_TIMESTAMP: 7,
    EARLIEST_LOCAL_TIMESTAMP: 8,
    LATEST_TIERED_TIMESTAMP: 9,
}
# What the core is asked for each sentinel it has no name for: the earliest offset, the one every
# record is local from. The latest tiered one is asked as it too, so that an unknown or unreadable
# partition gets its error, then answered as untiered.
_ASKED_AS = {EARLIEST_LOCAL_TIMESTAMP: EARLIEST_TIMESTAMP, LATEST_TIERED_TIMESTAMP: EARLIEST_TIMESTAMP}


async def handle(context: RequestContext, request) -> object:
    module = response_module(api_table.LIST_OFFSETS, context.api_version)
    read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    served = {sentinel for sentinel, since in SENTINELS_SINCE.items() if context.api_version >= since}
    named = Counter(
        (topic.name, partition.partition_index) for topic in request.topics for partition in topic.partitions
    )
    topics = []
    for topic in request.topics:
        partitions = []
        for partition in topic.partitions:
            error_code, offset, timestamp = KafkaError.none, NO_OFFSET, NO_TIMESTAMP
            if named[(topic.name, partition.partition_index)] > 1:
                error_code = KafkaError.invalid_request
            elif partition.timestamp < 0 and partition.timestamp not in served:
                error_code = KafkaError.unsupported_version
            else:
                try:
                    listed = await context.calls.list_offset(
                        context.principal,
                        topic.name,
                        partition.partition_index,
                        _ASKED_AS.get(partition.timestamp, partition.timestamp),
                        read_committed,
                    )
                    if partition.timestamp != LATEST_TIERED_TIMESTAMP:
                        offset, timestamp = listed.offset, listed.timestamp_ms
                except BrokerError as raised:
                    error_code = kafka_error(raised, READ_WHILE_DATABASE_UNAVAILABLE)
            partitions.append(
                build(
                    module,
                    "ListOffsetsPartitionResponse",
                    partition_index=partition.partition_index,
                    error_code=error_code,
                    timestamp=timestamp,
                    offset=offset,
                    leader_epoch=NO_LEADER_EPOCH,
                )
            )
        topics.append(build(module, "ListOffsetsTopicResponse", name=topic.name, partitions=tuple(partitions)))
    return build(module, "ListOffsetsResponse", throttle_time=datetime.timedelta(0), topics=tuple(topics))
