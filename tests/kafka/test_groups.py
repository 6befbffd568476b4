"""Consumer groups of the classic protocol with each real client (confluent-kafka, kafka-python,
aiokafka): two members of one group split a topic's partitions (each partition to one member, the
client's own assignor), a member leaving hands its partitions to the other, commits (with metadata)
are what a new member resumes from, and auto.offset.reset earliest/latest."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import Consumer, TopicPartition

from app.kafka import api_table, dispatch
from tests.kafka import http_side
from tests.kafka.clients import WAIT_S, bootstrap, create_topic
from tests.kafka.group_clients import MEMBERS, poll_until

PARTITIONS = 4


@pytest.fixture(params=sorted(MEMBERS), ids=sorted(MEMBERS))
def member_class(request):
    return MEMBERS[request.param]


def produce_to_each_partition(server, topic: str, values_per_partition: int, tag: str) -> set[bytes]:
    sent = set()
    for partition in range(PARTITIONS):
        values = [f"{tag}-{partition}-{i}" for i in range(values_per_partition)]
        http_side.produce(server, topic, partition, [{"key": None, "value": v} for v in values])
        sent.update(v.encode() for v in values)
    return sent


def split_between(first, second) -> bool:
    """Whether both members are assigned, each partition to one of them."""
    mine, yours = first.assignment(), second.assignment()
    return bool(mine and yours and len(mine | yours) == PARTITIONS and not mine & yours)


def answered_after(handler, seconds: float):
    """The server's handler of one Kafka API, its answers sent `seconds` late (as over a slow network)."""

    async def late(context, request):
        response = await handler(context, request)
        await asyncio.sleep(seconds)
        return response

    return late


def test_two_members_split_the_partitions_then_one_leaves_and_a_new_one_resumes(module_kafka_server, member_class):
    server = module_kafka_server
    topic = f"groups-split-{member_class.__name__}"
    group = f"split-{member_class.__name__}"
    create_topic(server, topic, PARTITIONS)
    first = member_class(server, group, topic)
    second = member_class(server, group, topic)
    members = [first, second]
    try:
        # Until both have handled the rebalance, one may still show the partitions it had alone
        # while the other shows its new share (the clients update their assignment as each one's
        # SyncGroup answer is polled): the split is what the group settles on.
        poll_until(members, lambda _: split_between(first, second), "both members assigned, each partition to one")
        sent = produce_to_each_partition(server, topic, 5, "a")
        consumed = poll_until(members, lambda c: len(c[0]) + len(c[1]) >= len(sent), "every record consumed")
        for mine, member in zip(consumed, members):
            assert {c.partition for c in mine} <= member.assignment()
        assert sorted(c.value for c in consumed[0] + consumed[1]) == sorted(sent)  # once each
        first.commit(metadata="first's")
        second.commit()
        # The first leaves (LeaveGroup): the second gets every partition.
        first.close()
        members = [second]
        poll_until(members, lambda _: second.assignment() == set(range(PARTITIONS)), "the rest rebalanced to one")
        more = produce_to_each_partition(server, topic, 2, "b")
        consumed = poll_until(members, lambda c: len(c[0]) >= len(more), "the new records consumed")
        assert sorted(c.value for c in consumed[0]) == sorted(more)
        second.commit()
    finally:
        for member in members:
            member.close()
    # Committed offsets are what a new member of the group resumes from: nothing old again.
    resumed = member_class(server, group, topic)
    try:
        committed = resumed.committed(topic, list(range(PARTITIONS)))
        assert {p: offset for p, (offset, _) in committed.items()} == {p: 7 for p in range(PARTITIONS)}
        last = produce_to_each_partition(server, topic, 1, "c")
        consumed = poll_until([resumed], lambda c: len(c[0]) >= len(last), "the records after the commits")
        assert sorted(c.value for c in consumed[0]) == sorted(last)
    finally:
        resumed.close()
    # And over HTTP, the same offsets.
    response = server.client.post(
        f"/v1/groups/{group}/offsets/fetch", json={"partitions": None, "require_stable": False}
    )
    assert response.status_code == 200, response.text
    assert {(o["partition"], o["offset"]) for o in response.json()["offsets"]} == {(p, 7) for p in range(PARTITIONS)}


