"""The classic protocol's membership rules as Kafka's coordinator keeps them, with raw requests:
the ids MEMBER_ID_REQUIRED gives out are remembered (pending members, forgotten after their session
timeout), static membership (KIP-345: a restarted instance takes its place without a rebalance, the
old member id is fenced), and the initial rebalance delay of a new group."""

from __future__ import annotations

import datetime
import threading
import time

from kio.schema.errors import ErrorCode as KafkaError

from tests.kafka.clients import create_topic
from tests.kafka.group_clients import poll_until
from tests.kafka.raw import RawConnection
from tests.kafka.raw_groups import commit, describe, heartbeat, join, leave, leave_answer, sync
from tests.kafka.raw_transactions import end_txn, init_producer, txn_offset_commit

BRIEF_SESSION = datetime.timedelta(milliseconds=100)


def test_a_member_id_the_group_never_gave_out_is_unknown(module_kafka_server):
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        assert join(connection, "never-issued", "made-up").error_code == KafkaError.unknown_member_id
        first = join(connection, "never-issued")
        assert first.error_code == KafkaError.member_id_required
        assert join(connection, "never-issued", "made-up").error_code == KafkaError.unknown_member_id
        assert join(connection, "never-issued", first.member_id).error_code == KafkaError.none


def test_a_group_instance_id_no_member_holds_is_unknown_whatever_the_member_id(module_kafka_server):
    """As Kafka's coordinator validates a member: a request naming a group.instance.id is a static
    member's, and when no member holds that instance id it is UNKNOWN_MEMBER_ID, even with the
    member id of a dynamic member (which was accepted, heartbeats and commits alike)."""
    server = module_kafka_server
    create_topic(server, "unknown-instance", 1)
    group = "unknown-instance-group"
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        first = join(connection, group)
        joined = join(connection, group, first.member_id)
        member, generation = joined.member_id, joined.generation_id
        assert sync(connection, group, member, generation, {member: b"mine"}).assignment == b"mine"
        assert heartbeat(connection, group, member, generation).error_code == KafkaError.none
        unknown = KafkaError.unknown_member_id
        assert heartbeat(connection, group, member, generation, "no-such-instance").error_code == unknown
        assert commit(connection, group, member, generation, "no-such-instance", "unknown-instance", 1) == unknown
        assert sync(connection, group, member, generation, {}, "no-such-instance").error_code == unknown
        assert leave(connection, group, [(member, "no-such-instance")]) == [unknown]
        # The member is still there, unharmed.
        assert heartbeat(connection, group, member, generation).error_code == KafkaError.none


def test_a_pending_member_that_does_not_rejoin_within_its_session_is_forgotten(module_kafka_server):
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        first = join(connection, "pending-lapses", session=BRIEF_SESSION)
        assert first.error_code == KafkaError.member_id_required
        time.sleep(2 * BRIEF_SESSION.total_seconds())  # its session timeout passes
        assert join(connection, "pending-lapses", first.member_id).error_code == KafkaError.unknown_member_id
        # One that leaves before it rejoins (LeaveGroup v3+ by its id) is forgotten as well.
        second = join(connection, "pending-lapses")
        assert leave(connection, "pending-lapses", [(second.member_id, None)]) == [KafkaError.none]
        assert join(connection, "pending-lapses", second.member_id).error_code == KafkaError.unknown_member_id


def _static_member(connection, group: str, instance: str, assignment: bytes, **join_args):
    """A static member alone in a new group (no MEMBER_ID_REQUIRED for it), synced and Stable."""
    joined = join(connection, group, instance=instance, **join_args)
    assert joined.error_code == KafkaError.none and joined.leader == joined.member_id
    assert sync(connection, group, joined.member_id, joined.generation_id, {joined.member_id: assignment}).assignment
    return joined


