"""The classic group protocol's rules with raw requests (every field controlled): MEMBER_ID_REQUIRED
(JoinGroup v4+), a member that does not rejoin a rebalance in time is removed, a member whose
session lapses is evicted and the rest rebalance, OffsetFetch require_stable against a transaction
holding offsets; and groups of both doors: a group takes the kind of its first member, and
committed offsets are one set (HTTP resumes from a Kafka group's commits and the reverse)."""

from __future__ import annotations

import datetime
import threading
import time

from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.kafka import http_side
from tests.kafka.clients import create_topic
from tests.kafka.group_clients import MEMBERS, poll_until
from tests.kafka.raw import RawConnection, nested, request_of
from tests.kafka.raw_groups import (
    JOIN_VERSION,
    commit,
    commit_partitions,
    consumer_assignment,
    describe,
    heartbeat,
    join,
    join_request,
    leave,
    second_member_joins,
    sync,
)
from tests.kafka.raw_transactions import end_txn, init_producer, txn_offset_commit


def joined_member(bootstrap: str, group: str, **timeouts) -> tuple[str, int]:
    """A member that joined through MEMBER_ID_REQUIRED and synced as the group's only member. Its
    first join asks a long session whatever `timeouts` say: the pending member it leaves lives for
    that session (KIP-394), and a short one could lapse before the join that follows arrives, on a
    busy machine; the member then has the session its join asks."""
    with RawConnection(bootstrap) as connection:
        first = join(connection, group, **{**timeouts, "session": datetime.timedelta(seconds=30)})
        assert first.error_code == KafkaError.member_id_required and first.member_id
        assert first.generation_id == -1
        joined = join(connection, group, first.member_id, **timeouts)
        assert joined.error_code == KafkaError.none
        assert joined.leader == joined.member_id == first.member_id
        assert (
            sync(connection, group, joined.member_id, joined.generation_id, {joined.member_id: b"mine"}).assignment
            == b"mine"
        )
    return joined.member_id, joined.generation_id


def test_member_id_required_then_a_member_that_does_not_rejoin_in_time_is_removed(module_kafka_server):
    bootstrap = module_kafka_server.extra["kafka_bootstrap"]
    group = "raw-rejoin"
    old_member, generation = joined_member(bootstrap, group)
    with RawConnection(bootstrap) as connection:
        # A second member's join starts a rebalance the first never rejoins: after its rebalance
        # timeout it is removed and the second completes the rebalance alone, as leader.
        first = join(connection, group)
        joined = join(connection, group, first.member_id)
        assert joined.error_code == KafkaError.none
        assert (joined.generation_id, joined.leader) == (generation + 1, first.member_id)
        assert [m.member_id for m in joined.members] == [first.member_id]
        assert heartbeat(connection, group, old_member, generation).error_code == KafkaError.unknown_member_id
        assert heartbeat(connection, group, first.member_id, generation).error_code == KafkaError.illegal_generation


def test_a_member_whose_session_lapses_is_evicted_and_the_rest_rebalance(module_kafka_server):
    bootstrap = module_kafka_server.extra["kafka_bootstrap"]
    group = "raw-session"
    # Its session is short but not so short that a busy machine lets it lapse between its join and its sync.
    short_lived, generation = joined_member(bootstrap, group, session=datetime.timedelta(seconds=3))
    with RawConnection(bootstrap) as connection:
        # A second member joins; the first neither heartbeats nor rejoins, and its session lapses
        # (before the rebalance timeout of 30 s): evicted, the second completes alone.
        first = join(connection, group, rebalance=datetime.timedelta(seconds=30))
        joined = join(connection, group, first.member_id, rebalance=datetime.timedelta(seconds=30))
        assert joined.error_code == KafkaError.none
        assert [m.member_id for m in joined.members] == [first.member_id]
        assert heartbeat(connection, group, short_lived, generation).error_code == KafkaError.unknown_member_id


def test_a_stable_member_is_told_to_rejoin_by_its_heartbeat(module_kafka_server):
    bootstrap = module_kafka_server.extra["kafka_bootstrap"]
    group = "raw-heartbeat"
    member, generation = joined_member(bootstrap, group, rebalance=datetime.timedelta(seconds=30))
    answers = {}
    joiner = second_member_joins(bootstrap, group, answers)
    with RawConnection(bootstrap) as connection:
        while heartbeat(connection, group, member, generation).error_code == KafkaError.none:
            pass  # until the second's join has begun the rebalance
        assert heartbeat(connection, group, member, generation).error_code == KafkaError.rebalance_in_progress
        rejoined = join(connection, group, member)
        joiner.join()
        second = answers["second"]
        assert rejoined.generation_id == second.generation_id == generation + 1
        assert rejoined.leader == second.leader == member  # the leader stays
        assert sorted(m.member_id for m in rejoined.members) == sorted([member, second.member_id])
        assert second.members == ()


