"""KIP-848's consumer group protocol (ConsumerGroupHeartbeat) with confluent-kafka's
`group.protocol=consumer`: the coordinator assigns, members reconcile, partitions move only once
released; sessions and commits with member epochs."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import re
import time

import asyncpg
from confluent_kafka import KafkaError as ConfluentError
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from app.storage import database
from app.storage.log import topics
from tests.conftest import (
    restarted_after,
    start_in_process_server,
    start_server_on_fresh_database,
    stop_in_process_server,
)
from tests.kafka.clients import WAIT_S, ConfluentKafka, bootstrap, create_topic, topic_uuid
from tests.kafka.group_clients import ConfluentMember, poll_until
from tests.kafka.raw import RawConnection, nested, request_of
from tests.kafka.raw_groups import assigned, consumer_heartbeat, consumer_heartbeat_request, join
from tests.kafka.raw_transactions import end_txn, init_producer, txn_offset_commit

# Sessions and heartbeats short enough that a rebalance or a lapse takes well under a second or two.
KAFKA_SERVER_SETTINGS = {
    "group_consumer_session_timeout_ms": 1500,
    "group_consumer_heartbeat_interval_ms": 100,
    "group_session_check_interval_ms": 100,
}
CONSUMER = {"group.protocol": "consumer"}


def _member(server, group: str, topic: str, **extra) -> ConfluentMember:
    return ConfluentMember(server, group, topic, **CONSUMER, **extra)


def _produce(server, topic: str, count: int, tag: str) -> set[bytes]:
    """`count` records of distinct values, spread over the topic's partitions by their keys."""
    values = {f"{tag}-{i}".encode() for i in range(count)}
    ConfluentKafka().produce(server, topic, [{"key": value, "value": value} for value in sorted(values)])
    return values


def _assignments_are(members, wanted: list[int]):
    return lambda _consumed: (
        sorted(len(m.assignment()) for m in members) == wanted
        and not (set.intersection(*(m.assignment() for m in members)) if len(members) > 1 else set())
    )


def test_two_consumers_share_a_topic_and_one_takes_all_when_the_other_leaves(module_kafka_server):
    server = module_kafka_server
    topic, group = "cgh-share", "cgh-share-group"
    create_topic(server, topic, 4)
    first = _member(server, group, topic)
    second = _member(server, group, topic)
    try:
        poll_until([first, second], _assignments_are([first, second], [2, 2]), "2 + 2 partitions")
        assert first.assignment() | second.assignment() == {0, 1, 2, 3}
        second.close()
        poll_until([first], lambda _: first.assignment() == {0, 1, 2, 3}, "the remaining member owns all 4")
    finally:
        first.close()


# ---- raw ConsumerGroupHeartbeats: the reconciliation rule and the errors


def _topic(server, name: str, partitions: int):
    create_topic(server, name, partitions)
    return topic_uuid(server.client.get(f"/v1/topics/{name}").json()["topic_id"])


def test_a_partition_goes_to_its_new_owner_only_once_the_old_one_released_it(module_kafka_server):
    server = module_kafka_server
    topic_id = _topic(server, "cgh-release", 4)
    group = "cgh-release-group"
    with RawConnection(bootstrap(server)) as connection:
        a = consumer_heartbeat(connection, group, "member-a", 0, ["cgh-release"])
        assert a.error_code == KafkaError.none and a.member_epoch == 1
        assert assigned(a) == {topic_id: [0, 1, 2, 3]}
        # B joins: the group epoch moves to 2 and the target splits the partitions, but A owns them all.
        b = consumer_heartbeat(connection, group, "member-b", 0, ["cgh-release"])
        assert b.error_code == KafkaError.none and b.member_epoch == 2
        assert assigned(b) == {}
        # A learns it must give up two: its epoch stays until it has.
        a = consumer_heartbeat(connection, group, "member-a", 1, owned=[(topic_id, [0, 1, 2, 3])])
        assert a.member_epoch == 1
        kept = assigned(a)[topic_id]
        assert len(kept) == 2
        released = sorted({0, 1, 2, 3} - set(kept))
        # Until A's heartbeat no longer lists them, B does not get them.
        a = consumer_heartbeat(connection, group, "member-a", 1, owned=[(topic_id, [0, 1, 2, 3])])
        assert a.member_epoch == 1
        b = consumer_heartbeat(connection, group, "member-b", 2, owned=[])
        assert b.member_epoch == 2 and not assigned(b)
        # A released them: its epoch moves on, and B gets them at its next heartbeat.
        a = consumer_heartbeat(connection, group, "member-a", 1, owned=[(topic_id, kept)])
        assert a.error_code == KafkaError.none and a.member_epoch == 2
        b = consumer_heartbeat(connection, group, "member-b", 2, owned=[])
        assert assigned(b) == {topic_id: released}
        described = _listed(connection, group)
        assert described == ("consumer", "Stable")


def _group_row_version(server, group: str) -> str:
    """The consumer_groups row's xmin: the transaction that last wrote it."""

    async def read() -> str:
        connection = await asyncpg.connect(server.database_url)
        try:
            return await connection.fetchval("SELECT xmin::text FROM consumer_groups WHERE group_id = $1", group)
        finally:
            await connection.close()

    return asyncio.run(read())


def test_a_stable_members_heartbeat_leaves_the_group_row_unwritten(module_kafka_server):
    """A heartbeat that changes nothing (a stable member, nothing to reconcile) renews the member's
    session only: the group's row, whose state holds every member's, is not written again. Before,
    each of N members' heartbeats rewrote all N members' state, and the group's last update (the
    console's "last rebalance") moved with every heartbeat. A change (a member joining) writes it."""
    server = module_kafka_server
    topic_id = _topic(server, "cgh-unwritten", 2)
    group = "cgh-unwritten-group"
    with RawConnection(bootstrap(server)) as connection:
        a = consumer_heartbeat(connection, group, "member-a", 0, ["cgh-unwritten"])
        assert a.member_epoch == 1 and assigned(a) == {topic_id: [0, 1]}
        a = consumer_heartbeat(connection, group, "member-a", 1, owned=[(topic_id, [0, 1])])
        written = _group_row_version(server, group)
        for _ in range(3):
            a = consumer_heartbeat(connection, group, "member-a", 1, owned=[(topic_id, [0, 1])])
            assert a.error_code == KafkaError.none and a.member_epoch == 1
        assert _group_row_version(server, group) == written, "a heartbeat that changed nothing wrote the group"
        b = consumer_heartbeat(connection, group, "member-b", 0, ["cgh-unwritten"])
        assert b.member_epoch == 2
        assert _group_row_version(server, group) != written, "a join must change the group"