def test_a_restarted_static_leader_takes_its_place_and_the_old_member_id_is_fenced(module_kafka_server):
    server = module_kafka_server
    create_topic(server, "static-fenced", 1)
    group = "static-fenced-group"
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        old = _static_member(connection, group, "instance-a", b"a-partitions")
        # The restarted instance (JoinGroup v9): a new member id in the same generation, told to
        # keep the group's assignment as its leader (skip_assignment), and given it by SyncGroup.
        new = join(connection, group, instance="instance-a")
        assert new.error_code == KafkaError.none
        assert new.member_id != old.member_id
        assert (new.generation_id, new.leader, new.skip_assignment) == (old.generation_id, new.member_id, True)
        assert [(m.member_id, m.group_instance_id) for m in new.members] == [(new.member_id, "instance-a")]
        synced = sync(connection, group, new.member_id, new.generation_id, {}, instance="instance-a")
        assert (synced.error_code, synced.assignment) == (KafkaError.none, b"a-partitions")

        fenced = KafkaError.fenced_instance_id
        generation = old.generation_id
        assert heartbeat(connection, group, old.member_id, generation, "instance-a").error_code == fenced
        assert sync(connection, group, old.member_id, generation, {}, "instance-a").error_code == fenced
        assert commit(connection, group, old.member_id, generation, "instance-a", "static-fenced", 1) == fenced
        assert join(connection, group, old.member_id, instance="instance-a").error_code == fenced
        assert leave(connection, group, [(old.member_id, "instance-a")]) == [fenced]
        assert heartbeat(connection, group, new.member_id, generation, "instance-a").error_code == KafkaError.none
        assert commit(connection, group, new.member_id, generation, "instance-a", "static-fenced", 1) == (
            KafkaError.none
        )
        # TxnOffsetCommit v3 names the member too (KIP-447): the old one is fenced there as well.
        producer = init_producer(connection, "static-fenced-txn")
        zombie, current = (generation, old.member_id, "instance-a"), (generation, new.member_id, "instance-a")
        assert txn_offset_commit(connection, producer, group, "static-fenced", 2, member=zombie) == [fenced]
        assert txn_offset_commit(connection, producer, group, "static-fenced", 2, member=current) == [KafkaError.none]
        assert end_txn(connection, producer, committed=False, version=3).error_code == KafkaError.none

        # Before v9 (librdkafka's JoinGroup v5) the answer names the old leader id, so that the new
        # instance does not run its assignor for a Stable group.
        older = join(connection, group, instance="instance-a", version=5)
        assert (older.generation_id, older.leader, older.members) == (generation, new.member_id, ())
        synced = sync(connection, group, older.member_id, generation, {}, instance="instance-a")
        assert synced.assignment == b"a-partitions"

        # Changed metadata: a rebalance (a new generation) instead.
        changed = join(connection, group, instance="instance-a", metadata=b"other")
        assert changed.generation_id == generation + 1


def test_a_restarted_static_follower_gets_its_assignment_without_a_rebalance(module_kafka_server):
    bootstrap = module_kafka_server.extra["kafka_bootstrap"]
    group = "static-follower"
    answers = {}
    with RawConnection(bootstrap) as leader_connection:
        first = _static_member(leader_connection, group, "leader", b"x", rebalance=datetime.timedelta(seconds=30))

        def follower_joins():
            with RawConnection(bootstrap) as connection:
                answers["follower"] = join(connection, group, instance="follower")

        joiner = threading.Thread(target=follower_joins)
        joiner.start()
        while heartbeat(leader_connection, group, first.member_id, first.generation_id).error_code == KafkaError.none:
            pass  # until the follower's join has begun the rebalance
        rejoined = join(leader_connection, group, first.member_id, instance="leader")
        joiner.join()
        follower = answers["follower"]
        assert rejoined.generation_id == follower.generation_id == first.generation_id + 1
        assignments = {rejoined.member_id: b"leader-part", follower.member_id: b"follower-part"}
        sync(leader_connection, group, rejoined.member_id, rejoined.generation_id, assignments)
        with RawConnection(bootstrap) as connection:
            assert sync(connection, group, follower.member_id, follower.generation_id, {}).assignment == (
                b"follower-part"
            )
            restarted = join(connection, group, instance="follower")
            assert (restarted.generation_id, restarted.leader, restarted.members) == (
                follower.generation_id,
                rejoined.member_id,
                (),
            )
            assert sync(connection, group, restarted.member_id, restarted.generation_id, {}).assignment == (
                b"follower-part"
            )
        # The leader was not asked to rejoin; DescribeGroups shows both instance ids.
        assert heartbeat(leader_connection, group, rejoined.member_id, rejoined.generation_id).error_code == (
            KafkaError.none
        )
        described = describe(leader_connection, group)
        assert described.group_state == "Stable"
        assert sorted((m.member_id, m.group_instance_id) for m in described.members) == sorted(
            [(rejoined.member_id, "leader"), (restarted.member_id, "follower")]
        )
        # A LeaveGroup naming only the instance id removes that static member; the rest rebalance.
        assert leave(leader_connection, group, [("", "follower")]) == [KafkaError.none]
        assert [m.group_instance_id for m in describe(leader_connection, group).members] == ["leader"]
        assert leave(leader_connection, group, [("", "unknown-instance")]) == [KafkaError.unknown_member_id]


