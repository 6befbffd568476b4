"""OffsetCommit, OffsetFetch and OffsetDelete: a group's committed offsets, the one set both doors
read and write (HTTP's /v1/groups/{group_id}/offsets). OffsetFetch with require_stable answers
UNSTABLE_OFFSET_COMMIT for a partition whose transactional commit awaits its marker. The v9s of
OffsetCommit and OffsetFetch are KIP-848's, whose member epochs only its consumer groups check
(app/coordinator/consumer_groups.py: STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID); for a classic group v9
is served as v8, but for OffsetCommit's GROUP_ID_NOT_FOUND (as Kafka's group coordinator): a commit
naming a generation of a group that does not exist, which the versions below answer
ILLEGAL_GENERATION.

Each offset keeps the leader epoch its commit carried, as Kafka's group coordinator keeps it:
OffsetCommit sends one from v6 (older versions store NO_LEADER_EPOCH, the field's default) and
OffsetFetch returns it from v5; a partition without an offset, or refused, reads NO_LEADER_EPOCH
and NO_METADATA."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode as KafkaError

from app.errors import BrokerError, ErrorCode
from app.kafka import api_table
from app.kafka.context import RequestContext
from app.kafka.error_codes import kafka_error
from app.kafka.frames import build, response_module
from txbroker.wire import NO_LEADER_EPOCH

NO_THROTTLE = datetime.timedelta(0)
NO_OFFSET = -1
# Kafka's OffsetFetchResponse.NO_METADATA: its group coordinator stores a commit's null metadata as ""
# and answers "" for a partition without an offset or with an error, never null (KafkaJS's own
# broker test expects ""). HTTP's offsets keep their null.
NO_METADATA = ""
# OffsetCommit v9+: a generation of a group that does not exist is GROUP_ID_NOT_FOUND; below,
# ILLEGAL_GENERATION, kept for older clients (Kafka's OffsetMetadataManager.validateOffsetCommit).
GROUP_ID_NOT_FOUND_SINCE = 9


async def offset_commit(context: RequestContext, request) -> object:
    module = response_module(api_table.OFFSET_COMMIT, context.api_version)
    entries = [
        (
            topic.name,
            p.partition_index,
            p.committed_offset,
            p.committed_metadata,
            getattr(p, "committed_leader_epoch", NO_LEADER_EPOCH),  # v6+
        )
        for topic in request.topics
        for p in topic.partitions
    ]
    try:
        errors = await context.calls.groups.commit_offsets(
            context.principal,
            request.group_id,
            request.member_id,
            request.generation_id_or_member_epoch,
            entries,
            getattr(request, "group_instance_id", None),
            unknown_group_error=(
                ErrorCode.GROUP_ID_NOT_FOUND
                if context.api_version >= GROUP_ID_NOT_FOUND_SINCE
                else ErrorCode.ILLEGAL_GENERATION
            ),
        )
    except BrokerError as raised:
        errors = [raised] * len(entries)
    return build(
        module,
        "OffsetCommitResponse",
        throttle_time=NO_THROTTLE,
        topics=_answered_topics(module, "OffsetCommit", request.topics, errors),
    )


def _answered_topics(module, api_name: str, topics, errors: list) -> tuple:
    """The response's topics of an API answering each requested partition with its error
    (`{api_name}ResponseTopic`, `{api_name}ResponsePartition`), `errors` in the request's order:
    as Kafka's group coordinator, each mention of a partition named more than once is answered
    with its own (an OffsetCommit stores each mention's offset in turn: the last one stays)."""
    answered = iter(errors)
    return tuple(
        build(
            module,
            f"{api_name}ResponseTopic",
            name=topic.name,
            partitions=tuple(
                build(
                    module,
                    f"{api_name}ResponsePartition",
                    partition_index=p.partition_index,
                    error_code=kafka_error(next(answered)),
                )
                for p in topic.partitions
            ),
        )
        for topic in topics
    )


async def _group_offsets(
    context: RequestContext, module, group_id: str, topics, require_stable: bool, names, member=(None, -1)
):
    """(topics, error) of one group, in the version's class names (v8+ renamed them). `member`: v9's
    member id and epoch (a KIP-848 consumer group's member's, checked; (None, -1): an admin's)."""
    topic_class, partition_class = names
    partitions = None if topics is None else [(t.name, int(p)) for t in topics for p in t.partition_indexes]
    try:
        found = await context.calls.groups.fetch_offsets(
            context.principal, group_id, partitions, require_stable, *member
        )
    except BrokerError as raised:
        return (), kafka_error(raised)
    by_topic: dict[str, list] = {}
    for committed, error in found:
        by_topic.setdefault(committed.topic, []).append(
            build(
                module,
                partition_class,
                partition_index=committed.partition,
                committed_offset=committed.offset if error is None else NO_OFFSET,
                committed_leader_epoch=committed.leader_epoch if error is None else NO_LEADER_EPOCH,
                metadata=NO_METADATA if error is not None or committed.metadata is None else committed.metadata,
                error_code=kafka_error(error),
            )
        )
    return (
        tuple(build(module, topic_class, name=name, partitions=tuple(parts)) for name, parts in by_topic.items()),
        KafkaError.none,
    )


async def offset_fetch(context: RequestContext, request) -> object:
    module = response_module(api_table.OFFSET_FETCH, context.api_version)
    require_stable = getattr(request, "require_stable", False)
    groups = getattr(request, "groups", None)
    if groups is None:  # v1-v7: one group
        topics, error = await _group_offsets(
            context,
            module,
            request.group_id,
            request.topics,
            require_stable,
            ("OffsetFetchResponseTopic", "OffsetFetchResponsePartition"),
        )
        return build(module, "OffsetFetchResponse", throttle_time=NO_THROTTLE, topics=topics, error_code=error)
    answered = []
    for group in groups:
        topics, error = await _group_offsets(
            context,
            module,
            group.group_id,
            group.topics,
            require_stable,
            ("OffsetFetchResponseTopics", "OffsetFetchResponsePartitions"),
            (getattr(group, "member_id", None), getattr(group, "member_epoch", -1)),  # v9+
        )
        answered.append(
            build(module, "OffsetFetchResponseGroup", group_id=group.group_id, topics=topics, error_code=error)
        )
    return build(module, "OffsetFetchResponse", throttle_time=NO_THROTTLE, groups=tuple(answered))


async def offset_delete(context: RequestContext, request) -> object:
    """A group-level error (GROUP_AUTHORIZATION_FAILED, GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP) answers
    the request with no topics, as Kafka; otherwise each partition has its own error."""
    module = response_module(api_table.OFFSET_DELETE, context.api_version)
    partitions = [(topic.name, p.partition_index) for topic in request.topics for p in topic.partitions]
    try:
        errors = await context.calls.groups.delete_offsets(
            context.principal, context.client_address, request.group_id, partitions
        )
    except BrokerError as raised:
        return build(
            module, "OffsetDeleteResponse", error_code=kafka_error(raised), throttle_time=NO_THROTTLE, topics=()
        )
    return build(
        module,
        "OffsetDeleteResponse",
        error_code=KafkaError.none,
        throttle_time=NO_THROTTLE,
        topics=_answered_topics(module, "OffsetDelete", request.topics, errors),
    )
