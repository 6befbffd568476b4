"""Consumer groups over real HTTP against real PostgreSQL: OffsetCommit/OffsetFetch, membership with
server-side range assignment (join, rebalance, leave, session expiry), generation checks on
commits, transactional offsets (KIP-98's TxnOffsetCommit: invisible until the COMMIT marker),
KIP-447 zombie fencing, and describe/list with lag counted in records, not markers."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import asyncpg
import httpx
import pytest

from app.storage.groups import group_offsets
from app.storage.groups.group_offsets import MARKERS_COUNTED, MARKERS_READ
from tests.api.test_transactions import TxnProducer
from tests.many_transactions import HIGH_WATERMARK, marker_rows_read, write_many_transactions

OFFSETS_TOPIC = "__consumer_offsets"


# ---- helpers speaking the contract


def heartbeat(
    client: httpx.Client,
    group: str,
    member_id: str = "",
    topics=("t",),
    session_timeout_ms: int = 30_000,
    generation_id: int = -1,
) -> dict:
    response = client.post(
        f"/v1/groups/{group}/heartbeat",
        json={
            "member_id": member_id,
            "generation_id": generation_id,
            "topics": list(topics),
            "session_timeout_ms": session_timeout_ms,
        },
    )
    assert response.status_code == 200, response.text
    return response.json()


def assigned(body: dict) -> dict[str, list[int]]:
    """topic -> partitions of a heartbeat answer (or a described member), empty lists left out."""
    return {a["topic"]: a["partitions"] for a in body["assignment"] if a["partitions"]}


def commit(
    client: httpx.Client,
    group: str,
    offsets: list[tuple],
    member_id: str = "",
    generation_id: int = -1,
    require_advance: bool = False,
) -> list[dict]:
    """offsets: (topic, partition, offset[, metadata]). Returns the per-entry results."""
    response = client.post(
        f"/v1/groups/{group}/offsets/commit",
        json={
            "member_id": member_id,
            "generation_id": generation_id,
            "offsets": [
                {"topic": o[0], "partition": o[1], "offset": o[2], "metadata": o[3] if len(o) > 3 else None}
                for o in offsets
            ],
            **({"require_advance": True} if require_advance else {}),
        },
    )
    assert response.status_code == 200, response.text
    return response.json()["offsets"]


def fetch_offsets(
    client: httpx.Client, group: str, partitions: list[tuple[str, int]] | None = None, require_stable: bool = False
) -> list[dict]:
    response = client.post(
        f"/v1/groups/{group}/offsets/fetch",
        json={
            "partitions": None if partitions is None else [{"topic": t, "partition": p} for t, p in partitions],
            "require_stable": require_stable,
        },
    )
    assert response.status_code == 200, response.text
    return response.json()["offsets"]


def committed(client: httpx.Client, group: str, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    return {(o["topic"], o["partition"]): o["offset"] for o in fetch_offsets(client, group, partitions)}


def txn_offset_commit(
    client: httpx.Client,
    producer: TxnProducer,
    group: str,
    offsets: list[tuple],
    member_id: str = "",
    generation_id: int = -1,
) -> httpx.Response:
    return client.post(
        "/v1/txn/offset-commit",
        json={
            **producer.ids(),
            "group_id": group,
            "member_id": member_id,
            "generation_id": generation_id,
            "offsets": [
                {"topic": o[0], "partition": o[1], "offset": o[2], "metadata": o[3] if len(o) > 3 else None}
                for o in offsets
            ],
        },
    )


def entry_codes(entries: list[dict]) -> list[str | None]:
    return [None if e["error"] is None else e["error"]["code"] for e in entries]


def describe(client: httpx.Client, group: str) -> dict:
    response = client.get(f"/v1/groups/{group}")
    assert response.status_code == 200, response.text
    return response.json()


def error_of(response: httpx.Response) -> dict:
    return response.json()["error"]


def range_split(members: list[str], partitions: int) -> dict[str, list[int]]:
    per, extra = divmod(partitions, len(members))
    result, start = {}, 0
    for i, member in enumerate(sorted(members)):
        size = per + (1 if i < extra else 0)
        result[member] = list(range(start, start + size))
        start += size
    return result


def settled(client: httpx.Client, group: str, members: list[str], topics=("t",)) -> list[dict]:
    """The members' answers once the group's revocation barrier has settled: each member heartbeats,
    acknowledging the generation of its last answer (its revocations done), until a round changes
    no answer. A partition moved from one member to another reaches the second only after the first
    acknowledged the generation that revoked it. `topics`: every member's, or each one's by id."""
    subscribed = topics if isinstance(topics, dict) else dict.fromkeys(members, topics)
    answers = [heartbeat(client, group, m, topics=subscribed[m]) for m in members]
    # Two rounds in a row that change nothing: in the first, a member's acknowledgement may release
    # a partition after another member's heartbeat of that round was answered without it.
    unchanged = 0
    for _ in range(12):
        again = [
            heartbeat(client, group, m, topics=subscribed[m], generation_id=a["generation_id"])
            for m, a in zip(members, answers)
        ]
        unchanged = unchanged + 1 if again == answers else 0
        if unchanged == 2:
            return answers
        answers = again
    raise AssertionError(f"the group's answers did not settle: {answers}")


@pytest.fixture
def client(server) -> httpx.Client:
    for name, partitions in (("t", 3), ("u", 2)):
        server.client.post("/v1/topics", json={"name": name, "partitions": partitions}).raise_for_status()
    return server.client


# ---- OffsetCommit / OffsetFetch


def test_simple_commit_and_fetch_round_trip_offset_and_metadata(client):
    results = commit(client, "g", [("t", 0, 5, "hello"), ("t", 2, 7, None), ("u", 1, 0, "é ✓ {json}")])
    assert results == [
        {"topic": "t", "partition": 0, "error": None},
        {"topic": "t", "partition": 2, "error": None},
        {"topic": "u", "partition": 1, "error": None},
    ]
    fetched = fetch_offsets(client, "g", [("t", 0), ("t", 2), ("u", 1)])
    assert [(o["topic"], o["partition"], o["offset"], o["metadata"], o["error"]) for o in fetched] == [
        ("t", 0, 5, "hello", None),
        ("t", 2, 7, None, None),
        ("u", 1, 0, "é ✓ {json}", None),
    ]
    # a later commit replaces the offset and the metadata
    commit(client, "g", [("t", 0, 9, "again")])
    assert [(o["offset"], o["metadata"]) for o in fetch_offsets(client, "g", [("t", 0)])] == [(9, "again")]


def test_fetch_answers_in_request_order_and_minus_one_for_never_committed(client):
    commit(client, "g", [("t", 1, 3)])
    fetched = fetch_offsets(client, "g", [("u", 0), ("t", 1), ("t", 0)])
    assert [(o["topic"], o["partition"], o["offset"], o["metadata"], o["error"]) for o in fetched] == [
        ("u", 0, -1, None, None),
        ("t", 1, 3, None, None),
        ("t", 0, -1, None, None),
    ]


def test_fetch_of_a_group_that_never_committed_answers_minus_one(client):
    assert [o["offset"] for o in fetch_offsets(client, "nobody", [("t", 0), ("u", 1)])] == [-1, -1]
    assert fetch_offsets(client, "nobody", None) == []


def test_fetch_with_partitions_null_lists_every_committed_partition(client):
    commit(client, "g", [("u", 1, 4, "m"), ("t", 2, 2), ("t", 0, 1)])
    commit(client, "other-group", [("t", 1, 100)])
    fetched = fetch_offsets(client, "g", None)
    assert sorted((o["topic"], o["partition"], o["offset"], o["metadata"]) for o in fetched) == [
        ("t", 0, 1, None),
        ("t", 2, 2, None),
        ("u", 1, 4, "m"),
    ]
    assert all(o["error"] is None for o in fetched)


def test_commit_of_unknown_topic_or_partition_fails_only_that_entry(client):
    results = commit(client, "g", [("t", 0, 1), ("missing", 0, 1), ("t", 3, 1), ("u", 1, 2)])
    assert entry_codes(results) == [None, "UNKNOWN_TOPIC_OR_PARTITION", "UNKNOWN_TOPIC_OR_PARTITION", None]
    assert results[1]["error"]["retriable"] is False
    assert committed(client, "g", [("t", 0), ("u", 1), ("t", 3), ("missing", 0)]) == {
        ("t", 0): 1,
        ("u", 1): 2,
        ("t", 3): -1,
        ("missing", 0): -1,
    }
    assert sorted((o["topic"], o["partition"]) for o in fetch_offsets(client, "g", None)) == [("t", 0), ("u", 1)]


def committed_with_metadata(client: httpx.Client, group: str, partitions: list[tuple[str, int]]) -> list[tuple]:
    return [(o["offset"], o["metadata"]) for o in fetch_offsets(client, group, partitions)]


def test_a_commit_with_require_advance_writes_only_past_the_committed_offset(client):
    assert entry_codes(commit(client, "g", [("t", 0, 3, "first")], require_advance=True)) == [None]
    # At or below the committed offset: refused, whatever its metadata; nothing changes.
    refused = commit(client, "g", [("t", 0, 3, "second"), ("t", 0, 2, "older")], require_advance=True)
    assert entry_codes(refused) == ["OFFSET_NOT_ADVANCED", "OFFSET_NOT_ADVANCED"]
    assert refused[0]["error"]["retriable"] is False and "offset 3 committed" in refused[0]["error"]["message"]
    assert committed_with_metadata(client, "g", [("t", 0)]) == [(3, "first")]
    # The commit that wrote it, repeated (its answer lost): answered as written.
    assert entry_codes(commit(client, "g", [("t", 0, 3, "first")], require_advance=True)) == [None]
    # Each partition is judged on its own; past the committed offset, or where none is, it is written.
    results = commit(client, "g", [("t", 0, 4, "next"), ("t", 1, 0, "new"), ("u", 0, 1)], require_advance=True)
    assert entry_codes(results) == [None, None, None]
    assert committed_with_metadata(client, "g", [("t", 0), ("t", 1), ("u", 0)]) == [(4, "next"), (0, "new"), (1, None)]
    mixed = commit(client, "g", [("t", 0, 4, "late"), ("t", 2, 9)], require_advance=True)
    assert entry_codes(mixed) == ["OFFSET_NOT_ADVANCED", None]
    # Without it, the last commit wins as before (Kafka's OffsetCommit).
    assert entry_codes(commit(client, "g", [("t", 0, 1, "rewound")])) == [None]
    assert committed_with_metadata(client, "g", [("t", 0)]) == [(1, "rewound")]


def test_a_commit_with_require_advance_naming_a_partition_twice_writes_it_once(client):
    """Each entry is judged against the offset as the entries before it in the request leave it:
    both judged against the offset committed before, both were written and the second moved the
    first back (7, then 5, answered as written)."""
    twice = commit(client, "g", [("t", 0, 7, "first"), ("t", 0, 5, "older")], require_advance=True)
    assert entry_codes(twice) == [None, "OFFSET_NOT_ADVANCED"]
    assert "offset 7 committed" in twice[1]["error"]["message"]
    assert committed_with_metadata(client, "g", [("t", 0)]) == [(7, "first")]
    # One offset with two metadata: the first is written; its exact repeat is answered as written.
    again = commit(client, "g", [("t", 0, 8, "a"), ("t", 0, 8, "b"), ("t", 0, 8, "a")], require_advance=True)
    assert entry_codes(again) == [None, "OFFSET_NOT_ADVANCED", None]
    assert committed_with_metadata(client, "g", [("t", 0)]) == [(8, "a")]


def commit_first_offset(url: str, group: str, writer: int, start: threading.Barrier, answers: dict[int, dict]) -> None:
    """One writer's commit of offset 0 of t-0 with require_advance, begun with the others."""
    with httpx.Client(base_url=url, timeout=60) as own:
        start.wait(30)
        response = own.post(
            f"/v1/groups/{group}/offsets/commit",
            json={
                "offsets": [{"topic": "t", "partition": 0, "offset": 0, "metadata": f"writer-{writer}"}],
                "require_advance": True,
            },
        )
        answers[writer] = response.json()["offsets"][0]


