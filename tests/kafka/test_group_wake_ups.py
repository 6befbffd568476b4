"""The wake-up of waiting JoinGroups: a change to a group committed in the waiter's process (whichever
door or task made it) answers the waiter at once, and a change to another group does not wake it.

The server runs in the test's process (make_server), so the test turns the waiters' poll off
(classic_groups.POLL_S: only a wake-up answers them) and counts each waiter's reads of its group
(ClassicGroups._member_state, which every re-read of a waiting JoinGroup goes through)."""

from __future__ import annotations

import collections
import contextlib
import datetime
import time

import pytest
from kio.schema.errors import ErrorCode as KafkaError

from app.coordinator import classic_groups
from app.coordinator.classic_groups import ClassicGroups
from app.kafka import api_table
from tests.api.test_log_lifecycle import sql
from tests.kafka.raw import RawConnection
from tests.kafka.raw_groups import JOIN_VERSION, join, join_request, sync, sync_request

LONG = datetime.timedelta(seconds=30)
NO_POLL_S = 3600  # longer than the test: a waiter answered was woken
GROUP, OTHER_GROUP = "wake-up-group", "wake-up-other-group"


def _counting_reads(monkeypatch) -> collections.Counter:
    reads: collections.Counter = collections.Counter()
    member_state = ClassicGroups.__dict__["_member_state"].__func__

    def counted(group, group_id, *args):
        reads[group_id] += 1
        return member_state(group, group_id, *args)

    monkeypatch.setattr(ClassicGroups, "_member_state", staticmethod(counted))
    return reads