def _listed(connection, group: str) -> tuple[str, str]:
    answer = connection.call(request_of(api_table.LIST_GROUPS, 5, states_filter=(), types_filter=("consumer",)))
    [found] = [(g.group_type, g.group_state) for g in answer.groups if g.group_id == group]
    return found


def test_heartbeat_errors_as_kafka_answers_them(module_kafka_server):
    server = module_kafka_server
    topic_id = _topic(server, "cgh-errors", 2)
    group = "cgh-errors-group"
    with RawConnection(bootstrap(server)) as connection:
        missing = consumer_heartbeat(connection, "cgh-no-such-group", "someone", 3)
        assert missing.error_code == KafkaError.group_id_not_found
        joined = consumer_heartbeat(connection, group, "member-a", 0, ["cgh-errors"])
        assert joined.member_epoch == 1 and joined.heartbeat_interval.total_seconds() == 0.1
        assert consumer_heartbeat(connection, group, "stranger", 1).error_code == KafkaError.unknown_member_id
        ahead = consumer_heartbeat(connection, group, "member-a", 5, owned=[(topic_id, [0, 1])])
        assert ahead.error_code == KafkaError.fenced_member_epoch and ahead.error_message
        unsupported = consumer_heartbeat(connection, group, "member-b", 0, ["cgh-errors"], assignor="sticky")
        assert unsupported.error_code == KafkaError.unsupported_assignor and "uniform" in unsupported.error_message
        no_id = consumer_heartbeat(connection, group, "", 0, ["cgh-errors"])
        assert no_id.error_code == KafkaError.invalid_request and no_id.error_message
        no_topics = consumer_heartbeat(connection, group, "member-c", 0)
        assert no_topics.error_code == KafkaError.invalid_request and "SubscribedTopicNames" in no_topics.error_message
        left = consumer_heartbeat(connection, group, "member-a", -1)
        assert left.error_code == KafkaError.none and left.member_epoch == -1
        assert consumer_heartbeat(connection, group, "member-a", -1).error_code == KafkaError.unknown_member_id
        assert _listed(connection, group) == ("consumer", "Empty")
        # An empty consumer group is deleted as any other; its member ids are then of no group.
        assert server.client.delete(f"/v1/groups/{group}").status_code == 204
        gone = consumer_heartbeat(connection, group, "member-a", 1)
        assert gone.error_code == KafkaError.group_id_not_found


def test_a_heartbeat_kafka_refuses_as_invalid_is_refused_before_the_group_changes(module_kafka_server):
    """Regression: Kafka's coordinator (throwIfConsumerGroupHeartbeatRequestIsInvalid) refuses an
    empty instance id, and a join whose subscription is empty (no topic names, no regular
    expression) or that sends no TopicPartitions at all (null, not an empty list): each is
    INVALID_REQUEST with a message. txbroker took them: "" made a dynamic member that could still
    "leave" as a static one (epoch -2, keeping its partitions until its session lapsed), and an
    empty subscription a member of nothing."""
    server = module_kafka_server
    topic_id = _topic(server, "cgh-invalid", 1)
    group = "cgh-invalid-group"
    with RawConnection(bootstrap(server)) as connection:
        no_instance = consumer_heartbeat(connection, group, "member-a", 0, ["cgh-invalid"], instance="")
        assert no_instance.error_code == KafkaError.invalid_request and "instance id" in no_instance.error_message
        nothing = consumer_heartbeat(connection, group, "member-a", 0, [])
        assert nothing.error_code == KafkaError.invalid_request and "SubscribedTopicNames" in nothing.error_message
        join_request = consumer_heartbeat_request(group, "member-a", 0, ["cgh-invalid"])
        null_owned = connection.call(dataclasses.replace(join_request, topic_partitions=None))
        assert null_owned.error_code == KafkaError.invalid_request and "TopicPartitions" in null_owned.error_message
        joined = consumer_heartbeat(connection, group, "member-a", 0, ["cgh-invalid"])
        assert joined.error_code == KafkaError.none and assigned(joined) == {topic_id: [0]}
        leaving = consumer_heartbeat(connection, group, "member-a", -2, instance="")
        assert leaving.error_code == KafkaError.invalid_request and "instance id" in leaving.error_message


def test_a_group_of_one_protocol_refuses_members_of_another(module_kafka_server):
    server = module_kafka_server
    _topic(server, "cgh-kinds", 1)
    with RawConnection(bootstrap(server)) as connection:
        assert consumer_heartbeat(connection, "cgh-kinds-new", "member-a", 0, ["cgh-kinds"]).member_epoch == 1
        classic = join(connection, "cgh-kinds-new", "", version=3)
        assert classic.error_code == KafkaError.inconsistent_group_protocol
        http = server.client.post("/v1/groups/cgh-kinds-new/heartbeat", json={"member_id": "", "topics": ["cgh-kinds"]})
        assert http.status_code == 409 and http.json()["error"]["code"] == "INCONSISTENT_GROUP_PROTOCOL"
        # A classic member whose metadata is no ConsumerProtocol subscription: its group is not
        # converted (as Kafka's coordinator refuses a malformed embedded protocol).
        first = join(connection, "cgh-kinds-classic", "", version=3)
        assert first.error_code == KafkaError.none
        refused = consumer_heartbeat(connection, "cgh-kinds-classic", "member-a", 0, ["cgh-kinds"])
        assert refused.error_code == KafkaError.inconsistent_group_protocol and refused.error_message
        # DescribeGroups describes classic groups only: v6+ says so, older versions answer Dead.
        for version, error in ((5, KafkaError.none), (6, KafkaError.group_id_not_found)):
            request = request_of(
                api_table.DESCRIBE_GROUPS, version, groups=("cgh-kinds-new",), include_authorized_operations=False
            )
            [described] = connection.call(request).groups
            assert (described.error_code, described.group_state) == (error, "Dead")


def _commit(connection, group: str, member: str, epoch: int, topic: str, version: int = 9) -> KafkaError:
    key = api_table.OFFSET_COMMIT
    partition = nested(
        key,
        version,
        "OffsetCommitRequestPartition",
        partition_index=0,
        committed_offset=1,
        committed_leader_epoch=-1,
        committed_metadata=None,
    )
    request = request_of(
        key,
        version,
        group_id=group,
        generation_id_or_member_epoch=epoch,
        member_id=member,
        group_instance_id=None,
        retention_time=datetime.timedelta(milliseconds=-1),
        topics=(nested(key, version, "OffsetCommitRequestTopic", name=topic, partitions=(partition,)),),
    )
    [answered] = connection.call(request).topics
    return answered.partitions[0].error_code