def test_concurrent_commits_of_one_offset_with_require_advance_on_two_servers_write_it_once(
    server, client, make_server
):
    """Writers on two server processes' pools commit the same offset of a partition with their own
    metadata, all at once: exactly one is written, each other one is refused, whatever the
    interleaving -- the check and the write hold the group's __consumer_offsets partition. (The
    group exists already: a group's creation alone would serialize its first commits.)"""
    urls = [server.url, make_server().url]
    writers = 6
    for round_ in range(10):
        group = f"first-wins-{round_}"
        commit(client, group, [("t", 1, 0)])
        start, answers = threading.Barrier(writers), {}
        threads = [
            threading.Thread(target=commit_first_offset, args=(urls[writer % 2], group, writer, start, answers))
            for writer in range(writers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        winners = [writer for writer, answer in answers.items() if answer["error"] is None]
        assert len(answers) == writers and len(winners) == 1, answers
        refused = {answer["error"]["code"] for writer, answer in answers.items() if writer not in winners}
        assert refused == {"OFFSET_NOT_ADVANCED"}
        assert committed_with_metadata(client, group, [("t", 0)]) == [(0, f"writer-{winners[0]}")]


def test_commits_are_per_group(client):
    commit(client, "a", [("t", 0, 10)])
    commit(client, "b", [("t", 0, 20)])
    assert committed(client, "a", [("t", 0)]) == {("t", 0): 10}
    assert committed(client, "b", [("t", 0)]) == {("t", 0): 20}


# ---- membership


def test_first_member_joins_with_empty_id_and_gets_everything(client):
    joined = heartbeat(client, "g", topics=["t", "u"], session_timeout_ms=9_000)
    assert joined["member_id"], "the server assigns a member id"
    assert joined["generation_id"] >= 1
    assert joined["heartbeat_interval_ms"] > 0 and joined["heartbeat_interval_ms"] < 9_000
    assert assigned(joined) == {"t": [0, 1, 2], "u": [0, 1]}
    again = heartbeat(client, "g", joined["member_id"], topics=["t", "u"], session_timeout_ms=9_000)
    assert again["member_id"] == joined["member_id"]
    assert again["generation_id"] == joined["generation_id"], "a plain heartbeat is no membership change"
    assert assigned(again) == assigned(joined)


def test_second_member_bumps_the_generation_and_the_partitions_are_split_by_range(client):
    a = heartbeat(client, "g", topics=["t"])
    b = heartbeat(client, "g", topics=["t"])
    assert b["member_id"] != a["member_id"]
    assert b["generation_id"] == a["generation_id"] + 1
    a_again = heartbeat(client, "g", a["member_id"], topics=["t"])
    assert a_again["generation_id"] == b["generation_id"], "every heartbeat answers the current generation"
    expected = range_split([a["member_id"], b["member_id"]], 3)
    assert assigned(a_again) == {"t": expected[a["member_id"]]}
    # b's partitions are a's until a acknowledges the generation that revoked them (the barrier)
    assert assigned(b) == {}
    a_again, b = settled(client, "g", [a["member_id"], b["member_id"]])
    assert assigned(a_again) == {"t": expected[a["member_id"]]}
    assert assigned(b) == {"t": expected[b["member_id"]]}
    # deterministic: more heartbeats change nothing
    for _ in range(3):
        assert assigned(heartbeat(client, "g", a["member_id"], topics=["t"])) == {"t": expected[a["member_id"]]}
        again = heartbeat(client, "g", b["member_id"], topics=["t"])
        assert assigned(again) == {"t": expected[b["member_id"]]}
        assert again["generation_id"] == b["generation_id"]


def test_three_members_each_partition_owned_once(client):
    members = [heartbeat(client, "g", topics=["t", "u"])["member_id"] for _ in range(3)]
    answers = settled(client, "g", members, topics=["t", "u"])
    assert len({a["generation_id"] for a in answers}) == 1
    owned = sorted((topic, p) for a in answers for topic, parts in assigned(a).items() for p in parts)
    assert owned == [("t", 0), ("t", 1), ("t", 2), ("u", 0), ("u", 1)]
    expected_t = range_split(members, 3)
    expected_u = range_split(members, 2)
    for member, answer in zip(members, answers):
        want = {"t": expected_t[member], "u": expected_u[member]}
        assert assigned(answer) == {k: v for k, v in want.items() if v}


def test_leave_bumps_the_generation_and_the_other_member_gets_everything(client):
    a = heartbeat(client, "g", topics=["t"])
    b = heartbeat(client, "g", topics=["t"])
    left = client.post("/v1/groups/g/leave", json={"member_id": a["member_id"]})
    assert left.status_code == 200, left.text
    assert left.json() == {}
    after = heartbeat(client, "g", b["member_id"], topics=["t"])
    assert after["generation_id"] == b["generation_id"] + 1
    assert assigned(after) == {"t": [0, 1, 2]}
    gone = client.post("/v1/groups/g/heartbeat", json={"member_id": a["member_id"], "topics": ["t"]})
    assert gone.status_code == 409 and error_of(gone)["code"] == "UNKNOWN_MEMBER_ID"
    again = client.post("/v1/groups/g/leave", json={"member_id": a["member_id"]})
    assert again.status_code == 409 and error_of(again)["code"] == "UNKNOWN_MEMBER_ID"


def test_heartbeat_of_an_unknown_member_is_unknown_member_id(client):
    heartbeat(client, "g", topics=["t"])
    for group in ("g", "no-such-group"):
        response = client.post(f"/v1/groups/{group}/heartbeat", json={"member_id": "member-made-up", "topics": ["t"]})
        assert response.status_code == 409, response.text
        error = error_of(response)
        assert error["code"] == "UNKNOWN_MEMBER_ID" and error["retriable"] is False
        assert "member-made-up" in error["message"]


def join_with(client: httpx.Client, group: str, join_id: str, topics=("t",)) -> httpx.Response:
    return client.post(
        f"/v1/groups/{group}/heartbeat", json={"member_id": "", "join_id": join_id, "topics": list(topics)}
    )


def test_a_join_repeated_with_its_join_id_is_one_member_not_two(client):
    """A join whose answer was lost, sent again: without a join_id the second attempt is a second
    member, and the first, which nobody heartbeats, holds its partitions until its session times
    out. With one, every attempt is the same join: the member it made, the same generation."""
    first = join_with(client, "g", "join-1")
    again = join_with(client, "g", "join-1")
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert again.json()["member_id"] == first.json()["member_id"]
    assert again.json()["generation_id"] == first.json()["generation_id"]
    assert assigned(again.json()) == {"t": [0, 1, 2]}
    assert [m["member_id"] for m in describe(client, "g")["members"]] == [first.json()["member_id"]]
    # The member id does not give the join_id away (another client could join as that member).
    assert "join-1" not in first.json()["member_id"]
    # Another join is another member; a join with the first join_id in another topic set changes its topics.
    other = join_with(client, "g", "join-2").json()
    assert other["member_id"] != first.json()["member_id"]
    assert len(describe(client, "g")["members"]) == 2
    widened = join_with(client, "g", "join-1", topics=("t", "u")).json()
    assert widened["member_id"] == first.json()["member_id"] and widened["generation_id"] > other["generation_id"]


def test_a_join_id_with_a_member_id_is_invalid_request(client):
    member = heartbeat(client, "g", topics=["t"])["member_id"]
    response = client.post("/v1/groups/g/heartbeat", json={"member_id": member, "join_id": "join-1", "topics": ["t"]})
    assert response.status_code == 400, response.text
    assert error_of(response)["code"] == "INVALID_REQUEST" and "join_id" in error_of(response)["message"]
    for bad in ("", "x" * 1025, 7):
        response = client.post("/v1/groups/g/heartbeat", json={"member_id": "", "join_id": bad, "topics": ["t"]})
        assert response.status_code == 400 and error_of(response)["code"] == "INVALID_REQUEST", response.text
    assert len(describe(client, "g")["members"]) == 1, "nothing joined"


def test_changing_the_subscribed_topics_bumps_the_generation(client):
    a = heartbeat(client, "g", topics=["t"])
    same_in_other_order = heartbeat(client, "g", a["member_id"], topics=["t", "t"])
    assert same_in_other_order["generation_id"] == a["generation_id"]
    widened = heartbeat(client, "g", a["member_id"], topics=["u", "t"])
    assert widened["generation_id"] == a["generation_id"] + 1
    assert assigned(widened) == {"t": [0, 1, 2], "u": [0, 1]}
    reordered = heartbeat(client, "g", a["member_id"], topics=["t", "u"])
    assert reordered["generation_id"] == widened["generation_id"], "the same set in another order is no change"
    narrowed = heartbeat(client, "g", a["member_id"], topics=["u"])
    assert narrowed["generation_id"] == widened["generation_id"] + 1
    assert assigned(narrowed) == {"u": [0, 1]}


def test_members_with_different_subscriptions(client):
    a = heartbeat(client, "g", topics=["t"])
    b = heartbeat(client, "g", topics=["t", "u"])
    a_now = heartbeat(client, "g", a["member_id"], topics=["t"])
    assert assigned(b) == {"u": [0, 1]}, "b's partitions of t are a's until a acknowledges their revocation"
    a_now, b = settled(
        client, "g", [a["member_id"], b["member_id"]], {a["member_id"]: ["t"], b["member_id"]: ["t", "u"]}
    )
    split = range_split([a["member_id"], b["member_id"]], 3)
    assert assigned(a_now) == {"t": split[a["member_id"]]}
    assert assigned(b) == {"t": split[b["member_id"]], "u": [0, 1]}, "only b subscribes to u"


def test_unknown_topics_in_a_subscription_are_not_assigned(client):
    joined = heartbeat(client, "g", topics=["t", "not-yet-created"])
    assert assigned(joined) == {"t": [0, 1, 2]}


def test_session_timeout_evicts_a_silent_member_and_bumps_the_generation(make_server):
    server = make_server(group_session_check_interval_ms=50)
    client = server.client
    client.post("/v1/topics", json={"name": "t", "partitions": 3}).raise_for_status()
    joined_at = time.monotonic()  # before the join: the session starts while the request is served
    silent = heartbeat(client, "g", topics=["t"], session_timeout_ms=1_000)
    alive = heartbeat(client, "g", topics=["t"], session_timeout_ms=60_000)
    generation = alive["generation_id"]
    # Nobody heartbeats: the background worker (not a heartbeat) must evict the silent member.
    deadline = joined_at + 10
    while True:
        described = describe(client, "g")
        if [m["member_id"] for m in described["members"]] == [alive["member_id"]] and described[
            "generation_id"
        ] != generation:
            break
        assert time.monotonic() < deadline, f"the silent member was never evicted: {described}"
        time.sleep(0.05)
    assert time.monotonic() - joined_at >= 0.95, "evicted before its session timed out"
    assert described["generation_id"] == generation + 1
    assert assigned(described["members"][0]) == {"t": [0, 1, 2]}
    now = heartbeat(client, "g", alive["member_id"], topics=["t"], session_timeout_ms=60_000)
    assert now["generation_id"] == generation + 1 and assigned(now) == {"t": [0, 1, 2]}
    late = client.post(
        "/v1/groups/g/heartbeat", json={"member_id": silent["member_id"], "topics": ["t"], "session_timeout_ms": 1_000}
    )
    assert late.status_code == 409 and error_of(late)["code"] == "UNKNOWN_MEMBER_ID"
    # the evicted member's commit with its last generation is refused per entry
    results = commit(client, "g", [("t", 0, 5)], silent["member_id"], generation)
    assert entry_codes(results) == ["UNKNOWN_MEMBER_ID"]
    assert committed(client, "g", [("t", 0)]) == {("t", 0): -1}


def test_heartbeats_keep_a_short_session_alive(make_server):
    server = make_server(group_session_check_interval_ms=50)
    client = server.client
    client.post("/v1/topics", json={"name": "t", "partitions": 1}).raise_for_status()
    member = heartbeat(client, "g", topics=["t"], session_timeout_ms=1_000)
    for _ in range(8):  # 2 s of heartbeats every 250 ms, twice the session timeout
        time.sleep(0.25)
        answer = heartbeat(client, "g", member["member_id"], topics=["t"], session_timeout_ms=1_000)
        assert answer["generation_id"] == member["generation_id"]
    assert [m["member_id"] for m in describe(client, "g")["members"]] == [member["member_id"]]


def test_session_timeout_below_the_minimum_is_invalid(client):
    response = client.post("/v1/groups/g/heartbeat", json={"member_id": "", "topics": ["t"], "session_timeout_ms": 999})
    assert response.status_code == 400 and error_of(response)["code"] == "INVALID_REQUEST"


# ---- generation checks on plain commits


def test_commit_with_the_current_generation_succeeds(client):
    a = heartbeat(client, "g", topics=["t"])
    results = commit(client, "g", [("t", 0, 3, "gen")], a["member_id"], a["generation_id"])
    assert entry_codes(results) == [None]
    assert fetch_offsets(client, "g", [("t", 0)])[0]["metadata"] == "gen"


def test_commit_with_an_older_generation_is_illegal_generation_per_entry(client):
    a = heartbeat(client, "g", topics=["t"])
    commit(client, "g", [("t", 0, 1)], a["member_id"], a["generation_id"])
    heartbeat(client, "g", topics=["t"])  # b joins: a rebalance
    results = commit(client, "g", [("t", 0, 50), ("t", 1, 50), ("u", 0, 50)], a["member_id"], a["generation_id"])
    assert entry_codes(results) == ["ILLEGAL_GENERATION"] * 3
    assert results[0]["error"]["retriable"] is False
    assert committed(client, "g", [("t", 0), ("t", 1), ("u", 0)]) == {("t", 0): 1, ("t", 1): -1, ("u", 0): -1}
    # a newer generation than the group's is just as illegal
    current = heartbeat(client, "g", a["member_id"], topics=["t"])
    results = commit(client, "g", [("t", 0, 60)], a["member_id"], current["generation_id"] + 1)
    assert entry_codes(results) == ["ILLEGAL_GENERATION"]
    # the member adopts the new generation and commits again
    results = commit(client, "g", [("t", 0, 70)], a["member_id"], current["generation_id"])
    assert entry_codes(results) == [None]
    assert committed(client, "g", [("t", 0)]) == {("t", 0): 70}


def test_commit_by_an_unknown_member_is_unknown_member_id_per_entry(client):
    a = heartbeat(client, "g", topics=["t"])
    results = commit(client, "g", [("t", 0, 9), ("t", 1, 9)], "member-not-there", a["generation_id"])
    assert entry_codes(results) == ["UNKNOWN_MEMBER_ID"] * 2
    results = commit(client, "no-such-group", [("t", 0, 9)], "member-not-there", 1)
    assert entry_codes(results) == ["UNKNOWN_MEMBER_ID"]
    client.post("/v1/groups/g/leave", json={"member_id": a["member_id"]}).raise_for_status()
    results = commit(client, "g", [("t", 0, 9)], a["member_id"], a["generation_id"])
    assert entry_codes(results) == ["UNKNOWN_MEMBER_ID"]
    assert committed(client, "g", [("t", 0), ("t", 1)]) == {("t", 0): -1, ("t", 1): -1}
    assert committed(client, "no-such-group", [("t", 0)]) == {("t", 0): -1}


# ---- transactional offsets


@pytest.fixture
def producer(client) -> TxnProducer:
    p = TxnProducer(client, "eos-app")
    p.init()
    return p


def test_txn_offsets_invisible_until_commit_and_unstable_meanwhile(client, producer):
    commit(client, "g", [("t", 0, 2, "plain")])
    assert producer.send("u", 0, "out-1").status_code == 200
    response = txn_offset_commit(client, producer, "g", [("t", 0, 10, "txn-meta"), ("t", 1, 4, None)])
    assert response.status_code == 200, response.text
    assert entry_codes(response.json()["offsets"]) == [None, None]
    # invisible: the previous committed offsets are what OffsetFetch answers
    pending = fetch_offsets(client, "g", [("t", 0), ("t", 1), ("t", 2)])
    assert [(o["offset"], o["metadata"], o["error"]) for o in pending] == [
        (2, "plain", None),
        (-1, None, None),
        (-1, None, None),
    ]
    stable = fetch_offsets(client, "g", [("t", 0), ("t", 1), ("t", 2)], require_stable=True)
    assert entry_codes(stable) == ["UNSTABLE_OFFSET_COMMIT", "UNSTABLE_OFFSET_COMMIT", None]
    assert stable[0]["error"]["retriable"] is True
    assert producer.commit()["state"] == "CompleteCommit"
    after = fetch_offsets(client, "g", [("t", 0), ("t", 1), ("t", 2)], require_stable=True)
    assert [(o["offset"], o["metadata"], o["error"]) for o in after] == [
        (10, "txn-meta", None),
        (4, None, None),
        (-1, None, None),
    ]
    assert sorted((o["topic"], o["partition"], o["offset"]) for o in fetch_offsets(client, "g", None)) == [
        ("t", 0, 10),
        ("t", 1, 4),
    ]


def test_require_advance_binds_plain_commits_not_a_transactional_offset_appended_after(client, producer):
    """What docs/api.md says of require_advance and pending transactional offsets: the check is
    against the committed offset, and a TxnOffsetCommit appended after a plain commit replaces it
    when its transaction commits (Kafka's "appended last wins"), lower or not; one appended before
    the plain commit writes nothing over it."""
    assert entry_codes(commit(client, "g", [("t", 0, 5, "plain")], require_advance=True)) == [None]
    assert producer.send("u", 0, "out-1").status_code == 200
    staged = txn_offset_commit(client, producer, "g", [("t", 0, 3, "txn"), ("t", 1, 9, "txn")])
    assert entry_codes(staged.json()["offsets"]) == [None, None]
    # Pending, the transactional 9 is not committed: a plain 4 of t-1 is past nothing, and written.
    assert entry_codes(commit(client, "g", [("t", 1, 4, "plain")], require_advance=True)) == [None]
    assert producer.commit()["state"] == "CompleteCommit"
    assert committed_with_metadata(client, "g", [("t", 0), ("t", 1)]) == [(3, "txn"), (4, "plain")]
    assert entry_codes(commit(client, "g", [("t", 0, 4, "again")], require_advance=True)) == [None]


def test_abort_discards_txn_offsets_and_the_previous_commit_stays(client, producer):
    commit(client, "g", [("t", 0, 3, "before")])
    response = txn_offset_commit(client, producer, "g", [("t", 0, 99, "doomed"), ("t", 2, 99)])
    assert entry_codes(response.json()["offsets"]) == [None, None]
    producer.abort()
    after = fetch_offsets(client, "g", [("t", 0), ("t", 2)], require_stable=True)
    assert [(o["offset"], o["metadata"], o["error"]) for o in after] == [(3, "before", None), (-1, None, None)]
    # the next transaction's offsets do become visible
    txn_offset_commit(client, producer, "g", [("t", 0, 20)])
    producer.commit()
    assert committed(client, "g", [("t", 0)]) == {("t", 0): 20}


def test_last_txn_offset_commit_of_a_transaction_wins(client, producer):
    txn_offset_commit(client, producer, "g", [("t", 0, 5, "first")])
    txn_offset_commit(client, producer, "g", [("t", 0, 8, "second")])
    producer.commit()
    assert [(o["offset"], o["metadata"]) for o in fetch_offsets(client, "g", [("t", 0)])] == [(8, "second")]


def test_txn_offset_commit_adds_the_group_implicitly(client, producer):
    response = txn_offset_commit(client, producer, "implicit-group", [("t", 1, 7)])
    assert response.status_code == 200 and entry_codes(response.json()["offsets"]) == [None]
    txn = client.get("/v1/transactions/eos-app").json()
    assert txn["state"] == "Ongoing"
    assert txn["groups"] == ["implicit-group"]
    assert [p["topic"] for p in txn["partitions"]] == [OFFSETS_TOPIC]
    producer.commit()
    assert committed(client, "implicit-group", [("t", 1)]) == {("t", 1): 7}
    # the COMMIT marker landed in the group's __consumer_offsets partition
    partition = txn["partitions"][0]["partition"]
    markers = client.get(f"/v1/topics/{OFFSETS_TOPIC}/partitions/{partition}/markers").json()["markers"]
    assert [m["type"] for m in markers] == ["COMMIT"]


def test_add_offsets_then_txn_offset_commit(client, producer):
    added = client.post("/v1/txn/add-offsets", json={**producer.ids(), "group_id": "explicit"})
    assert added.status_code == 200 and added.json() == {}
    txn = client.get("/v1/transactions/eos-app").json()
    assert txn["state"] == "Ongoing" and txn["groups"] == ["explicit"]
    assert [p["topic"] for p in txn["partitions"]] == [OFFSETS_TOPIC]
    txn_offset_commit(client, producer, "explicit", [("u", 0, 1, "x")])
    again = client.get("/v1/transactions/eos-app").json()
    assert again["partitions"] == txn["partitions"] and again["groups"] == ["explicit"], "added once"
    producer.commit()
    assert [(o["offset"], o["metadata"]) for o in fetch_offsets(client, "explicit", [("u", 0)])] == [(1, "x")]


def test_data_and_offsets_commit_atomically(client, producer):
    producer.send("u", 1, "a", "b")
    txn_offset_commit(client, producer, "g", [("t", 0, 2)])

    def values() -> list[str]:
        return [
            r["value"]
            for r in client.post(
                "/v1/fetch", json={"partitions": [{"topic": "u", "partition": 1, "offset": 0}]}
            ).json()["partitions"][0]["records"]
        ]

    assert values() == [] and committed(client, "g", [("t", 0)]) == {("t", 0): -1}
    producer.commit()
    assert values() == ["a", "b"] and committed(client, "g", [("t", 0)]) == {("t", 0): 2}


def test_txn_offset_commit_of_unknown_topic_or_partition_fails_only_that_entry(client, producer):
    response = txn_offset_commit(client, producer, "g", [("t", 0, 1), ("nope", 0, 1), ("u", 2, 1)])
    assert entry_codes(response.json()["offsets"]) == [None, "UNKNOWN_TOPIC_OR_PARTITION", "UNKNOWN_TOPIC_OR_PARTITION"]
    producer.commit()
    assert committed(client, "g", [("t", 0), ("nope", 0), ("u", 2)]) == {("t", 0): 1, ("nope", 0): -1, ("u", 2): -1}


def test_fenced_producer_txn_offset_commit_is_producer_fenced(client, producer):
    txn_offset_commit(client, producer, "g", [("t", 0, 5)])
    zombie_ids = producer.ids()
    newer = TxnProducer(client, "eos-app")
    newer.init()  # fences the first instance and aborts its transaction
    zombie = TxnProducer(client, "eos-app")
    zombie.producer_id, zombie.producer_epoch = zombie_ids["producer_id"], zombie_ids["producer_epoch"]
    response = txn_offset_commit(client, zombie, "g", [("t", 0, 6)])
    assert response.status_code == 409, response.text
    assert error_of(response)["code"] == "PRODUCER_FENCED"
    assert committed(client, "g", [("t", 0)]) == {("t", 0): -1}, "the aborted transaction's offset is discarded"
    assert entry_codes(fetch_offsets(client, "g", [("t", 0)], require_stable=True)) == [None]
    # and an epoch older than the one returned by EndTxn is fenced too (every EndTxn bumps it)
    txn_offset_commit(client, newer, "g", [("t", 0, 7)])
    before_end = newer.ids()
    newer.commit()
    stale = client.post(
        "/v1/txn/offset-commit",
        json={**before_end, "group_id": "g", "offsets": [{"topic": "t", "partition": 0, "offset": 8}]},
    )
    assert stale.status_code == 409 and error_of(stale)["code"] == "PRODUCER_FENCED"
    assert committed(client, "g", [("t", 0)]) == {("t", 0): 7}


def test_txn_offset_commit_of_an_unknown_transactional_id(client):
    response = client.post(
        "/v1/txn/offset-commit",
        json={
            "transactional_id": "never-initialized",
            "producer_id": 1,
            "producer_epoch": 0,
            "group_id": "g",
            "offsets": [{"topic": "t", "partition": 0, "offset": 1}],
        },
    )
    assert response.status_code == 409 and error_of(response)["code"] == "INVALID_PRODUCER_ID_MAPPING"


def test_init_producer_id_aborts_the_pending_txn_offsets(client, producer):
    commit(client, "g", [("t", 0, 1)])
    txn_offset_commit(client, producer, "g", [("t", 0, 50)])
    assert entry_codes(fetch_offsets(client, "g", [("t", 0)], require_stable=True)) == ["UNSTABLE_OFFSET_COMMIT"]
    TxnProducer(client, "eos-app").init()
    assert [(o["offset"], o["error"]) for o in fetch_offsets(client, "g", [("t", 0)], require_stable=True)] == [
        (1, None)
    ]


def test_a_timed_out_transaction_discards_its_txn_offsets(make_server):
    server = make_server(abort_timed_out_transaction_interval_ms=50)
    client = server.client
    client.post("/v1/topics", json={"name": "t", "partitions": 1}).raise_for_status()
    commit(client, "g", [("t", 0, 1)])
    producer = TxnProducer(client, "slow-app", timeout_ms=1_000)
    producer.init()
    assert entry_codes(txn_offset_commit(client, producer, "g", [("t", 0, 40)]).json()["offsets"]) == [None]
    deadline = time.monotonic() + 10
    while entry_codes(fetch_offsets(client, "g", [("t", 0)], require_stable=True)) != [None]:
        assert time.monotonic() < deadline, "the timed-out transaction's offset stayed pending"
        time.sleep(0.05)
    assert client.get("/v1/transactions/slow-app").json()["state"] == "CompleteAbort"
    assert committed(client, "g", [("t", 0)]) == {("t", 0): 1}
    late = txn_offset_commit(client, producer, "g", [("t", 0, 41)])
    assert late.status_code == 409 and error_of(late)["code"] == "PRODUCER_FENCED"


def test_two_transactional_producers_commit_offsets_of_different_partitions(client):
    first, second = TxnProducer(client, "app-1"), TxnProducer(client, "app-2")
    first.init()
    second.init()
    txn_offset_commit(client, first, "g", [("t", 0, 11)])
    txn_offset_commit(client, second, "g", [("t", 1, 22)])
    second.commit()
    assert committed(client, "g", [("t", 0), ("t", 1)]) == {("t", 0): -1, ("t", 1): 22}
    assert entry_codes(fetch_offsets(client, "g", [("t", 0), ("t", 1)], require_stable=True)) == [
        "UNSTABLE_OFFSET_COMMIT",
        None,
    ]
    first.abort()
    assert committed(client, "g", [("t", 0), ("t", 1)]) == {("t", 0): -1, ("t", 1): 22}


# ---- KIP-447 zombie fencing


def test_zombie_member_txn_offset_commit_is_fenced_after_a_rebalance(client):
    a = heartbeat(client, "g", topics=["t"])
    generation = a["generation_id"]
    producer_a = TxnProducer(client, "app-a")
    producer_a.init()
    # A commits a transaction with generation G: accepted and visible
    producer_a.send("u", 0, "a-1")
    ok = txn_offset_commit(client, producer_a, "g", [("t", 0, 5), ("t", 1, 5)], a["member_id"], generation)
    assert entry_codes(ok.json()["offsets"]) == [None, None]
    producer_a.commit()
    assert committed(client, "g", [("t", 0), ("t", 1)]) == {("t", 0): 5, ("t", 1): 5}

    # B joins: generation G+1, and A has not heartbeated since
    b = heartbeat(client, "g", topics=["t"])
    assert b["generation_id"] == generation + 1

    # A, a zombie now, goes on with generation G
    producer_a.send("u", 0, "a-2")
    fenced = txn_offset_commit(
        client, producer_a, "g", [("t", 0, 9), ("t", 1, 9), ("t", 2, 9)], a["member_id"], generation
    )
    assert fenced.status_code == 200, fenced.text
    assert entry_codes(fenced.json()["offsets"]) == ["ILLEGAL_GENERATION"] * 3
    assert entry_codes(fetch_offsets(client, "g", [("t", 0), ("t", 1), ("t", 2)], require_stable=True)) == [
        None,
        None,
        None,
    ], "nothing of the refused commit is pending"
    producer_a.commit()  # even so A commits its transaction: its refused offsets must never appear
    assert committed(client, "g", [("t", 0), ("t", 1), ("t", 2)]) == {("t", 0): 5, ("t", 1): 5, ("t", 2): -1}

    # B, with the current generation, commits transactionally
    producer_b = TxnProducer(client, "app-b")
    producer_b.init()
    ok_b = txn_offset_commit(client, producer_b, "g", [("t", 2, 3)], b["member_id"], b["generation_id"])
    assert entry_codes(ok_b.json()["offsets"]) == [None]
    producer_b.commit()
    # and A after a heartbeat (adopting G+1) commits again
    a_now = heartbeat(client, "g", a["member_id"], topics=["t"])
    assert a_now["generation_id"] == generation + 1
    txn_offset_commit(client, producer_a, "g", [("t", 0, 6)], a["member_id"], a_now["generation_id"])
    producer_a.commit()
    assert committed(client, "g", [("t", 0), ("t", 1), ("t", 2)]) == {("t", 0): 6, ("t", 1): 5, ("t", 2): 3}


def test_evicted_or_unknown_member_txn_offset_commit_is_unknown_member_id(client):
    a = heartbeat(client, "g", topics=["t"])
    producer = TxnProducer(client, "app-a")
    producer.init()
    unknown = txn_offset_commit(client, producer, "g", [("t", 0, 4)], "member-made-up", a["generation_id"])
    assert entry_codes(unknown.json()["offsets"]) == ["UNKNOWN_MEMBER_ID"]
    client.post("/v1/groups/g/leave", json={"member_id": a["member_id"]}).raise_for_status()
    left = txn_offset_commit(client, producer, "g", [("t", 0, 4), ("t", 1, 4)], a["member_id"], a["generation_id"])
    assert entry_codes(left.json()["offsets"]) == ["UNKNOWN_MEMBER_ID"] * 2
    # Refused commits begin no transaction (issue 11): there is nothing to commit.
    assert client.get("/v1/transactions/app-a").json()["state"] == "Empty"
    assert committed(client, "g", [("t", 0), ("t", 1)]) == {("t", 0): -1, ("t", 1): -1}


# ---- describe and list


def _transactional_records(client: httpx.Client, topic: str, batches: list[int]) -> int:
    """Writes len(batches) committed transactions of the given sizes to partition 0; returns the
    high watermark (records + one COMMIT marker per transaction)."""
    producer = TxnProducer(client, f"writer-{topic}")
    producer.init()
    n = 0
    for size in batches:
        assert producer.send(topic, 0, *[f"v{n + i}" for i in range(size)]).status_code == 200
        n += size
        producer.commit()
    return client.get(f"/v1/topics/{topic}").json()["partitions"][0]["high_watermark"]


def test_describe_shows_members_generation_assignment_offsets_and_lag(client):
    a = heartbeat(client, "g", topics=["t"], session_timeout_ms=12_000)
    b = heartbeat(client, "g", topics=["t", "u"], session_timeout_ms=15_000)
    client.post("/v1/topics/t/records", json={"partition": 0, "records": [{"value": str(i)} for i in range(6)]})
    commit(client, "g", [("t", 0, 2, "meta-t0")], b["member_id"], b["generation_id"])
    described = describe(client, "g")
    assert described["group_id"] == "g"
    assert described["generation_id"] == b["generation_id"]
    members = {m["member_id"]: m for m in described["members"]}
    assert set(members) == {a["member_id"], b["member_id"]}
    split = range_split(list(members), 3)
    assert assigned(members[a["member_id"]]) == {"t": split[a["member_id"]]}
    assert assigned(members[b["member_id"]]) == {"t": split[b["member_id"]], "u": [0, 1]}
    assert sorted(members[b["member_id"]]["topics"]) == ["t", "u"]
    assert members[a["member_id"]]["session_timeout_ms"] == 12_000
    offsets = [
        (o["topic"], o["partition"], o["offset"], o["metadata"], o["high_watermark"], o["lag"])
        for o in described["offsets"]
    ]
    assert offsets == [("t", 0, 2, "meta-t0", 6, 4)]


def test_lag_counts_records_not_markers(client):
    client.post("/v1/topics", json={"name": "lagt", "partitions": 1}).raise_for_status()
    # 10 records in 3 transactions: records 0-3, COMMIT 4, records 5-7, COMMIT 8, records 9-11, COMMIT 12
    high_watermark = _transactional_records(client, "lagt", [4, 3, 3])
    assert high_watermark == 13

    def lag_at(offset: int) -> int:
        assert entry_codes(commit(client, "lag-group", [("lagt", 0, offset)])) == [None]
        (entry,) = [o for o in describe(client, "lag-group")["offsets"] if o["topic"] == "lagt"]
        assert entry["offset"] == offset and entry["high_watermark"] == 13
        return entry["lag"]

    assert lag_at(13) == 0, "a consumer just past the last COMMIT marker has consumed everything"
    assert lag_at(12) == 0, "only the marker is left"
    assert lag_at(9) == 3
    assert lag_at(8) == 3
    assert lag_at(5) == 6
    assert lag_at(4) == 6
    assert lag_at(0) == 10
    # where a read_committed consumer really ends up: next_offset after consuming everything
    entry = client.post(
        "/v1/fetch", json={"partitions": [{"topic": "lagt", "partition": 0, "offset": 0}], "max_records": 1000}
    ).json()["partitions"][0]
    assert len(entry["records"]) == 10
    assert lag_at(entry["next_offset"]) == 0
    # Records deleted past a committed offset are no longer there to read: lag counts from the log start.
    deleted = client.post("/v1/topics/lagt/delete-records", json={"partitions": [{"partition": 0, "offset": 9}]})
    assert deleted.status_code == 200, deleted.text
    assert lag_at(0) == 3
    assert lag_at(5) == 3
    assert lag_at(10) == 2


def test_lag_of_a_transactionally_committed_offset_is_zero_at_the_end(client):
    client.post("/v1/topics", json={"name": "lagt", "partitions": 1}).raise_for_status()
    high_watermark = _transactional_records(client, "lagt", [2, 5, 1, 4])
    member = heartbeat(client, "eos-group", topics=["lagt"])
    producer = TxnProducer(client, "consumer-app")
    producer.init()
    response = txn_offset_commit(
        client, producer, "eos-group", [("lagt", 0, high_watermark)], member["member_id"], member["generation_id"]
    )
    assert entry_codes(response.json()["offsets"]) == [None]
    producer.commit()
    (entry,) = describe(client, "eos-group")["offsets"]
    assert (entry["offset"], entry["lag"]) == (high_watermark, 0)


def _offset_entry(client: httpx.Client, group: str, topic: str, offset: int) -> dict:
    """The describe's entry of partition 0 of `topic` once `group` committed `offset` there."""
    assert entry_codes(commit(client, group, [(topic, 0, offset)])) == [None]
    (entry,) = [o for o in describe(client, group)["offsets"] if o["topic"] == topic]
    return entry


def test_lag_past_many_markers_is_a_bounded_count(server, client):
    """Regression: a describe counted every marker between the committed offset and the high
    watermark: a group 500,000 transactions behind cost each describe 500,000 index entries per
    partition. The count stops after MARKERS_COUNTED; past them the lag is the upper bound high
    watermark - offset - MARKERS_READ, `lag_exact` false."""
    client.post("/v1/topics", json={"name": "many-transactions", "partitions": 1}).raise_for_status()
    asyncio.run(write_many_transactions(server.database_url, "many-transactions"))

    def lag_at(offset: int) -> tuple[int, bool]:
        entry = _offset_entry(client, "many-behind", "many-transactions", offset)
        assert entry["high_watermark"] == HIGH_WATERMARK
        return entry["lag"], entry.get("lag_exact")

    # A marker at every odd offset: from an even offset, as many records as markers ahead.
    assert lag_at(0) == (HIGH_WATERMARK - MARKERS_READ, False), "far behind: an upper bound"
    assert lag_at(HIGH_WATERMARK - 2 * (MARKERS_COUNTED + 1)) == (MARKERS_COUNTED + 1, False)
    assert lag_at(HIGH_WATERMARK - 2 * MARKERS_COUNTED) == (MARKERS_COUNTED, True), "every marker ahead counted"
    assert lag_at(HIGH_WATERMARK - 2 * (MARKERS_COUNTED // 2)) == (MARKERS_COUNTED // 2, True)
    assert lag_at(HIGH_WATERMARK - 1) == (0, True), "only a marker ahead"
    assert lag_at(HIGH_WATERMARK) == (0, True)


def test_a_describe_reads_at_most_markers_read_markers_per_committed_offset(server, client):
    """The describe's lag reads at most MARKERS_READ markers per committed offset however many lie
    ahead (counted by PostgreSQL's EXPLAIN ANALYZE: rows, not time), once: not again for
    `lag_exact`."""
    client.post("/v1/topics", json={"name": "many-transactions", "partitions": 1}).raise_for_status()
    asyncio.run(write_many_transactions(server.database_url, "many-transactions"))
    assert entry_codes(commit(client, "far-behind", [("many-transactions", 0, 0)])) == [None]

    async def markers_read_by_lags() -> int:
        """The markers the statements of group_offsets.lags read, each run again under EXPLAIN ANALYZE."""
        conn = await asyncpg.connect(server.database_url)
        try:
            statements = []

            class Recording:  # the connection lags is given: records each statement, then runs it
                async def fetch(self, sql: str, *args):
                    statements.append((sql, args))
                    return await conn.fetch(sql, *args)

            lags = await group_offsets.lags(Recording(), "far-behind")
            assert [(o.topic, o.committed_offset) for o in lags] == [("many-transactions", 0)]
            read = 0
            for sql, args in statements:
                [plan] = json.loads(await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, *args))
                read += marker_rows_read(plan["Plan"])
            return read
        finally:
            await conn.close()

    read = asyncio.run(markers_read_by_lags())
    assert read == MARKERS_READ, f"{read} markers read for one committed offset"


def test_list_groups_and_describe_of_an_unknown_group(client):
    a = heartbeat(client, "with-members", topics=["t"])
    commit(client, "only-offsets", [("t", 0, 1)])
    listed = {g["group_id"]: g for g in client.get("/v1/groups").json()["groups"]}
    assert {"with-members", "only-offsets"} <= set(listed)
    assert listed["with-members"]["generation_id"] == a["generation_id"]
    assert listed["with-members"]["members"] == 1
    assert listed["only-offsets"]["members"] == 0
    described = describe(client, "only-offsets")
    assert described["members"] == [] and [o["offset"] for o in described["offsets"]] == [1]
    missing = client.get("/v1/groups/no-such-group")
    assert missing.status_code == 404, missing.text
    assert error_of(missing)["code"] == "GROUP_ID_NOT_FOUND"


def test_a_commit_refused_whole_leaves_no_group_behind(client):
    """Regression: an offset commit whose every entry was refused (a member the group does not
    have, a topic that does not exist; plain or transactional) committed the group it had made to
    hold its offsets: a group nobody used, listed and described from then on (generation 0, no
    members, no offsets), never going away. Nothing is written now; a commit that keeps at least
    one entry still makes its group."""
    not_a_member = commit(client, "ghost-member", [("t", 0, 1)], member_id="m", generation_id=3)
    assert entry_codes(not_a_member) == ["UNKNOWN_MEMBER_ID"]
    assert entry_codes(commit(client, "ghost-topic", [("no-such-topic", 0, 1), ("t", 9, 1)])) == [
        "UNKNOWN_TOPIC_OR_PARTITION",
        "UNKNOWN_TOPIC_OR_PARTITION",
    ]
    producer = TxnProducer(client, "ghost-app")
    producer.init()
    refused = txn_offset_commit(client, producer, "ghost-txn", [("no-such-topic", 0, 1)])
    assert refused.status_code == 200 and entry_codes(refused.json()["offsets"]) == ["UNKNOWN_TOPIC_OR_PARTITION"]
    zombie = txn_offset_commit(client, producer, "ghost-zombie", [("t", 0, 1)], member_id="m", generation_id=1)
    assert zombie.status_code == 200 and entry_codes(zombie.json()["offsets"]) == ["UNKNOWN_MEMBER_ID"]
    listed = {g["group_id"] for g in client.get("/v1/groups").json()["groups"]}
    for group in ("ghost-member", "ghost-topic", "ghost-txn", "ghost-zombie"):
        assert group not in listed
        missing = client.get(f"/v1/groups/{group}")
        assert missing.status_code == 404 and error_of(missing)["code"] == "GROUP_ID_NOT_FOUND", group
    # A commit keeping some of its entries makes its group, with them.
    assert entry_codes(commit(client, "half-kept", [("no-such-topic", 0, 1), ("t", 0, 2)])) == [
        "UNKNOWN_TOPIC_OR_PARTITION",
        None,
    ]
    assert [o["offset"] for o in describe(client, "half-kept")["offsets"]] == [2]


@pytest.mark.parametrize("slash", ["/", "%2F"])
def test_a_group_id_with_a_slash_is_served_by_every_group_endpoint(client, slash):
    """Regression: a group id may hold "/" (Kafka's do; the contract's identifiers are any text up
    to 1024 bytes), but the group routes matched one path segment, so every endpoint naming such a
    group in its path answered 404 NOT_FOUND ("no route"), percent-encoded or not (the server
    decodes the path before routing): the SDK's consumer and admin could not use it, though
    TxnOffsetCommit (the id in its body) and the console could."""
    group = "team/orders"
    in_path = group.replace("/", slash)
    member = heartbeat(client, in_path, topics=["t"])
    assert assigned(member) == {"t": [0, 1, 2]}
    assert entry_codes(
        commit(client, in_path, [("t", 0, 4)], member_id=member["member_id"], generation_id=member["generation_id"])
    ) == [None]
    assert committed(client, in_path, [("t", 0)]) == {("t", 0): 4}
    described = describe(client, in_path)
    assert described["group_id"] == group and [m["member_id"] for m in described["members"]] == [member["member_id"]]
    assert group in [g["group_id"] for g in client.get("/v1/groups").json()["groups"]]
    subscribed = client.post(
        f"/v1/groups/{in_path}/offsets/delete", json={"partitions": [{"topic": "t", "partition": 0}]}
    )
    assert subscribed.status_code == 200 and entry_codes(subscribed.json()["offsets"]) == ["GROUP_SUBSCRIBED_TO_TOPIC"]
    busy = client.delete(f"/v1/groups/{in_path}")
    assert busy.status_code == 409 and error_of(busy)["code"] == "NON_EMPTY_GROUP"
    left = client.post(f"/v1/groups/{in_path}/leave", json={"member_id": member["member_id"]})
    assert left.status_code == 200, left.text
    assert client.delete(f"/v1/groups/{in_path}").status_code == 204
    gone = client.get(f"/v1/groups/{in_path}")
    assert gone.status_code == 404 and error_of(gone)["code"] == "GROUP_ID_NOT_FOUND"
    # The group list's trailing-slash form still redirects to the list; no group is named "".
    assert client.get("/v1/groups/").status_code == 307


def test_a_group_that_only_commits_transactionally_is_listed_and_described(client):
    """The offsets of a group used only through TxnOffsetCommit (a consume-transform-produce app
    that tracks its own partitions) exist: the group is listed and described with them, as a
    group that only uses OffsetCommit is (and as in Kafka, where both live in the group's
    metadata)."""
    producer = TxnProducer(client, "app")
    producer.init()
    txn_offset_commit(client, producer, "txn-only-group", [("t", 0, 3)])
    producer.commit()
    assert committed(client, "txn-only-group", [("t", 0)]) == {("t", 0): 3}
    listed = [g["group_id"] for g in client.get("/v1/groups").json()["groups"]]
    assert "txn-only-group" in listed
    described = client.get("/v1/groups/txn-only-group")
    assert described.status_code == 200, described.text
    assert [(o["topic"], o["partition"], o["offset"]) for o in described.json()["offsets"]] == [("t", 0, 3)]


def test_describe_shows_a_pending_transactional_offset(client, producer):
    commit(client, "g", [("t", 0, 1)])
    txn_offset_commit(client, producer, "g", [("t", 0, 2)])
    (entry,) = describe(client, "g")["offsets"]
    assert entry["offset"] == 1 and entry["pending_transactional_offset"] is True
    producer.commit()
    (entry,) = describe(client, "g")["offsets"]
    assert entry["offset"] == 2 and entry["pending_transactional_offset"] is False


def test_describe_shows_the_committed_leader_epoch(client):
    response = client.post(
        "/v1/groups/epochs/offsets/commit",
        json={"offsets": [{"topic": "t", "partition": 0, "offset": 4, "leader_epoch": 7}]},
    )
    assert response.status_code == 200, response.text
    commit(client, "epochs", [("t", 1, 2)])
    offsets = describe(client, "epochs")["offsets"]
    assert [(o["partition"], o["offset"], o["leader_epoch"]) for o in offsets] == [(0, 4, 7), (1, 2, -1)]


# ---- concurrency


def test_concurrent_commits_with_and_without_a_generation_on_one_group(server, client):
    """A member commits with its generation (locks the group row, then the __consumer_offsets
    partition) while a tool commits with generation -1 on the same group. Neither may fail: no
    500 from a PostgreSQL deadlock between the two lock orders."""
    member = heartbeat(client, "g", topics=["t"])
    failures: list[str] = []
    rounds = 40

    def committer(generation: int, member_id: str, partition: int) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as own:
            for i in range(rounds):
                response = own.post(
                    "/v1/groups/g/offsets/commit",
                    json={
                        "member_id": member_id,
                        "generation_id": generation,
                        "offsets": [{"topic": "t", "partition": partition, "offset": i}],
                    },
                )
                if response.status_code != 200 or response.json()["offsets"][0]["error"] is not None:
                    failures.append(f"{response.status_code} {response.text[:300]}")
                    return  # one is enough (each deadlock costs PostgreSQL's deadlock_timeout)

    threads = [
        threading.Thread(target=committer, args=(member["generation_id"], member["member_id"], 0)),
        threading.Thread(target=committer, args=(member["generation_id"], member["member_id"], 1)),
        threading.Thread(target=committer, args=(-1, "", 2)),
        threading.Thread(target=committer, args=(-1, "", 2)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, f"{len(failures)} failed commits, first: {failures[0]}"
    assert committed(client, "g", [("t", 0), ("t", 1), ("t", 2)]) == {
        ("t", 0): rounds - 1,
        ("t", 1): rounds - 1,
        ("t", 2): rounds - 1,
    }


def test_concurrent_joins_get_distinct_ids_and_one_consistent_assignment(server, client):
    ids: list[str] = []
    errors: list[str] = []

    def join() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as own:
            response = own.post("/v1/groups/g/heartbeat", json={"member_id": "", "topics": ["t", "u"]})
            if response.status_code != 200:
                errors.append(response.text)
            else:
                ids.append(response.json()["member_id"])

    threads = [threading.Thread(target=join) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors and len(set(ids)) == 8
    answers = settled(client, "g", ids, topics=["t", "u"])
    assert len({a["generation_id"] for a in answers}) == 1
    owned = sorted((topic, p) for a in answers for topic, parts in assigned(a).items() for p in parts)
    assert owned == [("t", 0), ("t", 1), ("t", 2), ("u", 0), ("u", 1)]
    assert describe(client, "g")["generation_id"] == answers[0]["generation_id"]


def test_describe_is_a_consistent_snapshot_while_members_come_and_go(server, client):
    """Every DescribeGroups answer describes one generation: its members' assignments cover each
    partition exactly once. (A describe that reads the group row and the members in two separate
    snapshots can pair the old generation's assignment with the new member list; this catches it
    most runs, not every run, since it needs a membership change to commit between the two reads.)"""
    steady = heartbeat(client, "g", topics=["t"])
    stop = threading.Event()
    churn_errors: list[str] = []

    def churn() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as own:
            while not stop.is_set():
                joined = own.post("/v1/groups/g/heartbeat", json={"member_id": "", "topics": ["t"]})
                if joined.status_code != 200:
                    churn_errors.append(joined.text)
                    return
                left = own.post("/v1/groups/g/leave", json={"member_id": joined.json()["member_id"]})
                if left.status_code != 200:
                    churn_errors.append(left.text)
                    return

    threads = [threading.Thread(target=churn) for _ in range(6)]
    for thread in threads:
        thread.start()
    inconsistent, describes = [], 0
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(inconsistent) < 3:
            described = describe(client, "g")
            describes += 1
            owned = sorted(p for m in described["members"] for p in assigned(m).get("t", []))
            if owned != [0, 1, 2]:
                inconsistent.append(
                    (described["generation_id"], {m["member_id"][-6:]: assigned(m) for m in described["members"]})
                )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert not churn_errors, churn_errors[0]
    assert not inconsistent, (
        f"{len(inconsistent)} of {describes} describes paired members with another "
        f"generation's assignment: {inconsistent}"
    )
    assert steady["member_id"] in {m["member_id"] for m in describe(client, "g")["members"]}


def test_a_subscribed_topic_created_later_is_assigned_at_the_next_heartbeat(server):
    client = server.client
    joined = client.post("/v1/groups/late-topic/heartbeat", json={"member_id": "", "topics": ["later"]}).json()
    assert joined["assignment"] == []
    client.post("/v1/topics", json={"name": "later", "partitions": 2}).raise_for_status()
    again = client.post(
        "/v1/groups/late-topic/heartbeat", json={"member_id": joined["member_id"], "topics": ["later"]}
    ).json()
    assert again["generation_id"] == joined["generation_id"] + 1
    assert assigned(again) == {"later": [0, 1]}
    assert again["assignment"][0]["topic_id"] == client.get("/v1/topics/later").json()["topic_id"]
    steady = client.post(
        "/v1/groups/late-topic/heartbeat", json={"member_id": joined["member_id"], "topics": ["later"]}
    ).json()
    assert steady["generation_id"] == again["generation_id"], "no rebalance when nothing changed"


def test_a_subscribed_topic_re_created_between_two_heartbeats_is_a_new_generation_and_topic_id(server):
    """Deleted and created again under its name, with as many partitions, between two heartbeats of
    the group's members: the assignment's partitions are the same, but they are another topic's,
    whose records start again at offset 0 and whose committed offsets the deletion removed. A
    member going on from its positions in the deleted topic would skip the new topic's first
    records: the heartbeat answers a new generation, and the new topic id with the partitions; and
    until then the generation the member has fences its commits of the new topic."""
    client = server.client
    client.post("/v1/topics", json={"name": "again", "partitions": 2}).raise_for_status()
    joined = heartbeat(client, "re-created", topics=["again"])
    old_id = client.get("/v1/topics/again").json()["topic_id"]
    assert [(a["topic"], a["topic_id"], a["partitions"]) for a in joined["assignment"]] == [("again", old_id, [0, 1])]
    assert client.delete("/v1/topics/again").status_code == 204
    client.post("/v1/topics", json={"name": "again", "partitions": 2}).raise_for_status()
    new_id = client.get("/v1/topics/again").json()["topic_id"]
    assert new_id != old_id
    # Before the member's heartbeat, its generation is still the current one, but what it read
    # was the deleted topic's: its commits (plain, transactional) for the new topic are fenced.
    stale = commit(client, "re-created", [("again", 0, 7)], joined["member_id"], joined["generation_id"])
    assert entry_codes(stale) == ["ILLEGAL_GENERATION"] and "created again" in stale[0]["error"]["message"]
    producer = TxnProducer(client, "re-created-tx")
    producer.init()
    stale_in_txn = txn_offset_commit(
        client, producer, "re-created", [("again", 1, 7)], joined["member_id"], joined["generation_id"]
    )
    assert entry_codes(stale_in_txn.json()["offsets"]) == ["ILLEGAL_GENERATION"]
    again = heartbeat(client, "re-created", joined["member_id"], topics=["again"])
    assert again["generation_id"] == joined["generation_id"] + 1, "another topic: a rebalance"
    assert [(a["topic"], a["topic_id"], a["partitions"]) for a in again["assignment"]] == [("again", new_id, [0, 1])]
    steady = heartbeat(client, "re-created", joined["member_id"], topics=["again"])
    assert steady["generation_id"] == again["generation_id"], "no rebalance when nothing changed"
    current = commit(client, "re-created", [("again", 0, 0)], joined["member_id"], again["generation_id"])
    assert entry_codes(current) == [None]
    assert committed(client, "re-created", [("again", 0), ("again", 1)]) == {("again", 0): 0, ("again", 1): -1}
