"""The request pool's idle_in_transaction_session_timeout (`database_idle_in_transaction_timeout_ms`)
ends a transaction whose server process is silent between two statements, so that a hung node
releases its rows. A live node must never be silent that long inside a transaction: the work in
Python that can take seconds (converting a large produce into its topic's stored form, decoding a
huge batch for the console) is done outside the transaction, or in a transaction that is exempt
because it locks nothing. Each test makes such a step slow (the event loop busy, as large data keeps
it) with a timeout shorter than it, on real servers and a real PostgreSQL."""

from __future__ import annotations

import time

from app.console.queries import log_browser
from app.storage.log import batch_form

# Shorter than every slow step below: a transaction silent that long between two statements is ended.
IDLE_IN_TRANSACTION_TIMEOUT_MS = 300
SLOW_STEP_S = 0.8


def _slowed(function):
    def slow(*args, **kwargs):
        time.sleep(SLOW_STEP_S)  # the event loop or the thread busy, as on large data
        return function(*args, **kwargs)

    return slow


def test_a_large_produce_slow_to_convert_into_its_topics_form_is_written(make_server, monkeypatch):
    """A write batch put its record batches into their topics' stored form (recompressed into the
    topic's compression.type, stamped at LogAppendTime) inside its PostgreSQL transaction, after its
    first statement: 100 MiB recompressed at gzip level 9 takes 6.5 s here, at zstd level 22 over
    3 minutes. PostgreSQL ended the transaction, and such a produce was answered 503 at every try,
    never written. It is converted before the transaction now (a write batch of 1 MiB or more)."""
    server = make_server(database_idle_in_transaction_timeout_ms=IDLE_IN_TRANSACTION_TIMEOUT_MS)
    client = server.client
    created = client.post(
        "/v1/topics",
        json={"name": "stamped", "partitions": 2, "config": {"message_timestamp_type": "LogAppendTime"}},
    )
    assert created.status_code == 201, created.text
    value = "v" * 1024
    records = [{"key": str(index), "value": value} for index in range(600)]  # 1.2 MiB over both partitions
    monkeypatch.setattr(batch_form.record_codec, "with_timestamp", _slowed(batch_form.record_codec.with_timestamp))
    started_ms = int(time.time() * 1000)
    response = client.post(
        "/v1/produce",
        json={
            "producer_id": -1,
            "partitions": [{"topic": "stamped", "partition": partition, "records": records} for partition in (0, 1)],
        },
    )
    assert response.status_code == 200, response.text
    assert [entry["error"] for entry in response.json()["partitions"]] == [None, None]
    for partition in (0, 1):
        fetched = client.post(
            "/v1/fetch",
            json={"max_records": 1000, "partitions": [{"topic": "stamped", "partition": partition, "offset": 0}]},
        ).json()["partitions"][0]["records"]
        assert len(fetched) == len(records)
        assert {record["timestamp_ms"] for record in fetched} == {fetched[0]["timestamp_ms"]}
        assert fetched[0]["timestamp_ms"] >= started_ms


def test_the_console_shows_a_partition_whose_window_is_slow_to_decode(make_server, monkeypatch):
    """The console reads a page in one read-only REPEATABLE READ transaction and decodes the batches
    of the partition page's window between its statements: a window inside a batch of a million
    records (100 MiB) decodes for seconds, and PostgreSQL ended the page's transaction (a 503 at every
    try). Its snapshot transactions lock no row, so they are exempt from the timeout."""
    server = make_server(database_idle_in_transaction_timeout_ms=IDLE_IN_TRANSACTION_TIMEOUT_MS)
    client = server.client
    assert client.post("/v1/topics", json={"name": "huge-batches", "partitions": 1}).status_code == 201
    produced = client.post(
        "/v1/produce",
        json={
            "producer_id": -1,
            "partitions": [{"topic": "huge-batches", "partition": 0, "records": [{"key": "k", "value": "shown"}]}],
        },
    )
    assert produced.status_code == 200, produced.text
    monkeypatch.setattr(log_browser.record_codec, "decode_payload", _slowed(log_browser.record_codec.decode_payload))
    page = client.get("/console/topics/huge-batches/partitions/0?offset=0")
    assert page.status_code == 200, page.text
    assert "shown" in page.text
