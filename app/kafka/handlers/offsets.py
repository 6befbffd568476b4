"""ListOffsets: earliest (-2), latest (-1: the high watermark, or the last stable offset under
read_committed), from v7 the record with the greatest timestamp (-3, KIP-734), or the first offset
at or after a time, per partition. As a Kafka broker: another negative timestamp (-3 below v7
included) is UNSUPPORTED_VERSION, and a partition named twice is INVALID_REQUEST, each of its
mentions."""

from __future__ import annotations

import datetime
from collections import Counter

from kio.schema.errors import ErrorCode as KafkaError

from app.errors import BrokerError
from app.kafka import api_table
from app.kafka.broker_calls import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP
from app.kafka.context import RequestContext
from app.kafka.error_codes import kafka_error
from app.kafka.frames import build, response_module

READ_COMMITTED = 1
NO_OFFSET = -1
NO_TIMESTAMP = -1
NO_LEADER_EPOCH = -1
# The negative timestamps served: latest and earliest (the contract's sentinels, HTTP's too), and
# from v7 Kafka's max timestamp.
SERVED_SENTINELS = frozenset({LATEST_TIMESTAMP, EARLIEST_TIMESTAMP})
MAX_TIMESTAMP_SINCE = 7


async def handle(context: RequestContext, request) -> object:
    module = response_module(api_table.LIST_OFFSETS, context.api_version)
    read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    served = SERVED_SENTINELS | ({MAX_TIMESTAMP} if context.api_version >= MAX_TIMESTAMP_SINCE else set())
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
                        context.principal, topic.name, partition.partition_index, partition.timestamp, read_committed
                    )
                    offset, timestamp = listed.offset, listed.timestamp_ms
                except BrokerError as raised:
                    error_code = kafka_error(raised)
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
