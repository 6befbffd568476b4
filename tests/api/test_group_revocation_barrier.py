"""HTTP groups' revocation barrier over real HTTP against real PostgreSQL: a partition a new
generation moves from member A to member B reaches B's answered assignment only once A acknowledged
the generation that revoked it (a heartbeat naming it, sent after A's pre-revocation commit), left,
was evicted, or its revocation deadline passed (KIP-848's rule, app/coordinator/http_revocations.py).
Without it B read the partition from the committed offset while A was still processing it, and A's
commit made in the new generation (accepted) could move the group's offset back behind B's."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.api.test_consumer_groups import assigned, commit, committed, describe, entry_codes, error_of
from tests.conftest import restarted_after, start_server_on_fresh_database


def heartbeat(
    client: httpx.Client,
    member_id: str = "",
    generation_id: int = -1,
    session_timeout_ms: int = 30_000,
    rebalance_timeout_ms: int | None = None,
    group: str = "g",
) -> dict:
    body = {
        "member_id": member_id,
        "generation_id": generation_id,
        "topics": ["t"],
        "session_timeout_ms": session_timeout_ms,
    }
    if rebalance_timeout_ms is not None:
        body["rebalance_timeout_ms"] = rebalance_timeout_ms
    response = client.post(f"/v1/groups/{group}/heartbeat", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def member_described(client: httpx.Client, member_id: str) -> dict:
    [member] = [m for m in describe(client, "g")["members"] if m["member_id"] == member_id]
    return member


def two_members(client: httpx.Client, **a_options) -> tuple[dict, dict, int]:
    """A joins and gets both partitions of t; B joins (a new generation moves one of them to B).
    Returns A's and B's join answers and the partition moved."""
    a = heartbeat(client, **a_options)
    assert assigned(a) == {"t": [0, 1]}
    b = heartbeat(client)
    assert b["generation_id"] == a["generation_id"] + 1
    # The range assignment gives the member with the smaller id partition 0.
    moved = 1 if a["member_id"] < b["member_id"] else 0
    return a, b, moved


@pytest.fixture
def client(server) -> httpx.Client:
    server.client.post("/v1/topics", json={"name": "t", "partitions": 2}).raise_for_status()
    return server.client


def test_a_moved_partition_reaches_its_new_owner_only_after_the_previous_owner_acknowledged(client):
    """The review's scenario: A's on_revoke commits the moved partition's position under the new
    generation (accepted); B must not have been given the partition before that commit, so B reads
    it from A's committed offset, and B's own commits are never taken back by A's."""
    a, b, moved = two_members(client)
    assert assigned(b) == {}, "the moved partition is still A's: A has not revoked it"
    # A's next heartbeat (acknowledging nothing new: generation -1) brings the new generation.
    a_new = heartbeat(client, a["member_id"], a["generation_id"])
    assert a_new["generation_id"] == b["generation_id"] and assigned(a_new) == {"t": [1 - moved]}
    assert assigned(heartbeat(client, b["member_id"])) == {}, "A has not acknowledged the generation yet"
    described = member_described(client, b["member_id"])
    assert described["awaiting"] == [{"topic": "t", "partitions": [moved]}]
    assert described["assignment"] == described["target_assignment"] == [{"topic": "t", "partitions": [moved]}]
    assert member_described(client, a["member_id"])["revoking"] == [{"topic": "t", "partitions": [moved]}]
    # A's on_revoke: it commits what it processed of the partition, in the new generation.
    results = commit(client, "g", [("t", moved, 7)], a["member_id"], a_new["generation_id"])
    assert entry_codes(results) == [None]
    # Then it acknowledges the generation: the partition is B's at B's next heartbeat.
    heartbeat(client, a["member_id"], a_new["generation_id"])
    assert member_described(client, a["member_id"])["revoking"] == []
    b_now = heartbeat(client, b["member_id"], b["generation_id"])
    assert b_now["generation_id"] == b["generation_id"], "released within the generation: no rebalance"
    assert assigned(b_now) == {"t": [moved]}
    assert member_described(client, b["member_id"])["awaiting"] == []
    assert committed(client, "g", [("t", moved)]) == {("t", moved): 7}, "B starts where A stopped"
    assert entry_codes(commit(client, "g", [("t", moved, 12)], b["member_id"], b_now["generation_id"])) == [None]