def test_kafka_python_members_split_when_sync_group_is_answered_after_their_poll(module_kafka_server, monkeypatch):
    """Regression (the two kafka-python members that once never split under the parallel suite):
    kafka-python 3.0's leader rejoins when the metadata it assigned with differs from what it holds
    (its first assignment, made before its metadata for the topic came, always does), and if that
    rejoin's poll() times out after its JoinGroup was answered, its next poll() never takes the
    SyncGroup answer: stuck "rebalancing", heartbeats stopped, it never rejoins. Here every
    SyncGroup answer comes after the member's poll() has ended and every Metadata answer after its
    first JoinGroup, so the old harness stuck every time; it now fetches the topic's metadata after
    subscribing, so its leader never rejoins on its own."""
    server = module_kafka_server
    topic, group = "groups-late-sync", "late-sync"
    create_topic(server, topic, PARTITIONS)
    member_class = MEMBERS["kafka-python"]
    poll_s = member_class.POLL_MS / 1000
    for api_key, late_s in [(api_table.SYNC_GROUP, 3 * poll_s), (api_table.METADATA, 10 * poll_s)]:
        monkeypatch.setitem(dispatch.HANDLERS, api_key, answered_after(dispatch.HANDLERS[api_key], late_s))
    first = member_class(server, group, topic)
    members = [first]
    try:
        second = member_class(server, group, topic)
        members.append(second)
        poll_until(members, lambda _: split_between(first, second), "both members assigned, each partition to one")
    finally:
        for member in members:
            member.close()


@pytest.mark.parametrize("assignor", ["roundrobin", "cooperative-sticky"])
def test_confluent_assignors_are_relayed(module_kafka_server, assignor):
    """The broker relays the leader's assignment whatever its assignor (librdkafka's range is the
    default, tested above): each partition to one member, cooperative's incremental rebalances too."""
    server = module_kafka_server
    topic, group = f"groups-{assignor}", f"assignor-{assignor}"
    create_topic(server, topic, PARTITIONS)
    member_class = MEMBERS["confluent-kafka"]
    first = member_class(server, group, topic, **{"partition.assignment.strategy": assignor})
    second = member_class(server, group, topic, **{"partition.assignment.strategy": assignor})
    members = [first, second]
    try:
        poll_until(
            members,
            lambda _: (
                first.assignment()
                and second.assignment()
                and not first.assignment() & second.assignment()
                and len(first.assignment() | second.assignment()) == PARTITIONS
            ),
            "the partitions split between the two",
        )
        sent = produce_to_each_partition(server, topic, 3, assignor)
        consumed = poll_until(members, lambda c: len(c[0]) + len(c[1]) >= len(sent), "every record consumed")
        assert sorted(c.value for c in consumed[0] + consumed[1]) == sorted(sent)
        second.close()
        members = [first]
        poll_until(members, lambda _: first.assignment() == set(range(PARTITIONS)), "the rest to the first")
    finally:
        for member in members:
            member.close()


def test_a_joining_member_is_answered_with_the_generation_that_takes_it_in(module_kafka_server):
    """Kafka answers every member of a generation when it completes: a cooperative-sticky member
    joining a group gets that generation's (empty) assignment, then the partition its leader gave
    up in the next. A member answered late would find the leader already rejoining (its SyncGroup
    REBALANCE_IN_PROGRESS) and miss the first assignment (librdkafka's 0113 waits for both)."""
    server = module_kafka_server
    topic, group = "groups-cooperative-join", "cooperative-join"
    create_topic(server, topic, 2)
    member_class = MEMBERS["confluent-kafka"]
    cooperative = {"partition.assignment.strategy": "cooperative-sticky"}
    first = member_class(server, group, topic, **cooperative)
    members = [first]
    try:
        poll_until(members, lambda _: first.assignment() == {0, 1}, "both partitions to the first")
        second = member_class(server, group, topic, **cooperative)
        members.append(second)
        poll_until(
            members,
            lambda _: len(first.assignment()) == len(second.assignment()) == 1,
            "one partition each",
        )
        assert second.rebalances == [("assign", set()), ("assign", {0, 1} - first.assignment())]
    finally:
        for member in members:
            member.close()