def _fetch(connection, group: str, member: str | None, epoch: int, topic: str) -> KafkaError:
    key = api_table.OFFSET_FETCH
    topics = (nested(key, 9, "OffsetFetchRequestTopics", name=topic, partition_indexes=(0,)),)
    request_group = nested(
        key, 9, "OffsetFetchRequestGroup", group_id=group, member_id=member, member_epoch=epoch, topics=topics
    )
    [answered] = connection.call(request_of(key, 9, groups=(request_group,), require_stable=False)).groups
    return answered.error_code


def test_commits_and_fetches_are_checked_against_the_member_epoch(module_kafka_server):
    server = module_kafka_server
    _topic(server, "cgh-commits", 1)
    group = "cgh-commits-group"
    with RawConnection(bootstrap(server)) as connection:
        # A simple commit (no member, epoch -1) is accepted while the group has no members.
        assert _commit(connection, group, "", -1, "cgh-commits") == KafkaError.none
        assert consumer_heartbeat(connection, group, "member-a", 0, ["cgh-commits"]).member_epoch == 1
        assert _commit(connection, group, "member-a", 1, "cgh-commits") == KafkaError.none
        assert _commit(connection, group, "member-a", 0, "cgh-commits") == KafkaError.stale_member_epoch
        assert _commit(connection, group, "stranger", 1, "cgh-commits") == KafkaError.unknown_member_id
        assert _commit(connection, group, "", -1, "cgh-commits") == KafkaError.unknown_member_id
        assert _fetch(connection, group, "member-a", 1, "cgh-commits") == KafkaError.none
        assert _fetch(connection, group, "member-a", 7, "cgh-commits") == KafkaError.stale_member_epoch
        assert _fetch(connection, group, "stranger", 1, "cgh-commits") == KafkaError.unknown_member_id
        assert _fetch(connection, group, None, -1, "cgh-commits") == KafkaError.none  # an admin's fetch
        # TxnOffsetCommit (v3+, KIP-447) names the member and its epoch, checked alike; a stale epoch
        # is ILLEGAL_GENERATION there, as Kafka's coordinator answers it (OffsetMetadataManager):
        # producers know no STALE_MEMBER_EPOCH (Java's takes an unknown error as fatal), and abort
        # on ILLEGAL_GENERATION.
        producer = init_producer(connection, "cgh-commits-txn")
        txn = "cgh-commits"
        assert txn_offset_commit(connection, producer, group, txn, 2, member=(0, "member-a", None)) == [
            KafkaError.illegal_generation
        ]
        assert txn_offset_commit(connection, producer, group, txn, 2, member=(1, "stranger", None)) == [
            KafkaError.unknown_member_id
        ]
        assert txn_offset_commit(connection, producer, group, txn, 2, member=(1, "member-a", None)) == [KafkaError.none]
        assert end_txn(connection, producer, committed=False, version=3).error_code == KafkaError.none


def _member_ids(server, group: str) -> set[str]:
    return {m["member_id"] for m in server.client.get(f"/v1/groups/{group}").json()["members"]}


def test_a_member_that_does_not_revoke_within_its_rebalance_timeout_is_removed(module_kafka_server):
    server = module_kafka_server
    topic_id = _topic(server, "cgh-revoke-late", 2)
    group = "cgh-revoke-late-group"
    brief = datetime.timedelta(milliseconds=300)
    with RawConnection(bootstrap(server)) as connection:
        a = consumer_heartbeat(connection, group, "member-a", 0, ["cgh-revoke-late"], rebalance_timeout=brief)
        assert assigned(a) == {topic_id: [0, 1]}
        consumer_heartbeat(connection, group, "member-b", 0, ["cgh-revoke-late"])
        a = consumer_heartbeat(connection, group, "member-a", 1, owned=[(topic_id, [0, 1])])
        assert len(assigned(a)[topic_id]) == 1  # one to revoke, within 300 ms
        # Nobody heartbeats meanwhile: the eviction worker removes it (its revocation deadline).
        deadline = time.monotonic() + 5
        while "member-a" in _member_ids(server, group):
            assert time.monotonic() < deadline, "the member overdue to revoke was not removed"
            time.sleep(0.1)
        late = consumer_heartbeat(connection, group, "member-a", 1, owned=[(topic_id, [0, 1])])
        assert late.error_code == KafkaError.unknown_member_id
        b = consumer_heartbeat(connection, group, "member-b", 2, owned=[])
        assert b.error_code == KafkaError.none and assigned(b) == {topic_id: [0, 1]}


def test_a_member_whose_session_lapses_is_removed_and_its_partitions_reassigned(module_kafka_server):
    """A consumer killed without leaving (its heartbeats stop): after the session timeout (1.5 s on
    this server) the other member gets its partitions."""
    server = module_kafka_server
    topic, group = "cgh-lapse", "cgh-lapse-group"
    topic_id = _topic(server, topic, 4)
    with RawConnection(bootstrap(server)) as connection:
        gone = consumer_heartbeat(connection, group, "member-gone", 0, [topic])
        assert assigned(gone) == {topic_id: [0, 1, 2, 3]}
        member = _member(server, group, topic)
        try:
            started = time.monotonic()
            poll_until([member], lambda _: member.assignment() == {0, 1, 2, 3}, "the live member owns all 4")
            assert time.monotonic() - started >= 1.0  # not before the lapsed member's session ran out
            again = consumer_heartbeat(connection, group, "member-gone", 1, owned=[(topic_id, [0, 1, 2, 3])])
            assert again.error_code == KafkaError.unknown_member_id
        finally:
            member.close()


def _consume_and_commit(members, received: list[list[bytes]], until) -> None:
    """Polls each member in turn, committing each record it gets (synchronously) before the next
    poll, until until() holds."""
    deadline = time.monotonic() + WAIT_S
    while not until():
        assert time.monotonic() < deadline, f"not done within {WAIT_S} s: {[len(r) for r in received]} received"
        for member, got in zip(members, received):
            message = member.consumer.poll(0.05)
            if message is None or message.error():
                continue
            got.append(message.value())
            _commit_at_the_current_epoch(member, message)