def test_a_member_of_an_older_generation_is_told_so_while_the_group_rebalances(module_kafka_server):
    """Regression: Heartbeat and SyncGroup checked the rebalance state before the generation, so a
    member of an older generation was answered REBALANCE_IN_PROGRESS while the group was in
    PreparingRebalance; Kafka's coordinator checks the generation first (ILLEGAL_GENERATION), which
    tells a consumer its partitions are lost, not merely to rejoin."""
    bootstrap = module_kafka_server.extra["kafka_bootstrap"]
    group = "raw-older-generation"
    rebalance = datetime.timedelta(seconds=30)
    member, older = joined_member(bootstrap, group, rebalance=rebalance)
    answers = {}
    with RawConnection(bootstrap) as connection:
        # The leader rejoins alone (a new generation), then a second member's join begins a rebalance.
        current = join(connection, group, member, rebalance=rebalance).generation_id
        assert current == older + 1
        joiner = second_member_joins(bootstrap, group, answers, rebalance=rebalance)
        while heartbeat(connection, group, member, current).error_code == KafkaError.none:
            pass  # until the second's join has begun the rebalance
        assert heartbeat(connection, group, member, current).error_code == KafkaError.rebalance_in_progress
        assert heartbeat(connection, group, member, older).error_code == KafkaError.illegal_generation
        assert sync(connection, group, member, older, {}).error_code == KafkaError.illegal_generation
        assert sync(connection, group, member, current, {}).error_code == KafkaError.rebalance_in_progress
        assert join(connection, group, member, rebalance=rebalance).generation_id == current + 1
        joiner.join()
        assert answers["second"].generation_id == current + 1


def test_a_sync_after_the_leader_synced_and_rejoined_is_answered_its_generation_s_assignment(module_kafka_server):
    """Regression: a member's SyncGroup that came after its generation's leader had synced and
    already rejoined (the group Preparing again) was answered REBALANCE_IN_PROGRESS, as Kafka's
    coordinator answers one in PreparingRebalance. Here a follower's JoinGroup is answered later
    than the leader's, so a cooperative-sticky leader that gives up a partition and rejoins at once
    took the generation from the new member, which never saw the one that took it in. It is
    answered its assignment of that generation (one of a generation whose leader did not sync is
    still REBALANCE_IN_PROGRESS: test_a_member_of_an_older_generation_is_told_so_...)."""
    bootstrap = module_kafka_server.extra["kafka_bootstrap"]
    group = "raw-sync-after-the-leader-rejoined"
    rebalance = datetime.timedelta(seconds=30)
    leader, generation = joined_member(bootstrap, group, rebalance=rebalance)
    answers = {}
    with RawConnection(bootstrap) as connection:
        joiner = second_member_joins(bootstrap, group, answers, rebalance=rebalance)
        while heartbeat(connection, group, leader, generation).error_code == KafkaError.none:
            pass  # until the second's join has begun the rebalance
        current = join(connection, group, leader, rebalance=rebalance).generation_id
        joiner.join()
        follower = answers["second"].member_id
        assignments = {leader: b"leader-part", follower: b"follower-part"}
        assert sync(connection, group, leader, current, assignments).assignment == b"leader-part"
        rejoining = connection.send(join_request(group, leader, rebalance=rebalance))  # waits for the follower
        with RawConnection(bootstrap) as late:
            while heartbeat(late, group, follower, current).error_code == KafkaError.none:
                pass  # until the leader's rejoin has begun the next rebalance
            answered = sync(late, group, follower, current, {})
            assert (answered.error_code, answered.assignment) == (KafkaError.none, b"follower-part")
            rejoined = join(late, group, follower, rebalance=rebalance)
        assert connection.receive(api_table.JOIN_GROUP, JOIN_VERSION, rejoining).generation_id == current + 1
        assert rejoined.generation_id == current + 1


