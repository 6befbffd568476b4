"""Kafka 4's online migration between a classic group of Kafka consumers and a KIP-848 consumer
group (GroupMetadataManager's, group.consumer.migration.policy=BIDIRECTIONAL): a member joining
with `group.protocol=consumer` converts the classic group, whose members stay, served over JoinGroup,
SyncGroup and Heartbeat by the consumer group's assignment; when the last member of the consumer
protocol leaves, the group is classic again and rebalances. Real clients, a real server."""

from __future__ import annotations

import dataclasses
import io
import time

import pytest
from confluent_kafka import KafkaException
from kafka.errors import KafkaError as KafkaPythonError
from kio.schema.consumer_protocol_subscription.v1.data import ConsumerProtocolSubscription as SubscriptionV1
from kio.schema.consumer_protocol_subscription.v1.data import TopicPartition as OwnedV1
from kio.schema.errors import ErrorCode as KafkaError
from kio.serial import entity_writer

from app.coordinator.classic_groups import assigned_partitions
from app.kafka import api_table
from tests.api.test_consumer_groups import fetch_offsets
from tests.kafka.clients import WAIT_S, ConfluentKafka, bootstrap, create_topic, topic_uuid
from tests.kafka.group_clients import ConfluentMember, KafkaPythonMember
from tests.kafka.raw import RawConnection, request_of
from tests.kafka.raw_groups import (
    assigned,
    commit,
    consumer_assignment,
    consumer_heartbeat,
    heartbeat,
    join,
    join_request,
    sync,
)

KAFKA_SERVER_SETTINGS = {
    "group_consumer_session_timeout_ms": 1500,
    "group_consumer_heartbeat_interval_ms": 100,
    "group_session_check_interval_ms": 100,
}
# The classic members, with their own short timings (the shared server takes sessions from 100 ms).
CLASSIC_MEMBERS = {
    "confluent-kafka": lambda server, group, topic: ConfluentMember(
        server, group, topic, **{"session.timeout.ms": 1500, "heartbeat.interval.ms": 100}
    ),
    "kafka-python": lambda server, group, topic: KafkaPythonMember(
        server, group, topic, session_timeout_ms=3000, heartbeat_interval_ms=100
    ),
}
CONSUMER = {"group.protocol": "consumer"}


def _produce(server, topic: str, count: int, tag: str) -> set[bytes]:
    values = {f"{tag}-{i}".encode() for i in range(count)}
    ConfluentKafka().produce(server, topic, [{"key": value, "value": value} for value in sorted(values)])
    return values


def _listed(server, group: str) -> tuple[str, str]:
    """(group type, state) as ListGroups v5 lists the group."""
    with RawConnection(bootstrap(server)) as connection:
        answer = connection.call(request_of(api_table.LIST_GROUPS, 5, states_filter=(), types_filter=()))
    [found] = [(g.group_type, g.group_state) for g in answer.groups if g.group_id == group]
    return found