def test_a_static_member_that_does_not_rejoin_in_time_stays_a_member(module_kafka_server):
    """Regression: a rebalance whose rebalance timeout passed removed every member that had not
    rejoined, static ones too, so a static member slow to rejoin (or restarting) got
    UNKNOWN_MEMBER_ID and joined anew, one more rebalance; Kafka's coordinator removes only the
    dynamic ones: the static member stays in the next generation (the leader one that rejoined), and
    gets its place back by rejoining without a rebalance. When no member rejoined at all, no
    generation completes: the group waits one more rebalance timeout (their sessions may lapse)."""
    bootstrap = module_kafka_server.extra["kafka_bootstrap"]
    group = "static-late"
    rebalance = datetime.timedelta(seconds=1)
    with RawConnection(bootstrap) as slow, RawConnection(bootstrap) as other:
        first = _static_member(slow, group, "slow", b"x", rebalance=rebalance)
        # A second static member begins a rebalance the first (its leader) does not rejoin in time.
        second = join(other, group, instance="other", rebalance=rebalance)
        assert (second.error_code, second.generation_id) == (KafkaError.none, first.generation_id + 1)
        assert second.leader == second.member_id
        assert sorted((m.member_id, m.group_instance_id) for m in second.members) == sorted(
            [(first.member_id, "slow"), (second.member_id, "other")]
        )
        # The slow one rejoins: the current generation, no rebalance; the leader's assignment is its.
        late = join(slow, group, first.member_id, instance="slow", rebalance=rebalance)
        assert (late.error_code, late.generation_id, late.leader) == (
            KafkaError.none,
            second.generation_id,
            second.leader,
        )
        assignments = {first.member_id: b"slow-part", second.member_id: b"other-part"}
        assert sync(other, group, second.member_id, second.generation_id, assignments, "other").error_code == 0
        assert sync(slow, group, first.member_id, late.generation_id, {}, "slow").assignment == b"slow-part"
        assert heartbeat(slow, group, first.member_id, late.generation_id, "slow").error_code == KafkaError.none

        # The other leaves: the slow one must rejoin, and does not in time; nobody rejoined, so the
        # group waits (no generation, no leader) until it does.
        assert leave(other, group, [("", "other")]) == [KafkaError.none]
        time.sleep(2.5 * rebalance.total_seconds())
        assert heartbeat(slow, group, first.member_id, late.generation_id, "slow").error_code == (
            KafkaError.rebalance_in_progress
        )
        described = describe(slow, group)
        assert (described.group_state, [m.member_id for m in described.members]) == (
            "PreparingRebalance",
            [first.member_id],
        )
        alone = join(slow, group, first.member_id, instance="slow", rebalance=rebalance)
        assert (alone.error_code, alone.generation_id, alone.leader) == (
            KafkaError.none,
            late.generation_id + 1,
            first.member_id,
        )


