"""The admin abort racing its producer: the operator looks at a transaction, and by the time the
abort arrives that transaction may have committed and its producer begun the next one. With Kafka's
clients (EndTxn below v5, transaction version 1) the producer id and epoch carry over from one
transaction to the next, so they alone cannot tell the transaction the operator saw from the next
one: the abort names the transaction's start time too (as described), and aborts nothing when the
transaction open now began at another time, over the HTTP admin endpoint and from the console.

The interleaving is made deterministic by doing its steps in order: the operator's describe, the
producer's commit and next transaction, then the operator's abort."""

from __future__ import annotations

import base64
from urllib.parse import quote

from kio.schema.errors import ErrorCode as KafkaError

from tests.kafka.raw import RawConnection
from tests.kafka.raw_transactions import add_partitions, end_txn, init_producer, produce

TRANSACTION_VERSION_1 = 3  # EndTxn v3: what Kafka's clients send; the epoch carries over


def _described(server, transactional_id: str) -> dict:
    response = server.client.get(f"/v1/transactions/{quote(transactional_id, safe='')}")
    assert response.status_code == 200, response.text
    return response.json()


def _read_committed(server, topic: str) -> list[str]:
    response = server.client.post(
        "/v1/fetch",
        json={
            "isolation_level": "read_committed",
            "encoding": "base64",
            "partitions": [{"topic": topic, "partition": 0, "offset": 0}],
        },
    )
    assert response.status_code == 200, response.text
    return [base64.b64decode(r["value"]).decode() for r in response.json()["partitions"][0]["records"]]


def _the_operator_sees_a_transaction_that_then_commits_and_the_next_begins(server, transactional_id: str):
    """Returns what the operator saw (the first transaction, described), the connection and the
    producer, whose second transaction (same producer id and epoch) is open."""
    topic = "operator-race"
    server.client.post("/v1/topics", json={"name": topic, "partitions": 1}).raise_for_status()
    connection = RawConnection(server.extra["kafka_bootstrap"])
    producer = init_producer(connection, transactional_id)
    assert add_partitions(connection, producer, topic, [0]) == [KafkaError.none]
    assert produce(connection, producer, topic, 0, [b"first"], sequence=0) == KafkaError.none
    seen = _described(server, transactional_id)
    assert seen["state"] == "Ongoing"
    assert end_txn(connection, producer, True, version=TRANSACTION_VERSION_1).error_code == KafkaError.none
    assert add_partitions(connection, producer, topic, [0]) == [KafkaError.none]
    assert produce(connection, producer, topic, 0, [b"second"], sequence=1) == KafkaError.none
    now = _described(server, transactional_id)
    assert (now["state"], now["producer_id"], now["producer_epoch"]) == (
        "Ongoing",
        seen["producer_id"],
        seen["producer_epoch"],
    )
    assert now["start_time_ms"] != seen["start_time_ms"]
    return seen, connection, producer, topic


def _what_the_operator_saw(seen: dict) -> dict:
    """The abort's conditions: the producer and the transaction described."""
    return {key: seen[key] for key in ("producer_id", "producer_epoch", "start_time_ms")}


def _the_producer_was_not_fenced(server, connection, producer, topic: str, transactional_id: str) -> None:
    assert _described(server, transactional_id)["state"] == "Ongoing"
    ended = end_txn(connection, producer, True, version=TRANSACTION_VERSION_1)
    assert ended.error_code == KafkaError.none, f"the operator's abort hit the producer's next transaction: {ended}"
    assert _read_committed(server, topic) == ["first", "second"]


def test_an_admin_abort_of_a_transaction_that_committed_meanwhile_leaves_the_next_one(kafka_server):
    transactional_id = "operator-http"
    seen, connection, producer, topic = _the_operator_sees_a_transaction_that_then_commits_and_the_next_begins(
        kafka_server, transactional_id
    )
    with connection:
        abort = kafka_server.client.post(
            f"/v1/transactions/{transactional_id}/abort",
            params=_what_the_operator_saw(seen),
        )
        assert abort.status_code == 409, abort.text
        assert abort.json()["error"]["code"] == "INVALID_TXN_STATE"
        assert "moved on" in abort.json()["error"]["message"]
        _the_producer_was_not_fenced(kafka_server, connection, producer, topic, transactional_id)


def test_a_console_abort_of_a_transaction_that_committed_meanwhile_leaves_the_next_one(kafka_server):
    transactional_id = "operator-console"
    seen, connection, producer, topic = _the_operator_sees_a_transaction_that_then_commits_and_the_next_begins(
        kafka_server, transactional_id
    )
    with connection:
        # The confirmation page's form, as the operator saw it (its hidden fields name that transaction).
        page = kafka_server.client.get(f"/console/transactions/{transactional_id}", params={"confirm": "abort"})
        assert page.status_code == 200
        assert (
            f'name="start_time_ms" value="{_described(kafka_server, transactional_id)["start_time_ms"]}"' in page.text
        )
        abort = kafka_server.client.post(
            f"/console/transactions/{transactional_id}/abort",
            data=_what_the_operator_saw(seen),
            headers={"Origin": kafka_server.url},
        )
        assert abort.status_code != 303, "the console aborted the producer's next transaction"
        _the_producer_was_not_fenced(kafka_server, connection, producer, topic, transactional_id)


def test_an_admin_abort_of_the_transaction_seen_still_aborts_it(kafka_server):
    """The check lets the abort through when the transaction is the one described."""
    topic = "operator-abort"
    kafka_server.client.post("/v1/topics", json={"name": topic, "partitions": 1}).raise_for_status()
    with RawConnection(kafka_server.extra["kafka_bootstrap"]) as connection:
        producer = init_producer(connection, "operator-same")
        assert add_partitions(connection, producer, topic, [0]) == [KafkaError.none]
        assert produce(connection, producer, topic, 0, [b"stuck"], sequence=0) == KafkaError.none
        seen = _described(kafka_server, "operator-same")
        abort = kafka_server.client.post(
            "/v1/transactions/operator-same/abort",
            params=_what_the_operator_saw(seen),
        )
        assert abort.status_code == 200, abort.text
        assert abort.json()["state"] == "CompleteAbort"
        assert _read_committed(kafka_server, topic) == []
        fenced = end_txn(connection, producer, True, version=TRANSACTION_VERSION_1)
        assert fenced.error_code == KafkaError.producer_fenced
