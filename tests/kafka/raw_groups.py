"""Raw requests of the classic group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit, OffsetFetch, DescribeGroups), every field the test's: for the rules clients do not show."""

from __future__ import annotations

import datetime
import io
import threading

from kio.schema.consumer_protocol_assignment.v0.data import ConsumerProtocolAssignment, TopicPartition
from kio.serial import entity_writer

from app.kafka import api_table
from tests.kafka.raw import RawConnection, by_topic, nested, request_of

JOIN_VERSION = 9
SHORT = datetime.timedelta(milliseconds=1500)
LONG = datetime.timedelta(seconds=30)


def join_request(
    group: str,
    member: str = "",
    session=LONG,
    rebalance=SHORT,
    instance: str | None = None,
    metadata: bytes = b"",
    version: int = JOIN_VERSION,
):
    """`join`'s request, for a test that sends it and takes its answer later."""
    protocol = nested(api_table.JOIN_GROUP, version, "JoinGroupRequestProtocol", name="range", metadata=metadata)
    return request_of(
        api_table.JOIN_GROUP,
        version,
        group_id=group,
        session_timeout=session,
        rebalance_timeout=rebalance,
        member_id=member,
        group_instance_id=instance,
        protocol_type="consumer",
        protocols=(protocol,),
        reason=None,
    )


def join(connection, group: str, member: str = "", **request):
    return connection.call(join_request(group, member, **request))


def sync(connection, *request, **named):
    """SyncGroup v5 (`sync_request`'s arguments), its answer."""
    return connection.call(sync_request(*request, **named))


def sync_request(
    group: str,
    member: str,
    generation: int,
    assignments: dict[str, bytes],
    instance=None,
    protocol_type: str | None = "consumer",
    protocol_name: str | None = "range",
):
    """SyncGroup v5, naming the group's protocol type and name unless told (None: not named); for a
    test that sends it and takes its answer later."""
    return request_of(
        api_table.SYNC_GROUP,
        5,
        group_id=group,
        generation_id=generation,
        member_id=member,
        group_instance_id=instance,
        protocol_type=protocol_type,
        protocol_name=protocol_name,
        assignments=tuple(
            nested(api_table.SYNC_GROUP, 5, "SyncGroupRequestAssignment", member_id=m, assignment=a)
            for m, a in assignments.items()
        ),
    )


def heartbeat(connection, group: str, member: str, generation: int, instance: str | None = None):
    return connection.call(
        request_of(
            api_table.HEARTBEAT,
            4,
            group_id=group,
            generation_id=generation,
            member_id=member,
            group_instance_id=instance,
        )
    )


def leave_answer(connection, group: str, members: list[tuple[str, str | None]]):
    """LeaveGroup v5: each (member id, group instance id); its whole response."""
    return connection.call(
        request_of(
            api_table.LEAVE_GROUP,
            5,
            group_id=group,
            members=tuple(
                nested(api_table.LEAVE_GROUP, 5, "MemberIdentity", member_id=m, group_instance_id=i, reason=None)
                for m, i in members
            ),
        )
    )


def leave(connection, group: str, members: list[tuple[str, str | None]]):
    """LeaveGroup v5: each (member id, group instance id); its per-member error codes."""
    return [m.error_code for m in leave_answer(connection, group, members).members]


def commit(
    connection,
    group: str,
    member: str,
    generation: int,
    instance: str | None,
    topic: str,
    offset: int,
    version: int = 8,
    leader_epoch: int = -1,
):
    """OffsetCommit (v8 unless told) of partition 0; its error code. `leader_epoch` is sent from v6."""
    [error] = commit_partitions(
        connection, group, member, generation, instance, [(topic, 0)], offset, version, leader_epoch
    )
    return error


def commit_partitions(
    connection,
    group: str,
    member: str,
    generation: int,
    instance: str | None,
    partitions: list[tuple[str, int]],
    offset: int,
    version: int = 8,
    leader_epoch: int = -1,
) -> list[int]:
    """OffsetCommit (v8 unless told) of `offset` for each (topic, partition), each topic once (in the
    order first named) with its partitions; the error codes in the response's order."""
    key = api_table.OFFSET_COMMIT
    topics = tuple(
        nested(
            key,
            version,
            "OffsetCommitRequestTopic",
            name=topic,
            partitions=tuple(
                nested(
                    key,
                    version,
                    "OffsetCommitRequestPartition",
                    partition_index=index,
                    committed_offset=offset,
                    committed_leader_epoch=leader_epoch,
                    committed_metadata=None,
                )
                for index in indexes
            ),
        )
        for topic, indexes in by_topic(partitions).items()
    )
    response = connection.call(
        request_of(
            key,
            version,
            group_id=group,
            generation_id_or_member_epoch=generation,
            member_id=member,
            group_instance_id=instance,
            topics=topics,
        )
    )
    return [p.error_code for t in response.topics for p in t.partitions]


