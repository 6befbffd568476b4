"""The transactional path with fewer statements (issue 13): a producer's batches to several
partitions locked, checked and written together; a transaction's markers written together; the
epoch bump of EndTxn written with the transaction's row. Each keeps the answers, offsets, markers
and producer state that one statement per partition gave."""

from __future__ import annotations

import asyncio

import httpx

from app.storage.database import connect
from app.storage.transactions.producer_ids import MAX_EPOCH


def _query(database_url: str, sql: str, *args) -> list[dict]:
    async def run():
        conn = await connect(database_url)
        try:
            return [dict(row) for row in await conn.fetch(sql, *args)]
        finally:
            await conn.close()

    return asyncio.run(run())


def _init(client: httpx.Client, transactional_id: str) -> dict:
    response = client.post(
        "/v1/producers/init", json={"transactional_id": transactional_id, "transaction_timeout_ms": 60_000}
    )
    assert response.status_code == 200, response.text
    return {"transactional_id": transactional_id, **response.json()}


def _produce(client: httpx.Client, ids: dict, entries: list[tuple[str, int, int, list[str]]]) -> list[dict]:
    response = client.post(
        "/v1/produce",
        json={
            **ids,
            "partitions": [
                {
                    "topic": topic,
                    "partition": partition,
                    "base_sequence": sequence,
                    "records": [{"value": value} for value in values],
                }
                for topic, partition, sequence, values in entries
            ],
        },
    )
    assert response.status_code == 200, response.text
    return response.json()["partitions"]


def _end(client: httpx.Client, ids: dict, commit: bool) -> dict:
    response = client.post("/v1/txn/end", json={**ids, "committed": commit})
    assert response.status_code == 200, response.text
    return {
        "transactional_id": ids["transactional_id"],
        "producer_id": response.json()["producer_id"],
        "producer_epoch": response.json()["producer_epoch"],
    }


def _read(client: httpx.Client, topic: str, partition: int, isolation: str = "read_committed") -> dict:
    response = client.post(
        "/v1/fetch",
        json={"isolation_level": isolation, "partitions": [{"topic": topic, "partition": partition, "offset": 0}]},
    )
    assert response.status_code == 200, response.text
    return response.json()["partitions"][0]


def test_one_produce_to_many_partitions_then_commit_leaves_one_marker_each(server):
    client = server.client
    for name, count in (("rt-a", 3), ("rt-b", 2)):
        client.post("/v1/topics", json={"name": name, "partitions": count}).raise_for_status()
    client.post("/v1/topics/rt-a/records", json={"partition": 2, "records": [{"value": "plain"}]}).raise_for_status()
    ids = _init(client, "round-trips")
    # Listed out of lock order on purpose: the answers still come back in request order.
    entries = [("rt-b", 1, 0, ["b1"]), ("rt-a", 2, 0, ["a2", "a2'"]), ("rt-a", 0, 0, ["a0"]), ("rt-b", 0, 0, ["b0"])]
    answers = _produce(client, ids, entries)
    assert [(a["topic"], a["partition"], a["base_offset"], a["last_offset"], a["error"]) for a in answers] == [
        ("rt-b", 1, 0, 0, None),
        ("rt-a", 2, 1, 2, None),
        ("rt-a", 0, 0, 0, None),
        ("rt-b", 0, 0, 0, None),
    ]
    assert _read(client, "rt-a", 2)["last_stable_offset"] == 1, "the open transaction pins the LSO at its first offset"
    next_ids = _end(client, ids, commit=True)
    assert next_ids["producer_epoch"] == ids["producer_epoch"] + 1
    for topic, partition, _, values in entries:
        read = _read(client, topic, partition)
        before = ["plain"] if (topic, partition) == ("rt-a", 2) else []
        assert [r["value"] for r in read["records"]] == before + values
        assert read["last_stable_offset"] == read["high_watermark"] == len(read["records"]) + 1, "one marker each"
    markers = _query(
        server.database_url,
        "SELECT t.name, m.partition, m.marker_offset, m.first_offset, m.control_type FROM txn_markers m "
        "JOIN topics t USING (topic_id) WHERE m.producer_id = $1 ORDER BY t.name, m.partition",
        ids["producer_id"],
    )
    assert [(m["name"], m["partition"], m["marker_offset"], m["first_offset"], m["control_type"]) for m in markers] == [
        ("rt-a", 0, 1, 0, 1),
        ("rt-a", 2, 3, 1, 1),
        ("rt-b", 0, 1, 0, 1),
        ("rt-b", 1, 1, 0, 1),
    ]
    issued = _query(
        server.database_url, "SELECT producer_epoch FROM producer_ids WHERE producer_id = $1", ids["producer_id"]
    )
    assert issued == [{"producer_epoch": next_ids["producer_epoch"]}], "EndTxn's epoch bump is recorded as issued"
    # The bumped epoch is the producer's: its next transaction writes and commits with it.
    _produce(client, next_ids, [("rt-a", 0, 0, ["again"])])
    _end(client, next_ids, commit=False)
    assert [r["value"] for r in _read(client, "rt-a", 0)["records"]] == ["a0"], "the aborted one stays hidden"