def test_a_member_waiting_for_its_assignment_keeps_its_session(module_kafka_server):
    """Regression: a follower's SyncGroup waiting for the leader's did not keep the follower's session,
    so a leader slower than it evicted the follower (the group rebalanced, its SyncGroup answered
    UNKNOWN_MEMBER_ID); Kafka's coordinator keeps a member awaiting sync alive, as one awaiting join."""
    bootstrap = module_kafka_server.extra["kafka_bootstrap"]
    group = "raw-slow-leader"
    brief, rebalance = datetime.timedelta(milliseconds=300), datetime.timedelta(seconds=30)
    leader, generation = joined_member(bootstrap, group, rebalance=rebalance)
    answers = {}

    def follower_joins_and_syncs():
        with RawConnection(bootstrap) as connection:
            first = join(connection, group, session=brief, rebalance=rebalance)
            joined = answers["joined"] = join(connection, group, first.member_id, session=brief, rebalance=rebalance)
            answers["synced"] = sync(connection, group, joined.member_id, joined.generation_id, {})

    follower = threading.Thread(target=follower_joins_and_syncs)
    follower.start()
    with RawConnection(bootstrap) as connection:
        while heartbeat(connection, group, leader, generation).error_code == KafkaError.none:
            pass  # until the follower's join has begun the rebalance
        rejoined = join(connection, group, leader, rebalance=rebalance)
        assert rejoined.generation_id == generation + 1
        # The leader takes many of the follower's session timeouts (and session checks) to assign.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert heartbeat(connection, group, leader, rejoined.generation_id).error_code == KafkaError.none
            time.sleep(0.1)
        follower_id = answers["joined"].member_id
        assignments = {leader: b"leader-part", follower_id: b"follower-part"}
        assert sync(connection, group, leader, rejoined.generation_id, assignments).error_code == KafkaError.none
    follower.join()
    assert (answers["synced"].error_code, answers["synced"].assignment) == (KafkaError.none, b"follower-part")


def test_commits_are_judged_against_the_group_as_kafka_judges_them(module_kafka_server):
    """Regression: an OffsetCommit with generation -1 was accepted whatever the group, so a consumer
    that assigns itself partitions (or an admin tool) overwrote the offsets of a group whose members
    were consuming them, and a member committed while its group awaited the leader's assignment;
    Kafka's group coordinator (ClassicGroup.validateOffsetCommit) accepts a commit without a
    generation only while the group has no members (UNKNOWN_MEMBER_ID without a member id, the
    member's check with one: ILLEGAL_GENERATION), answers a member's commit in CompletingRebalance
    REBALANCE_IN_PROGRESS, and lets a transactional one without a member through. HTTP's commit keeps
    its contract: generation -1 commits whatever the group."""
    server = module_kafka_server
    bootstrap = server.extra["kafka_bootstrap"]
    topic, group = "judged-commits", "judged-commits-group"
    create_topic(server, topic, 1)
    with RawConnection(bootstrap) as connection:
        first = join(connection, group)
        joined = join(connection, group, first.member_id)
        member, generation = joined.member_id, joined.generation_id
        # CompletingRebalance: the member's commit waits for its assignment; a transactional one does not.
        assert commit(connection, group, member, generation, None, topic, 1) == KafkaError.rebalance_in_progress
        producer = init_producer(connection, "judged-commits-txn")
        as_member = (generation, member, None)
        assert txn_offset_commit(connection, producer, group, topic, 1, member=as_member) == [KafkaError.none]
        assert end_txn(connection, producer, committed=False, version=3).error_code == KafkaError.none
        assert sync(connection, group, member, generation, {member: b"mine"}).assignment == b"mine"
        # Stable, with a member: a commit without a generation is refused, the member's accepted.
        assert commit(connection, group, "", -1, None, topic, 2) == KafkaError.unknown_member_id
        assert commit(connection, group, member, -1, None, topic, 2) == KafkaError.illegal_generation
        assert commit(connection, group, member, generation, None, topic, 3) == KafkaError.none
        assert txn_offset_commit(connection, producer, group, topic, 4) == [KafkaError.none]
        assert end_txn(connection, producer, committed=False, version=3).error_code == KafkaError.none
        response = server.client.post(
            f"/v1/groups/{group}/offsets/commit",
            json={"member_id": "", "generation_id": -1, "offsets": [{"topic": topic, "partition": 0, "offset": 5}]},
        )
        assert response.status_code == 200 and response.json()["offsets"][0]["error"] is None, response.text
        assert offset_fetch(connection, group, topic, 0, require_stable=True).committed_offset == 5
        # Empty once its member left: a commit without a generation is accepted again.
        assert leave(connection, group, [(member, None)]) == [KafkaError.none]
        assert commit(connection, group, "", -1, None, topic, 6) == KafkaError.none
        assert offset_fetch(connection, group, topic, 0, require_stable=True).committed_offset == 6