def fetch_offsets(connection, group: str, partitions: list[tuple[str, int]], version: int = 7):
    """OffsetFetch (v1-v7: one group) of each (topic, partition), each topic once (in the order first
    named) with its partitions: the response."""
    key = api_table.OFFSET_FETCH
    return connection.call(
        request_of(
            key,
            version,
            group_id=group,
            topics=tuple(
                nested(key, version, "OffsetFetchRequestTopic", name=topic, partition_indexes=tuple(indexes))
                for topic, indexes in by_topic(partitions).items()
            ),
            require_stable=False,
        )
    )


def describe(connection, group: str):
    [described] = connection.call(
        request_of(api_table.DESCRIBE_GROUPS, 5, groups=(group,), include_authorized_operations=False)
    ).groups
    return described


def second_member_joins(bootstrap: str, group: str, answers: dict, **join_args) -> threading.Thread:
    """A new member's join (through MEMBER_ID_REQUIRED) on a connection of its own, in a thread begun
    here: the join waits for the rebalance it begins; its answer is answers["second"] once the
    thread ends."""

    def joins():
        with RawConnection(bootstrap) as connection:
            first = join(connection, group, **join_args)
            answers["second"] = join(connection, group, first.member_id, **join_args)

    joiner = threading.Thread(target=joins)
    joiner.start()
    return joiner


def consumer_assignment(partitions: dict[str, list[int]]) -> bytes:
    """A leader's assignment bytes for one member under Kafka's consumer protocol (its
    ConsumerProtocolAssignment v0: the version, then the message), as a consumer's assignor sends them."""
    buffer = io.BytesIO()
    assignment = ConsumerProtocolAssignment(
        assigned_partitions=tuple(TopicPartition(topic=t, partitions=tuple(p)) for t, p in partitions.items())
    )
    entity_writer(ConsumerProtocolAssignment)(buffer, assignment)
    return (0).to_bytes(2, "big") + buffer.getvalue()


# KIP-848's ConsumerGroupHeartbeat: librdkafka's version (the consumer generates its member id).
CONSUMER_HEARTBEAT_VERSION = 1


def consumer_heartbeat_request(
    group: str,
    member: str,
    epoch: int,
    topics: list[str] | None = None,
    owned: list[tuple] | None = None,
    rebalance_timeout=LONG,
    assignor: str | None = None,
    version: int = CONSUMER_HEARTBEAT_VERSION,
    regex: str | None = None,
    instance: str | None = None,
):
    """owned: (topic id, partitions) each, None: unchanged since the last heartbeat (a join sends
    none: an empty list)."""
    key = api_table.CONSUMER_GROUP_HEARTBEAT
    if owned is None and epoch == 0:
        owned = []
    return request_of(
        key,
        version,
        group_id=group,
        member_id=member,
        member_epoch=epoch,
        instance_id=instance,
        rack_id=None,
        rebalance_timeout=rebalance_timeout if epoch == 0 else datetime.timedelta(milliseconds=-1),
        subscribed_topic_names=None if topics is None else tuple(topics),
        subscribed_topic_regex=regex,
        server_assignor=assignor,
        topic_partitions=None
        if owned is None
        else tuple(
            nested(key, version, "TopicPartitions", topic_id=topic_id, partitions=tuple(partitions))
            for topic_id, partitions in owned
        ),
    )


def consumer_heartbeat(connection, *request, **named):
    """ConsumerGroupHeartbeat (`consumer_heartbeat_request`'s arguments), its answer."""
    return connection.call(consumer_heartbeat_request(*request, **named))


def assigned(answer) -> dict:
    """A ConsumerGroupHeartbeat answer's assignment: topic id -> partitions (None: not sent)."""
    if answer.assignment is None:
        return None
    return {t.topic_id: sorted(t.partitions) for t in answer.assignment.topic_partitions}
