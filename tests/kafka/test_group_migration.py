"""Kafka 4's online migration between a classic group of Kafka consumers and a KIP-848 consumer
group (GroupMetadataManager's, group.consumer.migration.policy=BIDIRECTIONAL): a member joining
with `group.protocol=consumer` converts the classic group, whose members stay, served over JoinGroup,
SyncGroup and Heartbeat by the consumer group's assignment; when the last member of the consumer
protocol leaves, the group is classic again and rebalances. Real clients, a real server."""

from __future__ import annotations

import time

from confluent_kafka import KafkaException

from app.kafka import api_table
from tests.kafka.clients import WAIT_S, ConfluentKafka, bootstrap, create_topic
from tests.kafka.group_clients import ConfluentMember
from tests.kafka.raw import RawConnection, request_of

KAFKA_SERVER_SETTINGS = {
    "group_consumer_session_timeout_ms": 1500,
    "group_consumer_heartbeat_interval_ms": 100,
    "group_session_check_interval_ms": 100,
}
# The classic members' own timings, as short (the shared server takes sessions from 100 ms).
CLASSIC = {"session.timeout.ms": 1500, "heartbeat.interval.ms": 100}
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
        self.redelivered_after_commit: list[bytes] = []

    def poll(self) -> None:
        for member in self.members:
            for record in member.poll():
                if record.value in self.committed:
                    self.redelivered_after_commit.append(record.value)
                self.seen.append(record.value)
                try:
                    member.commit()
                except KafkaException:
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


def test_a_classic_group_upgrades_to_a_consumer_group_and_back_while_its_members_consume(module_kafka_server):
    server = module_kafka_server
    topic, group = "migrate", "migrate-group"
    create_topic(server, topic, 4)
    produced = _produce(server, topic, 40, "before")
    staying = ConfluentMember(server, group, topic, **CLASSIC)
    restarted = ConfluentMember(server, group, topic, **CLASSIC)
    run = Consuming([staying, restarted])
    try:
        run.until(lambda: run.split([2, 2]) and produced <= set(run.seen), "two classic members split 4 partitions")
        assert _listed(server, group) == ("classic", "Stable")

        # One member restarted with the consumer protocol: the group becomes a consumer group, the
        # classic member stays in it and gives up the partitions the new member is to get.
        restarted.close()
        run.members.remove(restarted)
        upgraded = ConfluentMember(server, group, topic, **CONSUMER)
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
        produced |= _produce(server, topic, 40, "downgraded")
        run.until(
            lambda: run.assignments() == [{0, 1, 2, 3}] and produced <= set(run.seen),
            "the classic member owns all 4 partitions again",
        )
        assert _listed(server, group) == ("classic", "Stable")
        assert set(run.seen) == produced, "a record was consumed that was never produced"
        assert not run.redelivered_after_commit, (
            f"records handed out again after their commit: {run.redelivered_after_commit}"
        )
    finally:
        for member in run.members:
            member.close()