def test_a_rebalancing_group_is_described_without_protocol_and_assignments(module_kafka_server):
    """Regression: DescribeGroups of a group in PreparingRebalance answered the ending generation's
    protocol and its members' metadata and assignments (admin clients showed partitions the group was
    revoking as assigned), and in CompletingRebalance the new protocol and metadata; Kafka's
    coordinator describes only a Stable group with them, a rebalancing one with protocol "" and
    members without bytes."""
    bootstrap = module_kafka_server.extra["kafka_bootstrap"]
    group = "raw-described-rebalancing"
    rebalance = datetime.timedelta(seconds=30)
    member, generation = joined_member(bootstrap, group, rebalance=rebalance)
    answers = {}

    def described(connection):
        found = describe(connection, group)
        return found.group_state, found.protocol_data, [(m.member_metadata, m.member_assignment) for m in found.members]

    with RawConnection(bootstrap) as connection:
        assert described(connection) == ("Stable", "range", [(b"", b"mine")])
        joiner = second_member_joins(bootstrap, group, answers, rebalance=rebalance, metadata=b"second")
        while heartbeat(connection, group, member, generation).error_code == KafkaError.none:
            pass  # until the second's join has begun the rebalance
        assert described(connection) == ("PreparingRebalance", "", [(b"", b""), (b"", b"")])
        rejoined = join(connection, group, member, rebalance=rebalance)
        joiner.join()
        assert described(connection) == ("CompletingRebalance", "", [(b"", b""), (b"", b"")])
        second = answers["second"].member_id
        assert sync(connection, group, member, rejoined.generation_id, {second: b"theirs"}).error_code == 0
        state, protocol, members = described(connection)
        assert (state, protocol, sorted(members)) == ("Stable", "range", [(b"", b""), (b"second", b"theirs")])


def test_http_lists_and_describes_a_kafka_group_in_its_own_rebalance_state(module_kafka_server):
    """Regression: HTTP's GET /v1/groups and /v1/groups/{id} called every group with members Stable,
    a Kafka group rebalancing too (its members told to rejoin, or awaiting the leader's assignment),
    where Kafka's DescribeGroups and the console show its own state: now one rule serves them all,
    with the protocol type and the assignor the members chose. An HTTP group, which has no
    rebalance phase, is Stable with members, the server's range assignment."""
    server = module_kafka_server
    bootstrap = server.extra["kafka_bootstrap"]
    create_topic(server, "http-described", 1)
    group = "http-described-rebalancing"
    rebalance = datetime.timedelta(seconds=30)

    def over_http() -> tuple[tuple, tuple]:
        """(state, protocol_type, protocol) as the list and as the describe answer them."""
        [listed] = [g for g in server.client.get("/v1/groups").json()["groups"] if g["group_id"] == group]
        described = server.client.get(f"/v1/groups/{group}").json()
        return tuple(listed.get(k) for k in ("state", "protocol_type", "protocol")), tuple(
            described.get(k) for k in ("state", "protocol_type", "protocol")
        )

    def kafka_state(connection) -> str:
        return describe(connection, group).group_state

    with RawConnection(bootstrap) as connection:
        first = join(connection, group, rebalance=rebalance)  # MEMBER_ID_REQUIRED: the id to join with
        joined = join(connection, group, first.member_id, rebalance=rebalance)
        member = joined.member_id
        assert kafka_state(connection) == "CompletingRebalance"
        assert over_http() == (("CompletingRebalance", "consumer", "range"),) * 2
        assert sync(connection, group, member, joined.generation_id, {member: b""}).error_code == KafkaError.none
        assert over_http() == (("Stable", "consumer", "range"),) * 2

        answers = {}
        joiner = second_member_joins(bootstrap, group, answers, rebalance=rebalance)
        while heartbeat(connection, group, member, joined.generation_id).error_code == KafkaError.none:
            pass  # until the second's join has begun the rebalance
        assert kafka_state(connection) == "PreparingRebalance"
        assert over_http() == (("PreparingRebalance", "consumer", "range"),) * 2
        rejoined = join(connection, group, member, rebalance=rebalance)
        joiner.join()
        assert over_http() == (("CompletingRebalance", "consumer", "range"),) * 2
        second = answers["second"].member_id
        assignments = {member: b"", second: b""}
        assert sync(connection, group, member, rejoined.generation_id, assignments).error_code == KafkaError.none
        assert over_http() == (("Stable", "consumer", "range"),) * 2
        assert leave(connection, group, [(member, None), (second, None)]) == [KafkaError.none] * 2
        assert over_http() == (("Empty", "consumer", ""),) * 2

    heartbeat_body = {"member_id": "", "generation_id": -1, "topics": ["http-described"]}
    joined = server.client.post("/v1/groups/http-described-http/heartbeat", json=heartbeat_body).json()
    described = server.client.get("/v1/groups/http-described-http").json()
    assert (described["state"], described.get("protocol_type"), described.get("protocol")) == (
        "Stable",
        "http",
        "range",
    )
    server.client.post("/v1/groups/http-described-http/leave", json={"member_id": joined["member_id"]})
    described = server.client.get("/v1/groups/http-described-http").json()
    assert (described["state"], described.get("protocol_type"), described.get("protocol")) == ("Empty", "", "")