def _commit_at_the_current_epoch(member, message) -> None:
    """Commits the record, again while the answer is STALE_MEMBER_EPOCH: the member's epoch moved on
    between its poll and its commit (another member joined or left), which Kafka's coordinator
    answers alike, and Kafka's Java consumer retries the commit with the new epoch; librdkafka hands
    it to the application. The partition stays this member's meanwhile (its revocation waits for
    the next poll), so the retry, with the epoch the heartbeats brought, is accepted."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            member.consumer.commit(message=message, asynchronous=False)
            return
        except KafkaException as error:
            if error.args[0].code() != ConfluentError.STALE_MEMBER_EPOCH or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_across_rebalances_no_record_is_delivered_twice_nor_lost(module_kafka_server):
    """Each consumer commits every record it gets; members join and leave while they consume: a
    partition changes owner only once its previous owner released it (and committed), so the union
    of what they got is every record, once."""
    server = module_kafka_server
    topic, group = "cgh-once", "cgh-once-group"
    create_topic(server, topic, 4)
    produced = _produce(server, topic, 120, "once")
    first = _member(server, group, topic)
    members, received = [first], [[]]
    try:
        _consume_and_commit(members, received, lambda: len(received[0]) >= 20)
        members.append(_member(server, group, topic))
        received.append([])
        _consume_and_commit(members, received, lambda: sum(map(len, received)) >= 60)
        members.append(_member(server, group, topic))
        received.append([])
        _consume_and_commit(members, received, lambda: sum(map(len, received)) >= 90)
        members.pop(0).close()
        _consume_and_commit(members, received[1:], lambda: sum(map(len, received)) >= len(produced))
        everything = [value for got in received for value in got]
        assert sorted(everything) == sorted(produced)
    finally:
        for member in members:
            member.close()


def test_a_third_member_gets_partitions_only_as_the_others_release_them(module_kafka_server):
    server = module_kafka_server
    topic, group = "cgh-third", "cgh-third-group"
    create_topic(server, topic, 4)
    members = [_member(server, group, topic), _member(server, group, topic)]
    try:
        poll_until(members, _assignments_are(members, [2, 2]), "2 + 2 partitions")
        members.append(_member(server, group, topic))
        overlaps = []

        def settled(_consumed) -> bool:
            owned = [m.assignment() for m in members]
            overlaps.extend(
                (i, j, owned[i] & owned[j]) for i in range(3) for j in range(i + 1, 3) if owned[i] & owned[j]
            )
            return sorted(map(len, owned)) == [1, 1, 2]

        poll_until(members, settled, "1 + 1 + 2 partitions")
        assert overlaps == []
        assert set.union(*(m.assignment() for m in members)) == {0, 1, 2, 3}
    finally:
        for member in members:
            member.close()


def test_http_and_the_console_show_a_consumer_group_with_its_epochs_and_assignments(module_kafka_server):
    server = module_kafka_server
    topic_id = _topic(server, "cgh-shown", 2)
    group = "cgh-shown-group"
    with RawConnection(bootstrap(server)) as connection:
        consumer_heartbeat(connection, group, "member-a", 0, ["cgh-shown"])
        consumer_heartbeat(connection, group, "member-b", 0, ["cgh-shown"])
        consumer_heartbeat(connection, group, "member-a", 1, owned=[(topic_id, [0, 1])])  # revoking one
        described = server.client.get(f"/v1/groups/{group}").json()
        assert described["group_type"] == "consumer" and described["protocol_type"] == "consumer"
        assert (described["state"], described["protocol"]) == ("Reconciling", "uniform")
        assert described["generation_id"] == described["assignment_epoch"] == 2
        by_member = {m["member_id"]: m for m in described["members"]}
        a, b = by_member["member-a"], by_member["member-b"]
        assert a["member_epoch"] == 1 and len(a["assignment"][0]["partitions"]) == 1
        kept = a["assignment"][0]["partitions"]
        assert a["revoking"] == [{"topic": "cgh-shown", "partitions": sorted({0, 1} - set(kept))}]
        assert a["target_assignment"] == a["assignment"]
        assert b["member_epoch"] == 2 and b["assignment"] == [] and len(b["target_assignment"][0]["partitions"]) == 1
        listed = {g["group_id"]: g for g in server.client.get("/v1/groups").json()["groups"]}
        assert (listed[group]["group_type"], listed[group]["state"]) == ("consumer", "Reconciling")
        listing = server.client.get("/console/groups").text
        assert re.search(
            rf'href="/console/groups/{group}">{group}</a></td>\s*<td><span class="badge[^"]*">Reconciling<', listing
        )
        deleted = server.client.delete(f"/v1/groups/{group}")
        assert deleted.status_code == 409 and deleted.json()["error"]["code"] == "NON_EMPTY_GROUP"
        page = server.client.get(f"/console/groups/{group}")
        assert page.status_code == 200
        assert "Group epoch" in page.text and "epoch 1" in page.text and "revoking" in page.text


def test_consume_transform_produce_exactly_once_with_a_consumer_protocol_group(module_kafka_server):
    """send_offsets_to_transaction with a consumer group's metadata (TxnOffsetCommit with the
    member id and epoch): every input record's transform is in the output once, read_committed,
    and the group's committed offsets are the input's end."""
    server = module_kafka_server
    source, sink, group = "cgh-eos-in", "cgh-eos-out", "cgh-eos-group"
    create_topic(server, source, 2)
    create_topic(server, sink, 1)
    produced = _produce(server, source, 50, "eos")
    consumer = _member(server, group, source, **{"isolation.level": "read_committed"}).consumer
    producer = Producer({"bootstrap.servers": bootstrap(server), "transactional.id": "cgh-eos-tx"})
    producer.init_transactions(WAIT_S)
    try:
        done = 0
        deadline = time.monotonic() + WAIT_S
        while done < len(produced):
            assert time.monotonic() < deadline, f"{done} of {len(produced)} transformed within {WAIT_S} s"
            batch = [m for m in consumer.consume(10, 0.2) if not m.error()]
            if not batch:
                continue
            producer.begin_transaction()
            for message in batch:
                producer.produce(sink, b"t:" + message.value())
            positions = consumer.position(consumer.assignment())
            producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), WAIT_S)
            producer.commit_transaction(WAIT_S)
            done += len(batch)
        committed = consumer.committed([TopicPartition(source, p) for p in range(2)], WAIT_S)
        ends = [consumer.get_watermark_offsets(TopicPartition(source, p), WAIT_S)[1] for p in range(2)]
        assert [tp.offset for tp in committed] == ends and sum(ends) == len(produced)
    finally:
        consumer.close()
    output = ConfluentKafka().read_to_end(server, sink, 0, isolation="read_committed")
    assert sorted(r.value for r in output.received) == sorted(b"t:" + value for value in produced)


def test_the_admin_client_describes_a_consumer_group(module_kafka_server):
    """ConsumerGroupDescribe, as confluent-kafka's AdminClient.describe_consumer_groups asks it: the
    state, the assignor, each member's client and assignment; a classic group and an unknown one are
    GROUP_ID_NOT_FOUND, as Kafka answers."""
    server = module_kafka_server
    topic, group = "cgh-described", "cgh-described-group"
    create_topic(server, topic, 2)
    member = _member(server, group, topic, **{"client.id": "described-client"})
    admin = AdminClient({"bootstrap.servers": bootstrap(server)})
    try:
        poll_until([member], lambda _: member.assignment() == {0, 1}, "the member owns both partitions")
        described = admin.describe_consumer_groups([group])[group].result(WAIT_S)
        assert described.group_id == group and str(described.state) == "ConsumerGroupState.STABLE"
        assert described.partition_assignor == "uniform"
        [shown] = described.members
        assert shown.client_id == "described-client"
        assert sorted(tp.partition for tp in shown.assignment.topic_partitions) == [0, 1]
        with RawConnection(bootstrap(server)) as connection:
            assert join(connection, "cgh-described-classic", "", version=3).error_code == KafkaError.none
            request = request_of(
                api_table.CONSUMER_GROUP_DESCRIBE,
                1,
                group_ids=(group, "cgh-described-classic", "cgh-described-none"),
                include_authorized_operations=False,
            )
            answered = {g.group_id: g for g in connection.call(request).groups}
        assert answered[group].group_epoch == answered[group].assignment_epoch == 1
        [raw_member] = answered[group].members
        assert raw_member.member_epoch == 1 and raw_member.member_type == 1
        assert [(t.topic_name, t.partitions) for t in raw_member.target_assignment.topic_partitions] == [
            (topic, (0, 1))
        ]
        assert answered["cgh-described-classic"].error_code == KafkaError.group_id_not_found
        assert answered["cgh-described-classic"].error_message == "Group cgh-described-classic is not a consumer group."
        assert answered["cgh-described-none"].error_message == "Group cgh-described-none not found."
    finally:
        member.close()


def test_the_description_leaves_out_a_deleted_topic_a_member_still_holds(module_kafka_server):
    """Regression: a member that has not heartbeat since a topic it was assigned was deleted still
    holds its partitions (until its next heartbeat revokes them); ConsumerGroupDescribe named that
    topic with a null topic id. Kafka's coordinator (ConsumerGroupMember.topicPartitionsFromMap)
    leaves out the topics its metadata no longer has."""
    server = module_kafka_server
    _topic(server, "cgh-deleted", 2)
    kept_id = _topic(server, "cgh-deleted-kept", 1)
    group = "cgh-deleted-group"
    with RawConnection(bootstrap(server)) as connection:
        consumer_heartbeat(connection, group, "member-a", 0, ["cgh-deleted", "cgh-deleted-kept"])
        b = consumer_heartbeat(connection, group, "member-b", 0, ["cgh-deleted-kept"])
        assert server.client.delete("/v1/topics/cgh-deleted").status_code == 204
        # B's heartbeat brings the group to the topics that exist; A has not heartbeat since.
        assert consumer_heartbeat(connection, group, "member-b", b.member_epoch, owned=[]).error_code == KafkaError.none
        request = request_of(
            api_table.CONSUMER_GROUP_DESCRIBE, 1, group_ids=(group,), include_authorized_operations=False
        )
        [described] = connection.call(request).groups
    assert described.error_code == KafkaError.none
    by_member = {m.member_id: m for m in described.members}
    shown = [
        (t.topic_name, t.topic_id)
        for m in by_member.values()
        for t in (*m.assignment.topic_partitions, *m.target_assignment.topic_partitions)
    ]
    assert shown and all(name == "cgh-deleted-kept" and topic_id == kept_id for name, topic_id in shown)


def test_members_on_two_nodes_share_one_group_and_its_reconciliation_rule(module_kafka_server):
    """The group lives in PostgreSQL: a member heartbeating on another node (a second server on the
    same database) joins the same group, and gets a partition only once the member on the first
    node released it."""
    server = module_kafka_server
    topic_id = _topic(server, "cgh-nodes", 2)
    group = "cgh-nodes-group"
    other = start_in_process_server(
        server.database_url, kafka_listener="127.0.0.1:0", node_id=2, **KAFKA_SERVER_SETTINGS
    )
    try:
        with RawConnection(bootstrap(server)) as first, RawConnection(bootstrap(other)) as second:
            a = consumer_heartbeat(first, group, "member-a", 0, ["cgh-nodes"])
            assert assigned(a) == {topic_id: [0, 1]}
            b = consumer_heartbeat(second, group, "member-b", 0, ["cgh-nodes"])
            assert (b.member_epoch, assigned(b)) == (2, {})
            a = consumer_heartbeat(first, group, "member-a", 1, owned=[(topic_id, [0, 1])])
            [kept] = assigned(a)[topic_id]
            assert not assigned(consumer_heartbeat(second, group, "member-b", 2, owned=[]))
            consumer_heartbeat(first, group, "member-a", 1, owned=[(topic_id, [kept])])
            b = consumer_heartbeat(second, group, "member-b", 2, owned=[])
            assert assigned(b) == {topic_id: [1 - kept]}
    finally:
        stop_in_process_server(other)


def test_a_regular_expression_subscription_takes_every_matching_topic_also_one_created_later(module_kafka_server):
    server = module_kafka_server
    group = "cgh-regex-group"
    create_topic(server, "cgh-regex-one", 1)
    create_topic(server, "cgh-regex-two", 1)
    create_topic(server, "cgh-other-regex", 1)
    member = ConfluentMember(server, group, "^cgh-regex-.*", **CONSUMER)
    try:
        poll_until(
            [member],
            lambda _: {tp.topic for tp in member.consumer.assignment()} == {"cgh-regex-one", "cgh-regex-two"},
            "both matching topics assigned",
        )
        create_topic(server, "cgh-regex-three", 1)
        poll_until(
            [member],
            lambda _: (
                {tp.topic for tp in member.consumer.assignment()}
                == {"cgh-regex-one", "cgh-regex-two", "cgh-regex-three"}
            ),
            "the topic created since assigned too",
        )
    finally:
        member.close()
    with RawConnection(bootstrap(server)) as connection:
        refused = consumer_heartbeat(connection, group, "member-x", 0, [], regex="cgh-(")
        assert refused.error_code == KafkaError.invalid_regular_expression and refused.error_message
        # An expression a backtracking engine takes exponential time over (Python's re: 2**40 steps
        # on this name) is answered at once: PostgreSQL matches it.
        create_topic(server, "a" * 40 + "b", 1)
        started = time.monotonic()
        joined = consumer_heartbeat(connection, "cgh-regex-slow", "member-y", 0, [], regex="(a+)+")
        assert joined.error_code == KafkaError.none and not assigned(joined)
        assert time.monotonic() - started < 5


def test_a_restart_does_not_count_against_a_member_revoking_its_partitions(postgres):
    """The time no server could hear the members (every node down) is given back to a revocation
    underway, as to sessions: a member revoking within its rebalance timeout when the server stopped
    is still a member after a restart longer than that timeout."""
    settings = {**KAFKA_SERVER_SETTINGS, "group_consumer_session_timeout_ms": 5000}
    settings.update(kafka_listener="127.0.0.1:0", group_session_check_interval_ms=100)
    running = start_server_on_fresh_database(postgres, "kafka_cgh_restart", **settings)
    topic_id = _topic(running, "cgh-restart", 2)
    group = "cgh-restart-group"
    brief = datetime.timedelta(milliseconds=1500)
    with RawConnection(bootstrap(running)) as connection:
        consumer_heartbeat(connection, group, "member-a", 0, ["cgh-restart"], rebalance_timeout=brief)
        consumer_heartbeat(connection, group, "member-b", 0, ["cgh-restart"])
        [kept] = assigned(consumer_heartbeat(connection, group, "member-a", 1, owned=[(topic_id, [0, 1])]))[topic_id]
    # Down longer than the rebalance timeout, shorter than the session.
    with restarted_after(running, 2, **settings) as restarted:
        time.sleep(0.5)  # the first session check (every 100 ms) credits the time nobody heard them
        with RawConnection(bootstrap(restarted)) as connection:
            a = consumer_heartbeat(connection, group, "member-a", 1, owned=[(topic_id, [kept])])
            assert a.error_code == KafkaError.none and a.member_epoch == 2


def test_a_static_member_comes_back_to_its_partitions_without_a_rebalance(module_kafka_server):
    """A static member (group.instance.id) stopping leaves with epoch -2 and keeps its partitions; its
    instance joining again under a new member id takes them back at once, the group epoch unchanged;
    a second live member with that instance id is UNRELEASED_INSTANCE_ID; once its session lapses
    without it coming back, the others get its partitions."""
    server = module_kafka_server
    topic_id = _topic(server, "cgh-static", 2)
    group = "cgh-static-group"
    with RawConnection(bootstrap(server)) as connection:
        consumer_heartbeat(connection, group, "first-a", 0, ["cgh-static"], instance="instance-a")
        consumer_heartbeat(connection, group, "member-b", 0, ["cgh-static"])
        a = consumer_heartbeat(connection, group, "first-a", 1, owned=[(topic_id, [0, 1])], instance="instance-a")
        [kept] = assigned(a)[topic_id]
        a = consumer_heartbeat(connection, group, "first-a", 1, owned=[(topic_id, [kept])])
        b = consumer_heartbeat(connection, group, "member-b", 2, owned=[])
        assert a.member_epoch == 2 and assigned(b) == {topic_id: [1 - kept]}
        stopped = consumer_heartbeat(connection, group, "first-a", -2, instance="instance-a")
        assert (stopped.error_code, stopped.member_epoch) == (KafkaError.none, -2)
        # Its partition stays its own: nobody else gets it meanwhile.
        b = consumer_heartbeat(connection, group, "member-b", 2, owned=[(topic_id, [1 - kept])])
        assert b.error_code == KafkaError.none and b.member_epoch == 2 and not assigned(b)
        back = consumer_heartbeat(connection, group, "second-a", 0, ["cgh-static"], instance="instance-a")
        assert back.error_code == KafkaError.none and back.member_epoch == 2
        assert assigned(back) == {topic_id: [kept]}
        twin = consumer_heartbeat(connection, group, "third-a", 0, ["cgh-static"], instance="instance-a")
        assert twin.error_code == KafkaError.unreleased_instance_id and twin.error_message
        assert consumer_heartbeat(connection, group, "first-a", 2).error_code == KafkaError.unknown_member_id
        # Stopped again and not back within its session (1.5 s): removed, its partition reassigned.
        consumer_heartbeat(connection, group, "second-a", -2, instance="instance-a")
        deadline = time.monotonic() + 5
        while assigned(b) != {topic_id: [0, 1]}:
            assert time.monotonic() < deadline, "the static member's partition was never reassigned"
            time.sleep(0.2)
            b = consumer_heartbeat(connection, group, "member-b", b.member_epoch, owned=[(topic_id, [1 - kept])])


def test_a_static_member_stopping_while_revoking_frees_those_partitions_and_keeps_its_place(module_kafka_server):
    """Regression: a static member stopping (epoch -2) while it was asked to give up a partition kept
    that partition pending revocation, so the member waiting for it went on waiting, and its
    revocation deadline then removed it, its kept partitions and its place with it, though a static
    member that stopped waits for its instance until its session lapses. Kafka's coordinator
    (consumerGroupStaticMemberGroupLeave) clears the leaving static member's pending revocation:
    the other member gets it at once, and no revocation timer is left to remove the member."""
    server = module_kafka_server
    topic_id = _topic(server, "cgh-static-revoking", 2)
    group = "cgh-static-revoking-group"
    brief = datetime.timedelta(milliseconds=300)
    with RawConnection(bootstrap(server)) as connection:
        a = consumer_heartbeat(
            connection, group, "first-a", 0, ["cgh-static-revoking"], instance="instance-a", rebalance_timeout=brief
        )
        assert assigned(a) == {topic_id: [0, 1]}
        b = consumer_heartbeat(connection, group, "member-b", 0, ["cgh-static-revoking"])
        a = consumer_heartbeat(connection, group, "first-a", 1, owned=[(topic_id, [0, 1])], instance="instance-a")
        [kept] = assigned(a)[topic_id]  # the other one to revoke, within 300 ms
        stopped = consumer_heartbeat(connection, group, "first-a", -2, instance="instance-a")
        assert (stopped.error_code, stopped.member_epoch) == (KafkaError.none, -2)
        b = consumer_heartbeat(connection, group, "member-b", b.member_epoch, owned=[])
        assert b.error_code == KafkaError.none and assigned(b) == {topic_id: [1 - kept]}
        time.sleep(0.8)  # past the revocation deadline: the eviction worker (every 100 ms) has looked
        assert "first-a" in _member_ids(server, group)
        back = consumer_heartbeat(connection, group, "second-a", 0, ["cgh-static-revoking"], instance="instance-a")
        assert back.error_code == KafkaError.none and assigned(back) == {topic_id: [kept]}


def test_a_leave_naming_an_instance_id_is_that_static_members_only(module_kafka_server):
    """Regression: a leave (epoch -1 or -2) naming an instance id was taken as the leave of the
    member it named by member id, whatever its instance: a dynamic member "leaving" as a static one
    (-2) stayed, with its partitions, until its session lapsed, which no instance could end by
    coming back. Kafka's coordinator (consumerGroupLeave) finds the static member by the instance
    id: none is UNKNOWN_MEMBER_ID, another member's is FENCED_INSTANCE_ID."""
    server = module_kafka_server
    topic_id = _topic(server, "cgh-static-leave", 2)
    group = "cgh-static-leave-group"
    with RawConnection(bootstrap(server)) as connection:
        consumer_heartbeat(connection, group, "static-a", 0, ["cgh-static-leave"], instance="instance-a")
        dynamic = consumer_heartbeat(connection, group, "dynamic-b", 0, ["cgh-static-leave"])
        unknown = consumer_heartbeat(connection, group, "dynamic-b", -2, instance="instance-nobody")
        assert unknown.error_code == KafkaError.unknown_member_id and "instance-nobody" in unknown.error_message
        fenced = consumer_heartbeat(connection, group, "dynamic-b", -2, instance="instance-a")
        assert fenced.error_code == KafkaError.fenced_instance_id and "static-a" in fenced.error_message
        b = consumer_heartbeat(connection, group, "dynamic-b", dynamic.member_epoch, owned=[])
        assert b.error_code == KafkaError.none and b.member_epoch == dynamic.member_epoch
        left = consumer_heartbeat(connection, group, "static-a", -1, instance="instance-a")
        assert (left.error_code, left.member_epoch) == (KafkaError.none, -1)
        b = consumer_heartbeat(connection, group, "dynamic-b", b.member_epoch, owned=[])
        assert assigned(b) == {topic_id: [0, 1]}