def test_a_produce_to_many_partitions_answers_each_partition_on_its_own(server):
    client = server.client
    client.post("/v1/topics", json={"name": "rt-each", "partitions": 3}).raise_for_status()
    ids = _init(client, "round-trips-each")
    first = _produce(client, ids, [("rt-each", 0, 0, ["x", "y"]), ("rt-each", 1, 0, ["z"])])
    retried = _produce(client, ids, [("rt-each", 0, 0, ["x", "y"]), ("rt-each", 1, 0, ["z"])])
    assert [(a["base_offset"], a["last_offset"], a["duplicate"]) for a in retried] == [
        (a["base_offset"], a["last_offset"], True) for a in first
    ], "a retried request is a duplicate everywhere"
    mixed = _produce(
        client,
        ids,
        [
            ("rt-each", 0, 5, ["gap"]),
            ("rt-each", 1, 1, ["next"]),
            ("rt-each", 2, 0, ["new"]),
            ("rt-each", 7, 0, ["nowhere"]),
        ],
    )
    assert [a["error"] and a["error"]["code"] for a in mixed] == [
        "OUT_OF_ORDER_SEQUENCE_NUMBER",
        None,
        None,
        "UNKNOWN_TOPIC_OR_PARTITION",
    ]
    assert [(a["base_offset"], a["last_offset"]) for a in mixed[1:3]] == [(1, 1), (0, 0)]
    _end(client, ids, commit=True)
    assert [r["value"] for r in _read(client, "rt-each", 0)["records"]] == ["x", "y"]
    assert [r["value"] for r in _read(client, "rt-each", 1)["records"]] == ["z", "next"]
    assert [r["value"] for r in _read(client, "rt-each", 2)["records"]] == ["new"]
    states = _query(
        server.database_url,
        "SELECT partition, last_sequence, current_txn_first_offset FROM producer_states "
        "WHERE producer_id = $1 ORDER BY partition",
        ids["producer_id"],
    )
    assert states == [
        {"partition": 0, "last_sequence": 1, "current_txn_first_offset": None},
        {"partition": 1, "last_sequence": 1, "current_txn_first_offset": None},
        {"partition": 2, "last_sequence": 0, "current_txn_first_offset": None},
    ]


def test_end_txn_at_the_last_epoch_moves_to_a_new_producer_id(server):
    client = server.client
    client.post("/v1/topics", json={"name": "rt-last", "partitions": 1}).raise_for_status()
    ids = _init(client, "round-trips-last")
    _query(
        server.database_url,
        "UPDATE transactions SET producer_epoch = $2 WHERE transactional_id = $1",
        ids["transactional_id"],
        MAX_EPOCH,
    )
    _query(
        server.database_url,
        "UPDATE producer_ids SET producer_epoch = $2 WHERE producer_id = $1",
        ids["producer_id"],
        MAX_EPOCH,
    )
    ids["producer_epoch"] = MAX_EPOCH
    _produce(client, ids, [("rt-last", 0, 0, ["last"])])
    next_ids = _end(client, ids, commit=True)
    assert next_ids["producer_id"] != ids["producer_id"] and next_ids["producer_epoch"] == 0
    issued = _query(
        server.database_url,
        "SELECT producer_id, producer_epoch FROM producer_ids "
        "WHERE producer_id = ANY($1::bigint[]) ORDER BY producer_id",
        [ids["producer_id"], next_ids["producer_id"]],
    )
    assert issued == [
        {"producer_id": ids["producer_id"], "producer_epoch": MAX_EPOCH},
        {"producer_id": next_ids["producer_id"], "producer_epoch": 0},
    ]
    assert [r["value"] for r in _read(client, "rt-last", 0)["records"]] == ["last"]
    _produce(client, next_ids, [("rt-last", 0, 0, ["with the new id"])])
    _end(client, next_ids, commit=True)
    assert [r["value"] for r in _read(client, "rt-last", 0)["records"]] == ["last", "with the new id"]