def test_http_describes_a_kafka_group_s_assignments_only_while_it_is_stable(module_kafka_server):
    """Regression: HTTP's GET /v1/groups/{id} showed a rebalancing Kafka group's members with the
    partitions of the generation ending (those they were revoking), where Kafka's DescribeGroups
    describes no assignment for a group not Stable; now HTTP answers as Kafka does: each member's
    assignment only while the group is Stable, [] in PreparingRebalance and CompletingRebalance."""
    server = module_kafka_server
    bootstrap = server.extra["kafka_bootstrap"]
    topic = "http-assigned"
    create_topic(server, topic, 2)
    group = "http-assigned-rebalancing"
    rebalance = datetime.timedelta(seconds=30)

    def over_http() -> tuple[str, dict]:
        """The group's state and each member's assignment (topic -> partitions) as HTTP describes them."""
        described = server.client.get(f"/v1/groups/{group}").json()
        return described["state"], {
            m["member_id"]: {a["topic"]: a["partitions"] for a in m["assignment"]} for m in described["members"]
        }

    with RawConnection(bootstrap) as connection:
        first = join(connection, group, rebalance=rebalance)  # MEMBER_ID_REQUIRED: the id to join with
        joined = join(connection, group, first.member_id, rebalance=rebalance)
        member = joined.member_id
        assert over_http() == ("CompletingRebalance", {member: {}})
        both = consumer_assignment({topic: [0, 1]})
        assert sync(connection, group, member, joined.generation_id, {member: both}).error_code == KafkaError.none
        assert over_http() == ("Stable", {member: {topic: [0, 1]}})

        answers = {}
        joiner = second_member_joins(bootstrap, group, answers, rebalance=rebalance)
        while heartbeat(connection, group, member, joined.generation_id).error_code == KafkaError.none:
            pass  # until the second's join has begun the rebalance
        state, assignments = over_http()
        assert (state, assignments.get(member)) == ("PreparingRebalance", {}), "the ending generation's shown"
        rejoined = join(connection, group, member, rebalance=rebalance)
        joiner.join()
        second = answers["second"].member_id
        assert over_http() == ("CompletingRebalance", {member: {}, second: {}})
        assignments = {member: consumer_assignment({topic: [0]}), second: consumer_assignment({topic: [1]})}
        assert sync(connection, group, member, rejoined.generation_id, assignments).error_code == KafkaError.none
        assert over_http() == ("Stable", {member: {topic: [0]}, second: {topic: [1]}})
        assert leave(connection, group, [(member, None), (second, None)]) == [KafkaError.none] * 2


def test_http_describes_no_lag_for_a_negative_committed_offset(module_kafka_server):
    """Regression: Kafka's OffsetCommit stores a negative offset as given (an admin tool's -1), and
    HTTP's describe counted its lag from below offset 0: the high watermark plus one. It is no
    position, so its lag is null, as the console and kafka-consumer-groups.sh show none."""
    server = module_kafka_server
    create_topic(server, "http-negative-committed", 1)
    server.client.post(
        "/v1/topics/http-negative-committed/records", json={"partition": 0, "records": [{"value": "a"}, {"value": "b"}]}
    ).raise_for_status()
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        assert commit(connection, "http-negative", "", -1, None, "http-negative-committed", -1) == KafkaError.none
    [entry] = server.client.get("/v1/groups/http-negative").json()["offsets"]
    assert (entry["offset"], entry["high_watermark"], entry["lag"], entry.get("lag_exact")) == (-1, 2, None, True)


def test_a_group_takes_the_kind_of_its_first_member(module_kafka_server):
    server = module_kafka_server
    bootstrap = server.extra["kafka_bootstrap"]
    create_topic(server, "kinds", 1)
    joined_member(bootstrap, "kafka-kind")
    response = server.client.post(
        "/v1/groups/kafka-kind/heartbeat", json={"member_id": "", "generation_id": -1, "topics": ["kinds"]}
    )
    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "INCONSISTENT_GROUP_PROTOCOL"
    response = server.client.post(
        "/v1/groups/http-kind/heartbeat", json={"member_id": "", "generation_id": -1, "topics": ["kinds"]}
    )
    assert response.status_code == 200, response.text
    with RawConnection(bootstrap) as connection:
        assert join(connection, "http-kind", "a-kafka-member").error_code == KafkaError.inconsistent_group_protocol