def test_a_restarted_static_consumer_gets_its_partitions_back_and_the_other_keeps_its_own(module_kafka_server):
    server = module_kafka_server
    topic, group = "cgh-static-client", "cgh-static-client-group"
    create_topic(server, topic, 4)
    static = _member(server, group, topic, **{"group.instance.id": "static-one"})
    other = _member(server, group, topic)
    try:
        poll_until([static, other], _assignments_are([static, other], [2, 2]), "2 + 2 partitions")
        owned, others = static.assignment(), other.assignment()
        callbacks = len(other.rebalances)
        static.close()
        static = _member(server, group, topic, **{"group.instance.id": "static-one"})
        poll_until([static, other], lambda _: static.assignment() == owned, "the restarted instance owns its 2")
        assert other.assignment() == others and len(other.rebalances) == callbacks  # no rebalance for it
    finally:
        static.close()
        other.close()


# ---- regular expressions, resolved once per group (Kafka's coordinator: resolvedRegularExpressions)


def _heartbeat_as_owner(connection, group: str, member: str, answer, owned: dict):
    """The member's next heartbeat, owning what its answers gave it (`owned`: topic id ->
    partitions, updated in place), as a consumer that revokes and takes what it is told at once."""
    answer = consumer_heartbeat(connection, group, member, answer.member_epoch, owned=sorted(owned.items()))
    assert answer.error_code == KafkaError.none, answer.error_message
    if answer.assignment is not None:
        owned.clear()
        owned.update(assigned(answer))
    return answer