def test_members_that_do_not_sync_within_the_rebalance_timeout_are_removed(module_kafka_server):
    """As Kafka's coordinator (its pending sync): every member of a new generation must send its
    SyncGroup within the rebalance timeout, else it is removed and the rest rebalance, whatever its
    session: a static member kept in a generation it did not rejoin and gone since (it held its
    partitions until its session lapsed), and a leader that never assigns (its followers' SyncGroups
    are answered REBALANCE_IN_PROGRESS and they rejoin without it)."""
    bootstrap = module_kafka_server.extra["kafka_bootstrap"]
    rebalance = datetime.timedelta(seconds=1)
    with RawConnection(bootstrap) as gone, RawConnection(bootstrap) as other:
        group = "sync-overdue-static"
        first = _static_member(gone, group, "gone", b"x", rebalance=rebalance)
        second = join(other, group, instance="other", rebalance=rebalance)  # "gone" never rejoins
        assert sorted(m.group_instance_id for m in describe(other, group).members) == ["gone", "other"]
        synced = sync(other, group, second.member_id, second.generation_id, {second.member_id: b"y"}, "other")
        assert synced.assignment == b"y"
        poll_until(
            [],
            lambda _: (
                heartbeat(other, group, second.member_id, second.generation_id, "other").error_code
                == KafkaError.rebalance_in_progress
            ),
            "the overdue member's removal",
        )
        assert [m.member_id for m in describe(other, group).members] == [second.member_id]
        assert heartbeat(gone, group, first.member_id, second.generation_id, "gone").error_code == (
            KafkaError.unknown_member_id
        )

        group = "sync-overdue-leader"
        leader = _static_member(gone, group, "leader", b"x", rebalance=rebalance)
        answers = {}

        def follower_joins():
            answers["follower"] = join(other, group, instance="follower", rebalance=rebalance)

        joiner = threading.Thread(target=follower_joins)
        joiner.start()
        poll_until([], lambda _: describe(gone, group).group_state == "PreparingRebalance", "the follower's join")
        rejoined = join(gone, group, leader.member_id, instance="leader", rebalance=rebalance)
        joiner.join()
        follower = answers["follower"]
        assert rejoined.generation_id == follower.generation_id and rejoined.leader == leader.member_id
        # The leader never sends its SyncGroup: the follower's waits, then is told to rejoin.
        waited = sync(other, group, follower.member_id, follower.generation_id, {}, "follower")
        assert waited.error_code == KafkaError.rebalance_in_progress
        assert [m.group_instance_id for m in describe(other, group).members] == ["follower"]
        alone = join(other, group, follower.member_id, instance="follower", rebalance=rebalance)
        assert (alone.generation_id, alone.leader) == (follower.generation_id + 1, follower.member_id)


def test_a_static_member_whose_session_lapses_is_evicted(module_kafka_server):
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        _static_member(connection, "static-lapses", "gone", b"x", session=datetime.timedelta(seconds=2))
        poll_until([], lambda _: describe(connection, "static-lapses").group_state == "Empty", "the eviction")
        assert join(connection, "static-lapses", instance="gone").error_code == KafkaError.none


def test_a_leave_of_a_group_that_does_not_exist_makes_no_group(module_kafka_server):
    """Regression: a LeaveGroup of a group txbroker does not have (never joined, or deleted once its
    member's session lapsed, the consumer closing only then) made the group, Empty, which
    DescribeGroups, ListGroups and HTTP's GET /v1/groups/{id} then showed; Kafka's coordinator answers
    UNKNOWN_MEMBER_ID for the request and makes nothing."""
    server = module_kafka_server
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        lapsed = _static_member(connection, "left-deleted", "gone", b"x", session=datetime.timedelta(seconds=2))
        poll_until([], lambda _: describe(connection, "left-deleted").group_state == "Empty", "the eviction")
        assert server.client.delete("/v1/groups/left-deleted").status_code == 204
        for group, member in (("left-never-joined", "made-up"), ("left-deleted", lapsed.member_id)):
            answer = leave_answer(connection, group, [(member, None)])
            assert (answer.error_code, answer.members) == (KafkaError.unknown_member_id, ()), group
            assert describe(connection, group).group_state == "Dead", group
            assert server.client.get(f"/v1/groups/{group}").status_code == 404, group


def test_the_first_rebalance_of_a_new_group_waits_for_more_members(make_server):
    """Kafka's group.initial.rebalance.delay.ms: two members starting together get one generation;
    HTTP's groups, which have no rebalance to wait for, are answered at once."""
    server = make_server(kafka_listener="127.0.0.1:0", group_initial_rebalance_delay_ms=1500)
    bootstrap = server.extra["kafka_bootstrap"]
    group = "delayed"
    answers = {}

    def first_joins():
        with RawConnection(bootstrap) as connection:
            answers["first"] = join(connection, group, instance="first")

    joiner = threading.Thread(target=first_joins)
    joiner.start()
    with RawConnection(bootstrap) as connection:
        poll_until([], lambda _: describe(connection, group).group_state == "PreparingRebalance", "the first join")
        second = join(connection, group, instance="second")
    joiner.join()
    first = answers["first"]
    assert first.generation_id == second.generation_id == 1
    assert first.leader == second.leader
    [leader] = [answer for answer in (first, second) if answer.member_id == answer.leader]
    assert sorted(m.group_instance_id for m in leader.members) == ["first", "second"]

    create_topic(server, "delay-http", 1)
    response = server.client.post(
        "/v1/groups/delay-http-group/heartbeat", json={"member_id": "", "generation_id": -1, "topics": ["delay-http"]}
    )
    assert response.status_code == 200, response.text
    assert [(a["topic"], a["partitions"]) for a in response.json()["assignment"]] == [("delay-http", [0])]