@pytest.mark.parametrize("reset", ["earliest", "latest"])
def test_auto_offset_reset(module_kafka_server, member_class, reset):
    server = module_kafka_server
    topic = f"groups-reset-{reset}-{member_class.__name__}"
    create_topic(server, topic, PARTITIONS)
    before = produce_to_each_partition(server, topic, 2, "before")
    member = member_class(server, f"reset-{reset}-{member_class.__name__}", topic, reset=reset)
    try:
        # Until the member reads from every partition (its positions are taken), a marker more to each.
        seen = []
        for attempt in range(WAIT_S):
            if {c.partition for c in seen if c.value.startswith(b"marker")} == set(range(PARTITIONS)):
                break
            produce_to_each_partition(server, topic, 1, f"marker{attempt}")
            for _ in range(5):
                seen += member.poll()
        else:
            raise AssertionError(f"no marker reached the member from every partition: {seen}")
        after = produce_to_each_partition(server, topic, 1, "after")
        seen += poll_until([member], lambda c: after <= {r.value for r in seen + c[0]}, "the records after")[0]
        values = [c.value for c in seen if not c.value.startswith(b"marker")]
        assert sorted(values) == sorted((before | after) if reset == "earliest" else after)
    finally:
        member.close()


def test_commit_with_metadata_reads_back(module_kafka_server, member_class):
    if member_class.__name__ == "AioKafkaMember":
        pytest.skip("aiokafka's committed() returns the offset only")
    server = module_kafka_server
    topic = f"groups-metadata-{member_class.__name__}"
    create_topic(server, topic, PARTITIONS)
    produce_to_each_partition(server, topic, 3, "m")
    member = member_class(server, f"metadata-{member_class.__name__}", topic)
    try:
        poll_until([member], lambda c: len(c[0]) >= 3 * PARTITIONS, "consumed")
        member.commit(metadata="checkpoint 1")
        assert member.committed(topic, list(range(PARTITIONS))) == {p: (3, "checkpoint 1") for p in range(PARTITIONS)}
    finally:
        member.close()


def test_confluent_kafka_commits_metadata_and_reads_back_exactly_what_it_committed(module_kafka_server):
    """Regression (confluent-kafka-python's own test_consumer_topicpartition_metadata): its binding
    sends metadata with a trailing NUL (its C terminator) and needs it back; txbroker dropped it,
    so a committed `""` read back as None. None, `""`, text and non-ASCII text all read back."""
    server = module_kafka_server
    topic = "groups-metadata-exact"
    create_topic(server, topic, 1)
    consumer = Consumer({"bootstrap.servers": bootstrap(server), "group.id": "metadata-exact"})
    try:
        for metadata in [None, "hello world", "नमस्ते दुनिया", ""]:
            given = TopicPartition(topic, 0, 1) if metadata is None else TopicPartition(topic, 0, 1, metadata)
            consumer.commit(offsets=[given], asynchronous=False)
            [found] = consumer.committed([TopicPartition(topic, 0)], timeout=WAIT_S)
            assert (found.offset, found.metadata) == (1, metadata)
    finally:
        consumer.close()


def test_a_restarted_static_member_gets_its_partitions_back_without_revoking_the_other(module_kafka_server):
    """confluent-kafka with group.instance.id (KIP-345): a static member that stops sends no
    LeaveGroup, and restarted with its instance id it takes its place in the same generation: its
    partitions come back to it and the other member is neither revoked nor reassigned."""
    server = module_kafka_server
    topic, group = "groups-static", "static-members"
    create_topic(server, topic, PARTITIONS)
    ConfluentMember = MEMBERS["confluent-kafka"]
    first = ConfluentMember(server, group, topic, **{"group.instance.id": "first"})
    other = ConfluentMember(server, group, topic, **{"group.instance.id": "other"})
    members = [first, other]
    try:
        poll_until(members, lambda _: first.assignment() and other.assignment(), "both members assigned")
        kept, others = first.assignment(), other.assignment()
        assert kept | others == set(range(PARTITIONS)) and not kept & others
        described = server.client.get(f"/v1/groups/{group}").json()
        generation = described["generation_id"]
        # Each member's subscription read from its metadata (librdkafka's ConsumerProtocol version).
        assert [m["topics"] for m in described["members"]] == [[topic], [topic]]
        rebalances = list(other.rebalances)
        first.close()
        members = [other]
        restarted = ConfluentMember(server, group, topic, **{"group.instance.id": "first"})
        members = [restarted, other]
        poll_until(members, lambda _: restarted.assignment() == kept, "the restarted member's partitions")
        sent = produce_to_each_partition(server, topic, 2, "static")
        consumed = poll_until(members, lambda c: len(c[0]) + len(c[1]) >= len(sent), "every record")
        assert {c.partition for c in consumed[0]} <= kept and {c.partition for c in consumed[1]} <= others
        assert server.client.get(f"/v1/groups/{group}").json()["generation_id"] == generation
        assert other.rebalances == rebalances and other.assignment() == others
    finally:
        for member in members:
            member.close()