def test_the_heartbeat_bringing_a_new_regex_gets_the_literal_topics_first_and_the_matches_after(module_kafka_server):
    """Regression: the heartbeat that brought a regular expression was answered with its matching
    topics at once. Kafka's coordinator resolves a regex new to the group after answering (in the
    background): that heartbeat gets the literal topics only, and the resolution bumps the group
    epoch, so the next heartbeat gets the matches too (librdkafka's 0045 resubscribe_with_regex
    counts on it)."""
    server = module_kafka_server
    literal_id = _topic(server, "cgh-first-literal", 1)
    matched_id = _topic(server, "cgh-first-matched-1", 2)
    group = "cgh-first-group"
    with RawConnection(bootstrap(server)) as connection:
        joined = consumer_heartbeat(
            connection, group, "member-a", 0, ["cgh-first-literal"], regex="cgh-first-matched-.*"
        )
        assert joined.error_code == KafkaError.none
        assert assigned(joined) == {literal_id: [0]}
        after = consumer_heartbeat(connection, group, "member-a", joined.member_epoch, owned=[(literal_id, [0])])
        assert after.member_epoch == joined.member_epoch + 1
        assert assigned(after) == {literal_id: [0], matched_id: [0, 1]}


def test_two_members_of_one_regex_split_a_topic_created_later_without_one_taking_it_all_first(module_kafka_server):
    """Regression: each member resolved its regular expression at its own heartbeat, so of two
    members with one regex the first to heartbeat after a matching topic appeared was assigned all
    of it, and gave half up at the other's next heartbeat (a revocation more; librdkafka's 0113
    n_wildcard counts none). The group resolves the regex once for both: the resolution's epoch
    gives each its half at once."""
    server = module_kafka_server
    group, regex = "cgh-split-group", "cgh-split-.*"
    owned_a: dict = {}
    owned_b: dict = {}
    with RawConnection(bootstrap(server)) as connection:
        a = consumer_heartbeat(connection, group, "member-a", 0, [], regex=regex)
        b = consumer_heartbeat(connection, group, "member-b", 0, [], regex=regex)
        a = _heartbeat_as_owner(connection, group, "member-a", a, owned_a)
        b = _heartbeat_as_owner(connection, group, "member-b", b, owned_b)
        assert (owned_a, owned_b) == ({}, {})
        topic_id = _topic(server, "cgh-split-later", 4)
        # A's heartbeat resolves the regex for both: B's topics (HTTP's view) have the new one too.
        a = _heartbeat_as_owner(connection, group, "member-a", a, owned_a)
        members = server.client.get(f"/v1/groups/{group}").json()["members"]
        assert {m["member_id"]: m["topics"] for m in members} == {
            "member-a": ["cgh-split-later"],
            "member-b": ["cgh-split-later"],
        }
        most_a = most_b = 0
        for _ in range(6):
            a = _heartbeat_as_owner(connection, group, "member-a", a, owned_a)
            b = _heartbeat_as_owner(connection, group, "member-b", b, owned_b)
            most_a = max(most_a, len(owned_a.get(topic_id, [])))
            most_b = max(most_b, len(owned_b.get(topic_id, [])))
        assert sorted(owned_a[topic_id] + owned_b[topic_id]) == [0, 1, 2, 3]
        assert (most_a, most_b) == (2, 2), "a member was given more than its half before the split"