def offset_fetch(connection, group: str, topic: str, partition: int, require_stable: bool):
    response = connection.call(
        request_of(
            api_table.OFFSET_FETCH,
            7,
            group_id=group,
            topics=(
                nested(
                    api_table.OFFSET_FETCH, 7, "OffsetFetchRequestTopic", name=topic, partition_indexes=(partition,)
                ),
            ),
            require_stable=require_stable,
        )
    )
    [topic_answer] = response.topics
    [answer] = topic_answer.partitions
    return answer


def test_require_stable_answers_unstable_offset_commit_while_a_transaction_holds_offsets(module_kafka_server):
    server = module_kafka_server
    bootstrap = server.extra["kafka_bootstrap"]
    create_topic(server, "stable", 1)
    transaction = http_side.HttpTransaction(server, "stable-txn")
    response = server.client.post(
        "/v1/txn/offset-commit",
        json={
            "transactional_id": "stable-txn",
            "group_id": "stable-group",
            "producer_id": transaction.ids["producer_id"],
            "producer_epoch": transaction.ids["producer_epoch"],
            "generation_id": -1,
            "member_id": "",
            "offsets": [{"topic": "stable", "partition": 0, "offset": 5, "metadata": "txn"}],
        },
    )
    assert response.status_code == 200, response.text
    with RawConnection(bootstrap) as connection:
        pending = offset_fetch(connection, "stable-group", "stable", 0, require_stable=True)
        assert (pending.error_code, pending.committed_offset) == (KafkaError.unstable_offset_commit, -1)
        unstable_allowed = offset_fetch(connection, "stable-group", "stable", 0, require_stable=False)
        assert (unstable_allowed.error_code, unstable_allowed.committed_offset) == (KafkaError.none, -1)
        transaction.end(committed=True)
        settled = offset_fetch(connection, "stable-group", "stable", 0, require_stable=True)
        assert (settled.error_code, settled.committed_offset, settled.metadata) == (KafkaError.none, 5, "txn")


def test_http_and_kafka_consumers_resume_from_each_others_commits(module_kafka_server):
    server = module_kafka_server
    topic, group = "resume-across", "resume-across-group"
    create_topic(server, topic, 1)
    http_side.produce(server, topic, 0, [{"key": None, "value": f"r{i}"} for i in range(6)])
    # HTTP commits offset 2 for the group; a Kafka member of it resumes there.
    response = server.client.post(
        f"/v1/groups/{group}/offsets/commit",
        json={
            "member_id": "",
            "generation_id": -1,
            "offsets": [{"topic": topic, "partition": 0, "offset": 2, "metadata": None}],
        },
    )
    assert response.status_code == 200, response.text
    for name in sorted(MEMBERS):
        member = MEMBERS[name](server, group, topic)
        try:
            consumed = poll_until([member], lambda c: len(c[0]) >= 4, "the records after HTTP's commit")[0]
            assert [c.offset for c in consumed] == [2, 3, 4, 5], name
        finally:
            member.close()
    member = MEMBERS["confluent-kafka"](server, group, topic)
    try:
        poll_until([member], lambda c: len(c[0]) >= 4, "consumed")
        member.commit()  # offset 6, committed over Kafka
    finally:
        member.close()
    response = server.client.post(
        f"/v1/groups/{group}/offsets/fetch", json={"partitions": None, "require_stable": True}
    )
    assert [(o["partition"], o["offset"]) for o in response.json()["offsets"]] == [(0, 6)]
    # An HTTP member of the (now empty) group heartbeats in and reads from the Kafka commit.
    response = server.client.post(
        f"/v1/groups/{group}/heartbeat", json={"member_id": "", "generation_id": -1, "topics": [topic]}
    )
    assert response.status_code == 200, response.text
    assert [(a["topic"], a["partitions"]) for a in response.json()["assignment"]] == [(topic, [0])]


