"""Group offsets do not outlive DeleteTopics (issue 22, review finding 2), over real HTTP.

As in Kafka, deleting a topic removes its partitions' committed offsets and the transactional
offsets still pending for them, so a topic re-created with the same name starts with none: its
consumers begin at their reset position instead of skipping the new topic's first records. The
topic's partition count only grows (CreatePartitions never removes one), so the offsets of partitions
that no longer exist are exactly those of deleted topics; commits name existing partitions only.
"""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.api.test_review_fixes import create_topic, fetch_offset, init_transactional
from tests.api.test_transactions import _wait_for
from tests.concurrency.test_batched_writes import _HeldPartition, _waiting_for_a_lock

LOCK_WAIT_TIMEOUT_S = 30


def commit_offsets(client: httpx.Client, group: str, offsets: list[tuple[str, int, int]]) -> list:
    response = client.post(
        f"/v1/groups/{group}/offsets/commit",
        json={"offsets": [{"topic": t, "partition": p, "offset": o} for t, p, o in offsets]},
    )
    assert response.status_code == 200, response.text
    return [entry["error"] for entry in response.json()["offsets"]]


def txn_offset_commit(client: httpx.Client, producer: dict, group: str, offsets: list[tuple[str, int, int]]) -> list:
    response = client.post(
        "/v1/txn/offset-commit",
        json={
            **producer,
            "group_id": group,
            "offsets": [{"topic": t, "partition": p, "offset": o} for t, p, o in offsets],
        },
    )
    assert response.status_code == 200, response.text
    return [entry["error"] for entry in response.json()["offsets"]]


def end_transaction(client: httpx.Client, producer: dict, commit: bool) -> None:
    response = client.post("/v1/txn/end", json={**producer, "committed": commit})
    assert response.status_code == 200, response.text


def all_offsets(client: httpx.Client, group: str) -> dict[tuple[str, int], int]:
    response = client.post(f"/v1/groups/{group}/offsets/fetch", json={"partitions": None})
    assert response.status_code == 200, response.text
    return {(entry["topic"], entry["partition"]): entry["offset"] for entry in response.json()["offsets"]}


def delete_topic(client: httpx.Client, name: str) -> None:
    response = client.delete(f"/v1/topics/{name}")
    assert response.status_code == 204, response.text


def test_a_recreated_topic_starts_without_the_deleted_ones_offsets(server):
    client = server.client
    create_topic(client, "recycled", partitions=2)
    create_topic(client, "kept")
    assert commit_offsets(client, "readers", [("recycled", 0, 3), ("recycled", 1, 4), ("kept", 0, 5)]) == [None] * 3
    delete_topic(client, "recycled")
    assert all_offsets(client, "readers") == {("kept", 0): 5}
    create_topic(client, "recycled", partitions=2)
    assert fetch_offset(client, "readers", "recycled", 0) == -1
    assert fetch_offset(client, "readers", "recycled", 1) == -1
    assert all_offsets(client, "readers") == {("kept", 0): 5}
    described = client.get("/v1/groups/readers").json()
    assert [(o["topic"], o["partition"]) for o in described["offsets"]] == [("kept", 0)]
    # The new topic's offsets are committed as any others.
    assert commit_offsets(client, "readers", [("recycled", 1, 1)]) == [None]
    assert fetch_offset(client, "readers", "recycled", 1) == 1


def test_a_pending_transactional_offset_of_a_deleted_topic_is_not_written_at_commit(server):
    client = server.client
    create_topic(client, "input")
    create_topic(client, "other-input")
    producer = init_transactional(client, "transformer")
    ids = {key: producer[key] for key in ("transactional_id", "producer_id", "producer_epoch")}
    assert txn_offset_commit(client, ids, "eos", [("input", 0, 7), ("other-input", 0, 8)]) == [None, None]
    delete_topic(client, "input")
    create_topic(client, "input")
    end_transaction(client, ids, commit=True)
    assert fetch_offset(client, "eos", "input") == -1
    assert fetch_offset(client, "eos", "other-input") == 8  # the rest of the transaction's offsets stand


def test_an_offset_commit_to_a_deleted_topic_is_refused(server):
    client = server.client
    create_topic(client, "gone")
    delete_topic(client, "gone")
    [error] = commit_offsets(client, "late", [("gone", 0, 1)])
    assert error["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
    assert all_offsets(client, "late") == {}


@pytest.mark.parametrize("transactional", [False, True], ids=["plain", "transactional"])
def test_a_delete_racing_an_offset_commit_removes_what_it_committed(make_server, transactional):
    """The commit has checked that the topic exists and waits (for the __consumer_offsets partition,
    which the test holds) when the topic is deleted: the delete waits for the commit to end, and then
    removes its offset. Without that wait, the commit would write an offset for a topic already gone."""
    running = make_server(offsets_partitions=1)
    client = running.client
    create_topic(client, "raced")
    producer = init_transactional(client, "race-app") if transactional else None
    ids = producer and {key: producer[key] for key in ("transactional_id", "producer_id", "producer_epoch")}

    def commit() -> list:
        with httpx.Client(base_url=running.url, timeout=60) as own:
            if transactional:
                return txn_offset_commit(own, ids, "racers", [("raced", 0, 3)])
            return commit_offsets(own, "racers", [("raced", 0, 3)])

    held = _HeldPartition(running.database_url, "__consumer_offsets", 0)
    results: dict[str, object] = {}
    committing = threading.Thread(target=lambda: results.update(commit=commit()))
    committing.start()
    try:
        _wait_for(lambda: _waiting_for_a_lock(running.database_url) >= 1, what="the commit to wait for the partition")
        deleting = threading.Thread(target=lambda: results.update(delete=client.delete("/v1/topics/raced")))
        deleting.start()
        _wait_for(
            lambda: "delete" in results or _waiting_for_a_lock(running.database_url) >= 2,
            what="the delete to end or to wait for the commit",
        )
    finally:
        held.let_go()
        committing.join(LOCK_WAIT_TIMEOUT_S)
    deleting.join(LOCK_WAIT_TIMEOUT_S)
    assert results["commit"] == [None] and results["delete"].status_code == 204
    if transactional:
        end_transaction(client, ids, commit=True)
    create_topic(client, "raced")
    assert all_offsets(client, "racers") == {}