def test_a_replaced_static_members_old_member_id_is_fenced_by_its_instance(module_kafka_server):
    """Regression: a static member's instance joining again under a new member id replaces it; the
    old member id heartbeating again (with its instance id) was answered UNKNOWN_MEMBER_ID. Kafka's
    coordinator finds a static member by its instance id and answers FENCED_INSTANCE_ID (another
    consumer has this group.instance.id: librdkafka's fatal error), UNKNOWN_MEMBER_ID only when no
    member has the instance id."""
    server = module_kafka_server
    _topic(server, "cgh-fenced", 1)
    group = "cgh-fenced-group"
    with RawConnection(bootstrap(server)) as connection:
        first = consumer_heartbeat(connection, group, "first-a", 0, ["cgh-fenced"], instance="instance-a")
        consumer_heartbeat(connection, group, "first-a", -2, instance="instance-a")
        back = consumer_heartbeat(connection, group, "second-a", 0, ["cgh-fenced"], instance="instance-a")
        assert back.error_code == KafkaError.none
        old = consumer_heartbeat(connection, group, "first-a", first.member_epoch, instance="instance-a")
        assert old.error_code == KafkaError.fenced_instance_id and "second-a" in old.error_message
        nobody = consumer_heartbeat(connection, group, "second-a", back.member_epoch, instance="instance-nobody")
        assert nobody.error_code == KafkaError.unknown_member_id and "instance-nobody" in nobody.error_message
        still = consumer_heartbeat(connection, group, "second-a", back.member_epoch, instance="instance-a")
        assert still.error_code == KafkaError.none