def test_offset_metadata_keeps_its_nul_characters_as_kafka(module_kafka_server):
    """Regression (found by confluent-kafka-python's own test_consumer_topicpartition_metadata): Kafka
    keeps an offset's metadata as sent, NULs included; txbroker dropped a trailing NUL and refused
    one inside (INVALID_REQUEST), PostgreSQL's text holding none. confluent-kafka's Python binding
    ends every metadata with its C terminator and reads it back expecting it, so its `""` came
    back as None. Now every metadata reads back exactly, over Kafka and over HTTP, the storage's
    escape character (U+FFFF) too."""
    server = module_kafka_server
    create_topic(server, "nul-metadata", 6)
    metadata = ["a\0b", "fine", "terminated\0", "\0", "\uffff0\uffff\uffff\0", ""]
    topics = (
        nested(
            api_table.OFFSET_COMMIT,
            8,
            "OffsetCommitRequestTopic",
            name="nul-metadata",
            partitions=tuple(
                nested(
                    api_table.OFFSET_COMMIT,
                    8,
                    "OffsetCommitRequestPartition",
                    partition_index=p,
                    committed_offset=7,
                    committed_leader_epoch=-1,
                    committed_metadata=m,
                )
                for p, m in enumerate(metadata)
            ),
        ),
    )
    commit = request_of(
        api_table.OFFSET_COMMIT,
        8,
        group_id="nul-group",
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=topics,
    )
    fetch = request_of(api_table.OFFSET_FETCH, 7, group_id="nul-group", topics=None, require_stable=False)
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        [committed] = connection.call(commit).topics
        assert [p.error_code for p in committed.partitions] == [KafkaError.none] * len(metadata)
        [fetched] = connection.call(fetch).topics
    assert [(p.partition_index, p.metadata) for p in fetched.partitions] == list(enumerate(metadata))
    response = server.client.post("/v1/groups/nul-group/offsets/fetch", json={"partitions": None})
    assert [(o["partition"], o["metadata"]) for o in response.json()["offsets"]] == list(enumerate(metadata))


def test_a_join_during_a_rebalance_does_not_put_off_its_deadline(module_kafka_server):
    """Regression: every JoinGroup arriving while the group was rebalancing moved the rebalance's
    deadline to its own rebalance timeout from then, so one member joining late with a long rebalance
    timeout held the group (the members that rejoined waiting in their JoinGroups, a member that never
    rejoins not yet removed) for that long. Kafka's coordinator sets the deadline when the rebalance
    begins (GroupMetadataManager.prepareRebalance: the members' largest rebalance timeout, the joiner
    that began it included); a later join only ends it sooner, when it is the last one awaited, and at
    the deadline the dynamic members that did not rejoin are removed."""
    bootstrap = module_kafka_server.extra["kafka_bootstrap"]
    group = "raw-fixed-deadline"
    rebalance, long_rebalance = datetime.timedelta(seconds=3), datetime.timedelta(seconds=90)
    idle, generation = joined_member(bootstrap, group, rebalance=rebalance)  # it never rejoins
    answers = {}
    began = second_member_joins(bootstrap, group, answers, rebalance=rebalance)

    def late_joins():
        with RawConnection(bootstrap) as connection:
            answers["late"] = join(connection, group, instance="late", rebalance=long_rebalance)

    with RawConnection(bootstrap) as connection:
        poll_until([], lambda _: describe(connection, group).group_state == "PreparingRebalance", "the second's join")
        late = threading.Thread(target=late_joins, daemon=True)  # on failure it waits out its 90 s
        late.start()
        poll_until([], lambda _: len(describe(connection, group).members) == 3, "the late member's join")
        # The rebalance ends at the deadline it began with (3 s), not 90 s after the late join.
        give_up = time.monotonic() + 5 * rebalance.total_seconds()
        while describe(connection, group).group_state == "PreparingRebalance":
            assert time.monotonic() < give_up, "the late join put off the rebalance's deadline"
            time.sleep(0.05)
        began.join()
        late.join()
        second, joined_late = answers["second"], answers["late"]
        assert second.generation_id == joined_late.generation_id == generation + 1
        [leader] = [answer for answer in (second, joined_late) if answer.member_id == answer.leader]
        assert sorted(m.member_id for m in leader.members) == sorted([second.member_id, joined_late.member_id])
        assert heartbeat(connection, group, idle, generation).error_code == KafkaError.unknown_member_id


def test_a_heartbeat_of_an_older_generation_does_not_keep_the_session(module_kafka_server):
    """Regression: a Heartbeat answered ILLEGAL_GENERATION still kept its member's session, so a
    member stuck on an older generation (it missed the rebalance's answers and never rejoins) stayed
    in the group for as long as it heartbeat, holding up every rebalance. Kafka's coordinator
    validates the member and its generation before it reschedules the session
    (GroupMetadataManager.classicGroupHeartbeatToClassicGroup, validateClassicGroupHeartbeat): the
    session of such a member lapses and it is removed."""
    bootstrap = module_kafka_server.extra["kafka_bootstrap"]
    group = "raw-stale-heartbeats"
    member, older = joined_member(bootstrap, group, session=datetime.timedelta(seconds=3))
    with RawConnection(bootstrap) as connection:
        current = join(connection, group, member, session=datetime.timedelta(seconds=3))
        assert current.generation_id == older + 1
        assert sync(connection, group, member, current.generation_id, {member: b"mine"}).assignment == b"mine"
        answered = []

        def removed(_) -> bool:
            answered.append(heartbeat(connection, group, member, older).error_code)
            return answered[-1] == KafkaError.unknown_member_id

        poll_until([], removed, "the session lapse of a member heartbeating an older generation")
        assert set(answered[:-1]) == {KafkaError.illegal_generation}
        assert describe(connection, group).group_state == "Empty"