def test_an_acknowledgement_of_an_earlier_generation_releases_nothing(client):
    """A heartbeat naming the generation A was in before the rebalance (the one whose answer gave A
    the partition) says nothing of the revocation: the partition stays A's."""
    a, b, moved = two_members(client)
    heartbeat(client, a["member_id"], a["generation_id"])  # answered the new generation
    heartbeat(client, a["member_id"], a["generation_id"])  # still acknowledging the old one
    assert assigned(heartbeat(client, b["member_id"])) == {}


def test_a_member_that_never_acknowledges_releases_at_its_rebalance_timeout(make_server):
    """An old client (generation_id -1 always) keeps working: its partitions move once its
    revocation deadline passes (its rebalance timeout, here 1 s), though it stays a member and keeps
    heartbeating."""
    server = make_server(group_session_check_interval_ms=100_000)  # the release is the heartbeat's
    client = server.client
    client.post("/v1/topics", json={"name": "t", "partitions": 2}).raise_for_status()
    rebalanced_at = time.monotonic()
    a, b, moved = two_members(client, rebalance_timeout_ms=1_000)
    assert assigned(heartbeat(client, a["member_id"], rebalance_timeout_ms=1_000)) == {"t": [1 - moved]}
    while not assigned(heartbeat(client, b["member_id"])):
        assert time.monotonic() - rebalanced_at < 10, "the partition was never released"
        time.sleep(0.05)
    assert time.monotonic() - rebalanced_at >= 0.95, "released before A's rebalance timeout"
    assert assigned(heartbeat(client, b["member_id"])) == {"t": [moved]}
    still = heartbeat(client, a["member_id"], rebalance_timeout_ms=1_000)
    assert still["generation_id"] == b["generation_id"] and assigned(still) == {"t": [1 - moved]}


def test_without_a_rebalance_timeout_the_deadline_is_the_session_timeout(make_server):
    server = make_server(group_session_check_interval_ms=100_000)
    client = server.client
    client.post("/v1/topics", json={"name": "t", "partitions": 2}).raise_for_status()
    rebalanced_at = time.monotonic()
    a, b, moved = two_members(client, session_timeout_ms=1_500)
    while not assigned(heartbeat(client, b["member_id"])):
        heartbeat(client, a["member_id"], session_timeout_ms=1_500)  # A stays alive, never acknowledging
        assert time.monotonic() - rebalanced_at < 10, "the partition was never released"
        time.sleep(0.05)
    assert time.monotonic() - rebalanced_at >= 1.45, "released before A's session timeout"
    assert [m["member_id"] for m in describe(client, "g")["members"]] == sorted([a["member_id"], b["member_id"]])


def test_a_rebalance_timeout_of_zero_gives_the_partition_at_once(client):
    """A client that wants no barrier (the behaviour before 2026-11-28) says so."""
    a, b, moved = two_members(client, rebalance_timeout_ms=0)
    assert assigned(b) == {"t": [moved]}


def test_the_eviction_worker_releases_an_overdue_revocation(make_server):
    """Nobody heartbeats after the rebalance: the worker (not B's heartbeat) releases A's overdue
    partition, which the describe shows free, and A stays a member."""
    server = make_server(group_session_check_interval_ms=50)
    client = server.client
    client.post("/v1/topics", json={"name": "t", "partitions": 2}).raise_for_status()
    a, b, moved = two_members(client, rebalance_timeout_ms=500)
    assert member_described(client, b["member_id"])["awaiting"] == [{"topic": "t", "partitions": [moved]}]
    deadline = time.monotonic() + 10
    while member_described(client, b["member_id"])["awaiting"]:
        assert time.monotonic() < deadline, "the worker never released the overdue partition"
        time.sleep(0.05)
    assert member_described(client, a["member_id"])["revoking"] == []
    assert assigned(heartbeat(client, b["member_id"])) == {"t": [moved]}