class Consuming:
    """Members consuming one topic, each committing every record it takes (at least once): a record
    whose commit succeeded is never handed to another member again, and no record is lost."""

    def __init__(self, members: list) -> None:
        self.members = list(members)
        self.seen: list[bytes] = []
        self.committed: set[bytes] = set()
        self.redelivered_after_commit: list[tuple[str, bytes]] = []  # (the phase, the record's value)
        self.phase = "classic"

    def poll(self) -> None:
        for member in self.members:
            for record in member.poll():
                if record.value in self.committed:
                    self.redelivered_after_commit.append((self.phase, record.value))
                self.seen.append(record.value)
                try:
                    member.commit()
                except (KafkaException, KafkaPythonError):
                    continue  # a rebalance under way: this record may come again (at least once)
                self.committed.add(record.value)

    def until(self, condition, what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            self.poll()
            if condition():
                return
        raise AssertionError(f"not reached within {WAIT_S} s: {what}; assignments {self.assignments()}")

    def assignments(self) -> list[set[int]]:
        return [member.assignment() for member in self.members]

    def split(self, sizes: list[int]) -> bool:
        owned = self.assignments()
        every = [p for partitions in owned for p in partitions]
        return sorted(len(p) for p in owned) == sizes and len(every) == len(set(every))


@pytest.mark.parametrize("classic_client", sorted(CLASSIC_MEMBERS))
def test_a_classic_group_upgrades_to_a_consumer_group_and_back_while_its_members_consume(
    module_kafka_server, classic_client
):
    server = module_kafka_server
    topic, group = f"migrate-{classic_client}", f"migrate-{classic_client}-group"
    create_topic(server, topic, 4)
    produced = _produce(server, topic, 40, "before")
    staying = CLASSIC_MEMBERS[classic_client](server, group, topic)
    restarted = CLASSIC_MEMBERS[classic_client](server, group, topic)
    run = Consuming([staying, restarted])
    try:
        run.until(lambda: run.split([2, 2]) and produced <= set(run.seen), "two classic members split 4 partitions")
        assert _listed(server, group) == ("classic", "Stable")

        # One member restarted with the consumer protocol: the group becomes a consumer group, the
        # classic member stays in it and gives up the partitions the new member is to get.
        restarted.close()
        run.members.remove(restarted)
        upgraded = ConfluentMember(server, group, topic, **CONSUMER)
        run.phase = "upgrading"
        run.members.append(upgraded)
        produced |= _produce(server, topic, 40, "upgrading")
        run.until(
            lambda: run.split([2, 2]) and produced <= set(run.seen) and _listed(server, group)[1] == "Stable",
            "the classic and the consumer-protocol member split 4 partitions",
        )
        assert _listed(server, group) == ("consumer", "Stable")
        described = server.client.get(f"/v1/groups/{group}").json()
        assert described["group_type"] == "consumer"
        assert len(described["members"]) == 2
        produced |= _produce(server, topic, 40, "upgraded")
        run.until(lambda: produced <= set(run.seen), "both members consume the new records")

        # The consumer-protocol member leaves: the group is classic again, the classic member takes all.
        upgraded.close()
        run.members.remove(upgraded)
        run.phase = "downgrading"
        produced |= _produce(server, topic, 40, "downgraded")
        run.until(
            lambda: run.assignments() == [{0, 1, 2, 3}] and produced <= set(run.seen),
            "the classic member owns all 4 partitions again",
        )
        assert _listed(server, group) == ("classic", "Stable")
        assert set(run.seen) == produced, "a record was consumed that was never produced"
        # The at-least-once bound holds for members that hand out a record only from a poll of the
        # partitions they own, and commit it before the next poll (confluent-kafka). The kafka-python
        # helper polls on a thread of its own (group_clients.py), so a record it took before a
        # rebalance reaches the test after its partition moved: its commit (of the positions of the
        # partitions owned then) does not cover that record, which its next owner reads again, in
        # a classic group as much as here.
        assert classic_client != "confluent-kafka" or not run.redelivered_after_commit, (
            f"records handed out again after their commit: {run.redelivered_after_commit}"
        )
    finally:
        for member in run.members:
            member.close()


# ---- raw requests: the rules each step follows


def _subscription(topics: list[str], owned: dict[str, list[int]] | None = None) -> bytes:
    """A consumer's JoinGroup metadata: a ConsumerProtocolSubscription v1 (with the partitions it owns)."""
    buffer = io.BytesIO()
    entity_writer(SubscriptionV1)(
        buffer,
        SubscriptionV1(
            topics=tuple(topics),
            owned_partitions=tuple(OwnedV1(topic=t, partitions=tuple(ps)) for t, ps in (owned or {}).items()),
        ),
    )
    return (1).to_bytes(2, "big") + buffer.getvalue()


def _assignment(answer) -> dict[str, list[int]]:
    return assigned_partitions("consumer", answer.assignment)


def _topic_of_two_partitions(server, topic: str):
    """Creates the topic (two partitions); its id."""
    create_topic(server, topic, 2)
    return topic_uuid(server.client.get(f"/v1/topics/{topic}").json()["topic_id"])


def _classic_member_owning_both(connection, group: str, topic: str, instance: str | None = None) -> tuple[str, int]:
    """A classic group of one Kafka consumer (static with an `instance` id) owning the topic's two
    partitions: its member id and generation."""
    joined = join(
        connection, group, "", metadata=_subscription([topic]), instance=instance, version=5 if instance else 3
    )
    classic_id, generation = joined.member_id, joined.generation_id
    synced = sync(connection, group, classic_id, generation, {classic_id: consumer_assignment({topic: [0, 1]})})
    assert synced.error_code == KafkaError.none
    return classic_id, generation


def test_the_steps_of_an_upgrade_and_a_downgrade_as_kafka_takes_them(module_kafka_server):
    server = module_kafka_server
    topic, group = "migrate-raw", "migrate-raw-group"
    topic_id = _topic_of_two_partitions(server, topic)
    with RawConnection(bootstrap(server)) as connection:
        # A classic group of one Kafka consumer owning both partitions.
        classic_id, generation = _classic_member_owning_both(connection, group, topic)
        assert commit(connection, group, classic_id, generation, None, topic, 5) == KafkaError.none

        # A member of the consumer protocol joins: the group is a consumer group, the classic member
        # still owns both partitions (nobody else gets them until it gave one up).
        joining = consumer_heartbeat(connection, group, "member-new", 0, [topic])
        assert joining.error_code == KafkaError.none and assigned(joining) == {}
        assert joining.member_epoch == generation + 1
        assert _listed(server, group)[0] == "consumer"
        # Its old generation's commits still go (its epoch is its generation), a wrong one is refused
        # as a classic member knows it.
        assert commit(connection, group, classic_id, generation, None, topic, 6) == KafkaError.none
        assert commit(connection, group, classic_id, generation + 5, None, topic, 6) == KafkaError.illegal_generation
        # Its heartbeat tells it to rejoin; rejoining, it still owns both: it is told its new
        # assignment (one partition) at its old epoch, and to rejoin once it gave the other up.
        assert heartbeat(connection, group, classic_id, generation).error_code == KafkaError.rebalance_in_progress
        rejoined = join(connection, group, classic_id, metadata=_subscription([topic], {topic: [0, 1]}), version=3)
        assert (rejoined.error_code, rejoined.generation_id, rejoined.protocol_name) == (
            KafkaError.none,
            generation,
            "range",
        )
        kept = sync(connection, group, classic_id, generation, {})
        assert kept.error_code == KafkaError.none and len(_assignment(kept)[topic]) == 1
        [given_up] = sorted({0, 1} - set(_assignment(kept)[topic]))
        still = consumer_heartbeat(connection, group, "member-new", joining.member_epoch)
        assert assigned(still) in (None, {}), "a partition the classic member still owns was given away"
        # ConsumerGroupDescribe v1 tells each member's protocol (KIP-1099: 0 classic, 1 consumer).
        [described] = connection.call(
            request_of(api_table.CONSUMER_GROUP_DESCRIBE, 1, group_ids=(group,), include_authorized_operations=False)
        ).groups
        assert {m.member_id: m.member_type for m in described.members} == {classic_id: 0, "member-new": 1}
        assert heartbeat(connection, group, classic_id, generation).error_code == KafkaError.rebalance_in_progress
        moved = join(connection, group, classic_id, metadata=_subscription([topic], _assignment(kept)), version=3)
        assert moved.generation_id == joining.member_epoch
        assert sync(connection, group, classic_id, moved.generation_id, {}).error_code == KafkaError.none
        assert heartbeat(connection, group, classic_id, moved.generation_id).error_code == KafkaError.none
        got = consumer_heartbeat(connection, group, "member-new", joining.member_epoch)
        assert assigned(got) == {topic_id: [given_up]}
        assert _listed(server, group) == ("consumer", "Stable")
        # A stale generation is refused as Kafka refuses it to a classic member.
        assert heartbeat(connection, group, classic_id, generation).error_code == KafkaError.illegal_generation

        # The consumer-protocol member leaves: a classic group again, rebalancing, its offsets kept.
        left = consumer_heartbeat(connection, group, "member-new", -1)
        assert left.error_code == KafkaError.none
        assert _listed(server, group) == ("classic", "PreparingRebalance")
        assert heartbeat(connection, group, classic_id, moved.generation_id).error_code == (
            KafkaError.rebalance_in_progress
        )
        alone = join(connection, group, classic_id, metadata=_subscription([topic]), version=3)
        assert (alone.error_code, alone.leader) == (KafkaError.none, classic_id)
        assert alone.generation_id > moved.generation_id
        assert _listed(server, group) == ("classic", "CompletingRebalance")
        [committed] = fetch_offsets(server.client, group, [(topic, 0)])
        assert committed["offset"] == 6


def test_groups_that_are_never_converted_refuse_the_consumer_protocol(module_kafka_server):
    server = module_kafka_server
    create_topic(server, "migrate-refused", 1)
    with RawConnection(bootstrap(server)) as connection:
        # An HTTP group with a member.
        http = server.client.post(
            "/v1/groups/migrate-http/heartbeat", json={"member_id": "", "topics": ["migrate-refused"]}
        )
        assert http.status_code == 200
        refused = consumer_heartbeat(connection, "migrate-http", "member-a", 0, ["migrate-refused"])
        assert refused.error_code == KafkaError.inconsistent_group_protocol and "HTTP" in refused.error_message
        # A classic group of another protocol type than Kafka consumers' (Kafka Connect's workers).
        request = join_request("migrate-connect", "", metadata=_subscription(["migrate-refused"]), version=3)
        answer = connection.call(dataclasses.replace(request, protocol_type="connect"))
        assert answer.error_code == KafkaError.none
        refused = consumer_heartbeat(connection, "migrate-connect", "member-a", 0, ["migrate-refused"])
        assert refused.error_code == KafkaError.inconsistent_group_protocol and "'connect'" in refused.error_message
        # A classic group's member heartbeating (not joining) with the consumer protocol converts nothing.
        joined = join(connection, "migrate-joined", "", metadata=_subscription(["migrate-refused"]), version=3)
        assert joined.error_code == KafkaError.none
        refused = consumer_heartbeat(connection, "migrate-joined", "member-a", 3, owned=[])
        assert refused.error_code == KafkaError.inconsistent_group_protocol
        assert _listed(server, "migrate-joined")[0] == "classic"


def test_a_member_that_rejoined_keeps_the_partitions_it_owns_when_its_rebalancing_group_converts(
    module_kafka_server,
):
    # A cooperative member keeps processing the partitions it owns while it rejoins (its JoinGroup
    # names them): a consumer-protocol member joining before its SyncGroup must not be given them,
    # as Kafka's conversion keeps the member's assignment of its generation.
    server = module_kafka_server
    topic, group = "migrate-rejoined", "migrate-rejoined-group"
    create_topic(server, topic, 2)
    with RawConnection(bootstrap(server)) as connection:
        classic_id, generation = _classic_member_owning_both(connection, group, topic)
        # It rejoins (a new generation, its SyncGroup not sent yet), still owning both partitions.
        rejoined = join(connection, group, classic_id, metadata=_subscription([topic], {topic: [0, 1]}), version=3)
        assert rejoined.error_code == KafkaError.none and rejoined.generation_id == generation + 1
        joining = consumer_heartbeat(connection, group, "member-new", 0, [topic])
        assert joining.error_code == KafkaError.none
        again = consumer_heartbeat(connection, group, "member-new", joining.member_epoch)
        assert assigned(joining) in (None, {}) and assigned(again) in (None, {}), (
            "a partition the rejoined classic member still owns was given to the consumer-protocol member"
        )


def test_a_static_member_restarted_with_the_classic_protocol_takes_its_place(module_kafka_server):
    # A rolling downgrade of static members: a member of the consumer protocol with an instance id
    # stops (epoch -2, it stays) and comes back as a classic consumer with that instance id: its
    # JoinGroup replaces it under a new member id, as Kafka's getOrMaybeSubscribeStaticConsumerGroupMember
    # replaces a static member whatever its protocol.
    server = module_kafka_server
    topic, group = "migrate-static-down", "migrate-static-down-group"
    create_topic(server, topic, 2)
    with RawConnection(bootstrap(server)) as connection:
        classic_id, generation = _classic_member_owning_both(connection, group, topic)
        static = consumer_heartbeat(connection, group, "member-static", 0, [topic], instance="instance-a")
        assert static.error_code == KafkaError.none
        stopped = consumer_heartbeat(connection, group, "member-static", -2, instance="instance-a")
        assert stopped.error_code == KafkaError.none
        back = join(connection, group, "", metadata=_subscription([topic]), instance="instance-a", version=5)
        assert back.error_code == KafkaError.none
        assert back.member_id not in ("", "member-static")
        # Its last member of the consumer protocol replaced, the group is a classic one again.
        assert _listed(server, group) == ("classic", "PreparingRebalance")


def test_a_static_classic_member_restarted_with_the_consumer_protocol_takes_its_place(module_kafka_server):
    # A rolling upgrade of static members: a classic consumer with an instance id stops without
    # leaving (as static members do) and comes back with group.protocol=consumer and that instance
    # id: its join replaces it at once, as Kafka's coordinator replaces a static member of the classic
    # protocol (only a consumer-protocol one must have left first: UNRELEASED_INSTANCE_ID).
    server = module_kafka_server
    topic, group = "migrate-static-up", "migrate-static-up-group"
    topic_id = _topic_of_two_partitions(server, topic)
    with RawConnection(bootstrap(server)) as connection:
        classic_id, generation = _classic_member_owning_both(connection, group, topic, "instance-a")
        back = consumer_heartbeat(connection, group, "member-up", 0, [topic], instance="instance-a")
        assert back.error_code == KafkaError.none, back.error_message
        assert _listed(server, group)[0] == "consumer"
        # It took the classic member's place and partitions.
        assert assigned(back) == {topic_id: [0, 1]}
        assert heartbeat(connection, group, classic_id, generation, "instance-a").error_code in (
            KafkaError.fenced_instance_id,
            KafkaError.unknown_member_id,
        )