def test_a_sync_naming_another_protocol_is_inconsistent(module_kafka_server):
    """Regression: SyncGroup v5's protocol_type and protocol_name were not looked at, so a leader
    assigning for another protocol than the one the group chose had its assignment stored. Kafka's
    coordinator answers INCONSISTENT_GROUP_PROTOCOL when either is named and is not the group's,
    after the member and generation checks and before the rebalance state
    (GroupMetadataManager.validateSyncGroup); one that names neither (v0-v4 cannot) is not checked."""
    group = "raw-sync-protocol"
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        first = join(connection, group)
        joined = join(connection, group, first.member_id)
        member, generation = joined.member_id, joined.generation_id
        for named in ({"protocol_type": "connect"}, {"protocol_name": "roundrobin"}):
            refused = sync(connection, group, member, generation, {member: b"other"}, **named)
            assert refused.error_code == KafkaError.inconsistent_group_protocol, named
            assert sync(connection, group, member, generation - 1, {}, **named).error_code == (
                KafkaError.illegal_generation
            )
        assert describe(connection, group).group_state == "CompletingRebalance"  # nothing stored
        unnamed = sync(connection, group, member, generation, {member: b"mine"}, protocol_type=None, protocol_name=None)
        assert (unnamed.error_code, unnamed.assignment) == (KafkaError.none, b"mine")
        assert sync(connection, group, member, generation, {}, protocol_name="roundrobin").error_code == (
            KafkaError.inconsistent_group_protocol
        )
        assert sync(connection, group, member, generation, {}).assignment == b"mine"


def test_a_refused_commit_answers_unknown_partitions_unknown(module_kafka_server):
    """Regression: a commit refused for its generation (or its group) answered every partition with
    that error, the ones of topics or partitions that do not exist too. Kafka's broker answers those
    UNKNOWN_TOPIC_OR_PARTITION before its group coordinator judges the commit (KafkaApis
    handleOffsetCommitRequest, handleTxnOffsetCommitRequest), and leaves the coordinator out when no
    partition is left: only the existing partitions get the generation's error. HTTP's commit, on
    the same core, answers them alike."""
    server = module_kafka_server
    bootstrap = server.extra["kafka_bootstrap"]
    topic, group = "refused-commits", "refused-commits-group"
    create_topic(server, topic, 1)
    partitions = [(topic, 0), (topic, 5), ("refused-no-such-topic", 0)]
    unknown = KafkaError.unknown_topic_or_partition
    member, older = joined_member(bootstrap, group)
    with RawConnection(bootstrap) as connection:
        current = join(connection, group, member)
        assert current.generation_id == older + 1
        stale = commit_partitions(connection, group, member, older, None, partitions, 1)
        assert stale == [KafkaError.illegal_generation, unknown, unknown]
        # HTTP's commit, on the same core, answers them alike.
        response = server.client.post(
            f"/v1/groups/{group}/offsets/commit",
            json={
                "member_id": member,
                "generation_id": older,
                "offsets": [{"topic": name, "partition": index, "offset": 1} for name, index in partitions],
            },
        )
        assert response.status_code == 200, response.text
        assert [entry["error"]["code"] for entry in response.json()["offsets"]] == [
            "ILLEGAL_GENERATION",
            "UNKNOWN_TOPIC_OR_PARTITION",
            "UNKNOWN_TOPIC_OR_PARTITION",
        ]
        producer = init_producer(connection, "refused-commits-txn")
        stale = txn_offset_commit(
            connection, producer, group, topic, 1, member=(older, member, None), partitions=partitions
        )
        assert stale == [KafkaError.illegal_generation, unknown, unknown]
        # A group that does not exist: the same, and a commit of only unknown partitions makes none.
        missing = commit_partitions(connection, "refused-no-group", member, 3, None, partitions, 1, version=9)
        assert missing == [KafkaError.group_id_not_found, unknown, unknown]
        assert commit_partitions(connection, "refused-no-group", member, 3, None, partitions[1:], 1, version=9) == [
            unknown,
            unknown,
        ]
        assert describe(connection, "refused-no-group").group_state == "Dead"