def test_a_topic_committed_late_is_resolved_even_when_another_was_deleted_meanwhile(module_kafka_server):
    """Regression: a regex was resolved again only when the topics' count or highest id changed.
    Topic ids come from a sequence but creations commit in any order: a topic whose creation
    committed after a later-numbered one's, as another topic was deleted, left both unchanged, and
    the group never resolved it (its partitions unassigned until some other topic changed)."""
    server = module_kafka_server
    group, regex = "cgh-late-group", "cgh-late-match-.*"
    doomed_id = _topic(server, "cgh-late-match-doomed", 1)
    loop = asyncio.new_event_loop()
    creating = loop.run_until_complete(asyncpg.connect(server.database_url))
    try:
        loop.run_until_complete(database._init_connection(creating))
        owned: dict = {}
        with RawConnection(bootstrap(server)) as connection:
            a = consumer_heartbeat(connection, group, "member-a", 0, [], regex=regex)
            a = _heartbeat_as_owner(connection, group, "member-a", a, owned)
            assert owned == {doomed_id: [0]}
            # Its topic id is taken now, its row visible only once this transaction commits.
            transaction = creating.transaction()
            loop.run_until_complete(transaction.start())
            loop.run_until_complete(topics.create_topic(creating, "cgh-late-match-slow", 2, {}))
            _topic(server, "cgh-late-unmatched", 1)  # a higher topic id, committed first
            a = _heartbeat_as_owner(connection, group, "member-a", a, owned)
            loop.run_until_complete(transaction.commit())
            assert server.client.delete("/v1/topics/cgh-late-match-doomed").status_code in (200, 204)
            slow_id = topic_uuid(server.client.get("/v1/topics/cgh-late-match-slow").json()["topic_id"])
            for _ in range(4):
                a = _heartbeat_as_owner(connection, group, "member-a", a, owned)
            assert owned == {slow_id: [0, 1]}, "the topic committed late was never resolved"
    finally:
        loop.run_until_complete(creating.close())
        loop.close()


def _as_written_before_regexes_were_resolved_per_group(server, group: str) -> None:
    """Takes the group's resolutions out of its state, as a server before that change wrote it
    (each member's topics already its regex's matches)."""

    async def strip() -> None:
        connection = await asyncpg.connect(server.database_url)
        try:
            await connection.execute(
                "UPDATE consumer_groups SET assignment = jsonb_set(assignment, ARRAY[$2::text], "
                "(assignment -> $2) - 'regexes' - 'topics_fingerprint') WHERE group_id = $1",
                group,
                "consumer group state",
            )
        finally:
            await connection.close()

    asyncio.run(strip())


def test_a_group_saved_before_regexes_were_resolved_per_group_keeps_its_members_topics(module_kafka_server):
    """Regression: a group whose state was written before the group resolved its regexes (an
    upgrade) has no resolutions: the first heartbeat of a member with a regex took its topics to be
    its names only, bumped the group epoch and told it to revoke every partition of its regex
    (resolved again after the answer, they came back at the next heartbeat): one needless
    revocation of every such partition at the upgrade."""
    server = module_kafka_server
    topic_id = _topic(server, "cgh-legacy-match-1", 2)
    group = "cgh-legacy-group"
    owned: dict = {}
    with RawConnection(bootstrap(server)) as connection:
        a = consumer_heartbeat(connection, group, "member-a", 0, [], regex="cgh-legacy-match-.*")
        for _ in range(2):
            a = _heartbeat_as_owner(connection, group, "member-a", a, owned)
        assert owned == {topic_id: [0, 1]}
        epoch = a.member_epoch
        _as_written_before_regexes_were_resolved_per_group(server, group)
        a = _heartbeat_as_owner(connection, group, "member-a", a, owned)
        assert (a.member_epoch, owned) == (epoch, {topic_id: [0, 1]}), "the upgrade revoked the regex's partitions"


def test_a_regex_whose_parenthesis_closes_the_whole_name_match_early_is_refused(module_kafka_server):
    """Regression: the regex is matched against the whole name as '^(?:' + regex + ')$', so one with
    an unbalanced ')' (invalid for Kafka's RE2J: INVALID_REGULAR_EXPRESSION) closed that group
    early and compiled: 'cgh-escape-t)|(x' matched every name that merely starts with
    'cgh-escape-t', and the member was given topics its expression does not name."""
    server = module_kafka_server
    _topic(server, "cgh-escape-target", 1)
    with RawConnection(bootstrap(server)) as connection:
        joined = consumer_heartbeat(connection, "cgh-escape-group", "member-a", 0, [], regex="cgh-escape-t)|(x")
        assert joined.error_code == KafkaError.invalid_regular_expression, assigned(joined)
        assert "cgh-escape-t)|(x" in joined.error_message


def test_a_case_insensitive_regex_matches_whole_names_whatever_their_case(module_kafka_server):
    """Regression: RE2's leading `(?i)` (a case-insensitive expression, as Kafka's coordinator takes
    it) was put inside the '^(?:...)$' that anchors it, where PostgreSQL's expressions do not take
    embedded options: the heartbeat was INVALID_REGULAR_EXPRESSION. It is kept in front now, and
    the expression still matches whole names only."""
    server = module_kafka_server
    matched_id = _topic(server, "cgh-case-topic", 1)
    _topic(server, "cgh-case-topic-longer-x", 1)  # matched by a prefix only: not whole
    with RawConnection(bootstrap(server)) as connection:
        joined = consumer_heartbeat(connection, "cgh-case-group", "member-a", 0, [], regex="(?i)CGH-CASE-TOPIC")
        assert joined.error_code == KafkaError.none, joined.error_message
        after = consumer_heartbeat(connection, "cgh-case-group", "member-a", joined.member_epoch, owned=[])
        assert assigned(after) == {matched_id: [0]}