def test_a_member_that_leaves_releases_its_partitions_at_once(client):
    a, b, moved = two_members(client)
    assert assigned(b) == {}
    left = client.post("/v1/groups/g/leave", json={"member_id": a["member_id"]})
    assert left.status_code == 200, left.text
    now = heartbeat(client, b["member_id"])
    assert now["generation_id"] == b["generation_id"] + 1 and assigned(now) == {"t": [0, 1]}


def test_an_evicted_member_releases_its_partitions(make_server):
    server = make_server(group_session_check_interval_ms=50)
    client = server.client
    client.post("/v1/topics", json={"name": "t", "partitions": 2}).raise_for_status()
    a, b, moved = two_members(client, session_timeout_ms=1_000)
    assert assigned(b) == {}
    deadline = time.monotonic() + 10
    while len(describe(client, "g")["members"]) == 2:
        heartbeat(client, b["member_id"])
        assert time.monotonic() < deadline, "the silent member was never evicted"
        time.sleep(0.05)
    assert assigned(heartbeat(client, b["member_id"])) == {"t": [0, 1]}
    gone = client.post("/v1/groups/g/heartbeat", json={"member_id": a["member_id"], "topics": ["t"]})
    assert gone.status_code == 409 and error_of(gone)["code"] == "UNKNOWN_MEMBER_ID"


def test_partitions_released_to_a_member_keep_the_barrier_for_the_next_move(client):
    """B, given the partition once A acknowledged, owns it: a third member that the next
    generation gives it waits for B in turn."""
    a, b, moved = two_members(client)
    a_new = heartbeat(client, a["member_id"])
    heartbeat(client, a["member_id"], a_new["generation_id"])
    assert assigned(heartbeat(client, b["member_id"])) == {"t": [moved]}
    a_left = client.post("/v1/groups/g/leave", json={"member_id": a["member_id"]})
    assert a_left.status_code == 200
    c = heartbeat(client)
    c_moved = 1 if b["member_id"] < c["member_id"] else 0
    b_now = heartbeat(client, b["member_id"])
    assert assigned(b_now) == {"t": [1 - c_moved]}
    assert assigned(heartbeat(client, c["member_id"])) == ({} if c_moved == moved else {"t": [c_moved]})


def test_the_barrier_holds_across_servers(server, client, make_server):
    """A heartbeats on one server, B on another (one database): B is held back and then released
    by what A's server recorded, under the group's row lock, not by anything a process remembers."""
    other = make_server().client
    a = heartbeat(client)
    b = heartbeat(other)
    moved = 1 if a["member_id"] < b["member_id"] else 0
    a_new = heartbeat(client, a["member_id"])
    assert assigned(heartbeat(other, b["member_id"])) == {}
    heartbeat(client, a["member_id"], a_new["generation_id"])
    assert assigned(heartbeat(other, b["member_id"])) == {"t": [moved]}


def test_a_restart_does_not_count_against_a_member_revoking_its_partitions(postgres):
    """The time no server could hear the members (every node down) is given back to a revocation
    underway, as to sessions and to KIP-848's revocations: a partition whose previous owner had
    1.5 s left to revoke it when the server stopped is still held back right after a restart longer
    than that, and released once the rest of that time passed."""
    settings = {"group_session_check_interval_ms": 100}
    running = start_server_on_fresh_database(postgres, "http_barrier_restart", **settings)
    running.client.post("/v1/topics", json={"name": "t", "partitions": 2}).raise_for_status()
    a, b, moved = two_members(running.client, rebalance_timeout_ms=1_500)
    # Down longer than the rebalance timeout, shorter than the session.
    with restarted_after(running, 2, **settings) as restarted:
        time.sleep(0.5)  # the first session check (every 100 ms) credits the time nobody heard them
        started = time.monotonic()
        assert assigned(heartbeat(restarted.client, b["member_id"])) == {}, "the downtime counted"
        while not assigned(heartbeat(restarted.client, b["member_id"])):
            assert time.monotonic() - started < 10, "the partition was never released"
            time.sleep(0.05)
        assert assigned(heartbeat(restarted.client, b["member_id"])) == {"t": [moved]}