def _poll_until(condition, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never reached within {timeout_s} s: {what}"
        time.sleep(0.01)


@pytest.mark.parametrize("change", ["http-leave", "session-expiry"])
def test_a_waiting_join_group_is_woken_by_a_change_to_its_group_from_the_other_door_only(
    make_server, monkeypatch, change
):
    """Regression: only a Kafka request's change to a group woke the process's waiters (all of them,
    whatever their group); an HTTP consumer's leave (or heartbeat), DeleteGroups and a session
    expiry were seen at the next poll. Here member B of a Kafka group leaves over HTTP, or its
    session expires (the server's expiry task), while leader A waits in its JoinGroup for B: A is
    answered the generation that completes without B, having read its group twice (before its
    wait and once woken), a change to another group in between waking nothing."""
    monkeypatch.setattr(classic_groups, "POLL_S", NO_POLL_S)
    reads = _counting_reads(monkeypatch)
    server = make_server(kafka_listener="127.0.0.1:0", group_session_check_interval_ms=20)
    bootstrap = server.extra["kafka_bootstrap"]
    with RawConnection(bootstrap) as a, RawConnection(bootstrap) as b, RawConnection(bootstrap) as other:
        first = join(a, GROUP, instance="a", session=LONG, rebalance=LONG)
        assert first.error_code == KafkaError.none and first.leader == first.member_id
        sync(a, GROUP, first.member_id, first.generation_id, {first.member_id: b""})
        read_before_b = reads[GROUP]
        b_joining = b.send(join_request(GROUP, instance="b", session=LONG, rebalance=LONG))
        # B's JoinGroup committed (the group is rebalancing, B in it) once its wait has read the group.
        _poll_until(lambda: reads[GROUP] > read_before_b, "B's JoinGroup waiting for A")
        second = join(a, GROUP, first.member_id, instance="a", session=LONG, rebalance=LONG)  # completes it
        b_joined = b.receive(api_table.JOIN_GROUP, JOIN_VERSION, b_joining)
        assert b_joined.error_code == KafkaError.none and b_joined.generation_id == second.generation_id
        assert sync(a, GROUP, first.member_id, second.generation_id, {}).error_code == KafkaError.none  # Stable

        before = reads[GROUP]
        rejoining = a.send(join_request(GROUP, first.member_id, LONG, LONG, "a"))  # the leader rejoins: B must too
        _poll_until(lambda: reads[GROUP] == before + 1, "A's JoinGroup waiting for B")
        assert join(other, OTHER_GROUP, instance="c", session=LONG).error_code == KafkaError.none
        if change == "http-leave":
            response = server.client.post(f"/v1/groups/{GROUP}/leave", json={"member_id": b_joined.member_id})
            assert response.status_code == 200, response.text
        else:
            sql(
                server.database_url,
                "UPDATE group_members SET last_heartbeat_ms = 0 WHERE group_id = $1 AND member_id = $2",
                GROUP,
                b_joined.member_id,
            )
        answered = a.receive(api_table.JOIN_GROUP, JOIN_VERSION, rejoining)
    assert answered.error_code == KafkaError.none
    assert answered.generation_id == second.generation_id + 1
    assert [m.member_id for m in answered.members] == [first.member_id]
    assert reads[GROUP] - before == 2  # its first read, and the one its group's change woke


def test_a_sync_group_waiting_in_another_process_is_answered_though_the_leader_already_rejoined(
    make_server, monkeypatch
):
    """Regression: a follower's SyncGroup waiting in one process sees the leader's SyncGroup, made
    in another, only at its poll. When the leader had already taken its assignment and rejoined
    by then (the group Preparing again, in the same generation), the follower was answered
    REBALANCE_IN_PROGRESS, where Kafka's coordinator answers every waiting SyncGroup with the
    leader's: a cooperative-sticky member then never saw the generation that took it in. Two
    servers on one database stand for the two processes; the poll is long enough that the leader
    syncs and rejoins within it, and the NOTIFY that would wake the follower at once is lost (as
    while its process's listening connection is down)."""
    monkeypatch.setattr(classic_groups, "POLL_S", 1.0)
    monkeypatch.setattr(ClassicGroups, "listen_for_changes", lambda self, notifier: None)  # notifications lost
    leader_side = make_server(kafka_listener="127.0.0.1:0")
    with _connections_to_two_servers(leader_side, make_server) as (a, b):
        first, second, b_joined = _b_joins_a_group_of_a(a, b, leader_side)
        assert b_joined.generation_id == second.generation_id

        b_syncing = b.send(sync_request(GROUP, b_joined.member_id, b_joined.generation_id, {}))
        # B's SyncGroup has committed (it no longer awaits it) and waits for the leader's.
        _poll_until(lambda: b_joined.member_id not in _awaiting_sync(leader_side), "B's SyncGroup waiting")
        assignments = {first.member_id: b"for a", b_joined.member_id: b"for b"}
        assert sync(a, GROUP, first.member_id, second.generation_id, assignments).assignment == b"for a"
        a.send(join_request(GROUP, first.member_id, LONG, LONG, "a"))  # the leader rejoins at once
        _poll_until(lambda: _group_state(leader_side) == "PreparingRebalance", "the leader's rejoin")
        answered = b.receive(api_table.SYNC_GROUP, 5, b_syncing)
    assert answered.error_code == KafkaError.none
    assert answered.assignment == b"for b"


def test_a_change_committed_in_another_process_wakes_the_waiters_at_once(make_server, monkeypatch):
    """Regression: a JoinGroup waiting in one process saw a change to its group made in another
    (worker or node) only at its poll, every 50 ms, each waiter re-reading its group 20 times a
    second. A change now NOTIFYs every process's waiters of the group. Here the poll is off: B,
    waiting in one server, is answered when leader A, in another, completes the rebalance."""
    monkeypatch.setattr(classic_groups, "POLL_S", NO_POLL_S)
    a_side = make_server(kafka_listener="127.0.0.1:0")
    with _connections_to_two_servers(a_side, make_server) as (a, b):
        first, second, b_joined = _b_joins_a_group_of_a(a, b, a_side)
    assert b_joined.error_code == KafkaError.none
    assert b_joined.generation_id == second.generation_id == first.generation_id + 1


@contextlib.contextmanager
def _connections_to_two_servers(a_side, make_server):
    """A connection to `a_side`, and one to a second server (process) on its database."""
    b_side = make_server(kafka_listener="127.0.0.1:0")
    with RawConnection(a_side.extra["kafka_bootstrap"]) as a, RawConnection(b_side.extra["kafka_bootstrap"]) as b:
        yield a, b


def _b_joins_a_group_of_a(a: RawConnection, b: RawConnection, server):
    """A makes GROUP alone (generation 1, Stable); B's JoinGroup begins a rebalance and waits; A's
    rejoin completes it. A's first and second JoinGroup answers, and B's."""
    first = join(a, GROUP, instance="a", session=LONG, rebalance=LONG)
    sync(a, GROUP, first.member_id, first.generation_id, {first.member_id: b""})
    b_joining = b.send(join_request(GROUP, instance="b", session=LONG, rebalance=LONG))
    _poll_until(lambda: len(_classic_state(server)["members"]) == 2, "B's JoinGroup waiting for A")
    second = join(a, GROUP, first.member_id, instance="a", session=LONG, rebalance=LONG)  # completes it
    return first, second, b.receive(api_table.JOIN_GROUP, JOIN_VERSION, b_joining)


def _classic_state(server) -> dict:
    (row,) = sql(
        server.database_url, "SELECT assignment -> '' AS classic FROM consumer_groups WHERE group_id = $1", GROUP
    )
    return row["classic"]


def _awaiting_sync(server) -> list[str]:
    return (_classic_state(server)["awaiting_sync"] or {}).get("member_ids", [])


def _group_state(server) -> str:
    return _classic_state(server)["state"]
