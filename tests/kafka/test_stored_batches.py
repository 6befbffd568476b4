"""A Kafka client's batch is stored as the RecordBatch it sent (in its codec, the topic's
compression.type being `producer`; base offset 0, leader epoch -1: storage/log/record_codec.py) and
a Kafka fetch answers it as stored with its base offset patched in; every other reader (HTTP's
fetch, ListOffsets, compaction, the console) reads it as the JSON form of the same bytes. Checked in
the database and over both doors, beside batches written over HTTP (stored as JSON), with every
codec, and through compaction and retention by bytes."""

from __future__ import annotations

import struct

import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.util import calc_crc32c
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka.record_batches import KafkaRecord
from app.record_batch_codecs import CODEC_ZSTD, MAX_RECORDS_BYTES
from tests.api.test_log_lifecycle import clean, sql
from tests.conftest import start_server_on_fresh_database, stop_in_process_server
from tests.kafka import http_side
from tests.kafka.clients import CLIENTS, WAIT_S, ConfluentKafka, Received, create_topic
from tests.kafka.raw import RawConnection, record_batch
from tests.kafka.test_produce_raw import answer_of, fetched_records, produce_request, records
from tests.unit.test_record_codec import compressed_bomb

BINARY = bytes(range(256))  # not UTF-8: read over HTTP in the base64 form
CODECS = [None, "gzip", "snappy", "lz4", "zstd"]
_HEADER = DefaultRecordBatch.HEADER_STRUCT
_BATCH_LENGTH = struct.Struct(">qi")
# librdkafka's config for one batch per produce() call of a few records (flushed at the end).
ONE_BATCH = {"linger.ms": 1000}


@pytest.fixture(scope="module")
def stored_server(postgres):
    # The tests run the cleaner themselves (as test_log_lifecycle does), so that each step is exact.
    running = start_server_on_fresh_database(
        postgres, "kafka_stored_batches", kafka_listener="127.0.0.1:0", log_cleaner_interval_ms=3_600_000
    )
    yield running
    stop_in_process_server(running)


def create(server, name: str, **config) -> None:
    response = server.client.post("/v1/topics", json={"name": name, "partitions": 1, "config": config})
    assert response.status_code == 201, response.text


def stored_rows(server, topic: str) -> list:
    return sql(
        server.database_url,
        "SELECT b.base_offset, b.last_offset, b.size_bytes, b.records FROM record_batches b "
        "JOIN topics t USING (topic_id) WHERE t.name = $1 ORDER BY b.base_offset",
        topic,
    )


CODEC_IDS = {None: 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def assert_stored_as_a_record_batch(row, codec: str | None = None) -> None:
    payload = bytes(row["records"])
    header = _HEADER.unpack_from(payload)
    base_offset, _length, leader_epoch, magic, crc, attributes = header[:6]
    assert (base_offset, leader_epoch, magic) == (0, -1, 2)
    assert attributes & DefaultRecordBatch.CODEC_MASK == CODEC_IDS[codec], "stored in the producer's codec"
    assert crc == calc_crc32c(payload[DefaultRecordBatch.ATTRIBUTES_OFFSET :])
    assert header[6] + 1 == header[12] == row["last_offset"] - row["base_offset"] + 1
    assert row["size_bytes"] == len(payload)


def fetched_batches(server, topic: str) -> list[bytes]:
    """The batches one Fetch v12 from offset 0 returns, as sent."""
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        data = fetched_records(connection, topic, 1 << 24)
    batches = []
    while data:
        end = _BATCH_LENGTH.unpack_from(data)[1] + DefaultRecordBatch.AFTER_LEN_OFFSET
        batches.append(data[:end])
        data = data[end:]
    return batches


def test_kafka_batches_are_stored_as_sent_and_read_back_by_both_doors(stored_server):
    topic = "stored-forms"
    create_topic(stored_server, topic)
    http_side.produce(stored_server, topic, 0, [{"key": "h0", "value": "from http", "timestamp_ms": 10}])
    sent: list[dict] = [{"key": b"h0", "value": b"from http", "headers": [], "timestamp": 10}]
    for index, codec in enumerate(CODECS):
        batch = [
            {
                "key": BINARY,
                "value": b"v" * 50,
                "headers": [("bin", BINARY), ("null", None)],
                "timestamp": 10_000 * (index + 1) + 1,
            },
            {"key": None, "value": "välue €".encode(), "timestamp": 10_000 * (index + 1) + 2},
            {"key": b"null value", "value": None, "headers": [("", b"")], "timestamp": 10_000 * (index + 1) + 3},
            {"key": None, "value": None, "timestamp": 10_000 * (index + 1) + 4},
        ]
        ConfluentKafka().produce(stored_server, topic, batch, compression=codec, **ONE_BATCH)
        sent += batch
        http_side.produce(
            stored_server, topic, 0, [{"key": http_side.b64(BINARY), "value": None, "timestamp_ms": 5}], "base64"
        )
        sent.append({"key": BINARY, "value": None, "headers": [], "timestamp": 5})

    rows = stored_rows(stored_server, topic)
    kafka_rows = [row for row in rows if row["records"][:1] != b"["]
    http_rows = [row for row in rows if row["records"][:1] == b"["]
    assert len(http_rows) == 1 + len(CODECS)
    assert sum(row["last_offset"] - row["base_offset"] + 1 for row in kafka_rows) == 4 * len(CODECS)
    for row, codec in zip(kafka_rows, CODECS, strict=True):
        assert_stored_as_a_record_batch(row, codec)

    # Over Kafka: each batch at its offset, a stored one as stored with its base offset patched in.
    fetched = fetched_batches(stored_server, topic)
    assert [struct.unpack_from(">q", batch)[0] for batch in fetched] == [row["base_offset"] for row in rows]
    for batch, row in zip(fetched, rows, strict=True):
        if row in kafka_rows:
            assert batch == struct.pack(">q", row["base_offset"]) + bytes(row["records"])[8:]
    expected = [
        Received(offset, m["key"], m["value"], m.get("headers", []), m["timestamp"]) for offset, m in enumerate(sent)
    ]
    for client in CLIENTS:
        assert client.consume(stored_server, topic, 0, len(sent)) == expected, client.name

    # Over HTTP, in base64 and in utf8: the same bytes.
    assert [
        (r["offset"], http_side.unb64(r["key"]), http_side.unb64(r["value"]), r["timestamp_ms"])
        for r in http_side.fetch(stored_server, topic, 0)
    ] == [(e.offset, e.key, e.value, e.timestamp_ms) for e in expected]
    assert [
        [(h["key"], http_side.unb64(h["value"])) for h in r["headers"]]
        for r in http_side.fetch(stored_server, topic, 0)
    ] == [e.headers for e in expected]
    response = stored_server.client.post(
        "/v1/fetch",
        json={"max_records": 1000, "encoding": "utf8", "partitions": [{"topic": topic, "partition": 0, "offset": 0}]},
    )
    [entry] = response.json()["partitions"]
    second = entry["records"][2]  # a record of the first Kafka batch, all UTF-8: read as text
    assert (second["value"], second.get("encoding")) == ("välue €", None)
    first = entry["records"][1]  # not UTF-8: marked base64
    assert first["encoding"] == "base64" and http_side.unb64(first["key"]) == BINARY

    # ListOffsets by time, over both doors, lands inside the stored batches.
    consumer = Consumer({"bootstrap.servers": stored_server.extra["kafka_bootstrap"], "group.id": "unused"})
    try:
        [found] = consumer.offsets_for_times([TopicPartition(topic, 0, 20_002)], timeout=WAIT_S)
    finally:
        consumer.close()
    second_batch_at = 1 + 4 + 1  # the HTTP record, the first Kafka batch, the HTTP record after it
    assert found.offset == second_batch_at + 1  # its record of 20002 ms
    listed = stored_server.client.post(
        "/v1/offsets/list", json={"partitions": [{"topic": topic, "partition": 0, "timestamp": 20_002}]}
    ).json()["partitions"][0]
    assert (listed["offset"], listed["timestamp_ms"]) == (second_batch_at + 1, 20_002)

    # The console's log browser reads them too.
    page = stored_server.client.get(f"/console/topics/{topic}/partitions/0")
    assert page.status_code == 200, page.text
    assert "välue €" in page.text and "from http" in page.text


def test_compaction_rewrites_the_batches_it_takes_records_from_and_leaves_the_others_as_sent(stored_server):
    topic = "stored-compacted"
    create(stored_server, topic, cleanup_policy="compact", delete_retention_ms=0)
    producer = ConfluentKafka()
    first = [{"key": b"k1", "value": b"a"}, {"key": b"k2", "value": b"b"}, {"key": b"k1", "value": b"c"}]
    producer.produce(stored_server, topic, first, **ONE_BATCH)  # 0..2
    second = [{"key": b"k3", "value": BINARY}, {"key": b"k2", "value": b"d"}]
    producer.produce(stored_server, topic, second, compression="gzip", **ONE_BATCH)  # 3, 4
    third = [{"key": b"k4", "value": b"whole"}, {"key": b"k5", "value": b"last"}]  # compacted: keys required
    producer.produce(stored_server, topic, third, **ONE_BATCH)  # 5, 6
    before = stored_rows(stored_server, topic)
    assert len(before) == 3 and all(row["records"][:1] != b"[" for row in before)

    clean(stored_server)

    after = stored_rows(stored_server, topic)
    assert [row["base_offset"] for row in after] == [0, 3, 5]
    assert after[0]["records"][:1] == b"[", "rewritten with its hole"
    assert after[1]["records"] == before[1]["records"], "nothing taken: stays as stored"
    assert after[2]["records"] == before[2]["records"]
    assert after[0]["size_bytes"] == len(b"k1") + len(b"c")
    kept = [(2, b"k1", b"c"), (3, b"k3", BINARY), (4, b"k2", b"d"), (5, b"k4", b"whole"), (6, b"k5", b"last")]
    for client in CLIENTS:
        received = client.consume(stored_server, topic, 0, len(kept))
        assert [(r.offset, r.key, r.value) for r in received] == kept, client.name
    assert [
        (r["offset"], http_side.unb64(r["key"]), http_side.unb64(r["value"]))
        for r in http_side.fetch(stored_server, topic, 0)
    ] == kept


def test_retention_by_bytes_counts_the_stored_batches(stored_server):
    topic = "stored-retention"
    batch = record_batch(records(2))
    size = len(batch)
    create(stored_server, topic, retention_bytes=2 * size + 1)
    with RawConnection(stored_server.extra["kafka_bootstrap"]) as connection:
        for _ in range(5):
            connection.call(produce_request(topic, 0, batch))
    assert [row["size_bytes"] for row in stored_rows(stored_server, topic)] == [size] * 5
    clean(stored_server)
    # 5 batches of `size`: without the oldest two, 3 remain (>= the limit); without the third, 2 (<).
    assert [row["base_offset"] for row in stored_rows(stored_server, topic)] == [4, 6, 8]
    partitions = stored_server.client.get(f"/v1/topics/{topic}").json()["partitions"]
    assert partitions[0]["log_start_offset"] == 4


def test_max_message_bytes_bounds_the_largest_record_not_the_stored_batch(stored_server):
    topic = "stored-max-message"
    create(stored_server, topic, max_message_bytes=10)
    fits = record_batch([KafkaRecord(1, b"k", b"v" * 7, [("h", b"")]), KafkaRecord(2, None, b"v" * 10, [])])
    too_large = record_batch([KafkaRecord(1, None, b"v", []), KafkaRecord(2, b"k", b"v" * 8, [("h", b"x")])])
    assert len(fits) > 10
    with RawConnection(stored_server.extra["kafka_bootstrap"]) as connection:
        assert answer_of(connection.call(produce_request(topic, 0, fits))) == (KafkaError.none, 0)
        assert answer_of(connection.call(produce_request(topic, 0, too_large)))[0] == KafkaError.message_too_large
    assert [row["last_offset"] for row in stored_rows(stored_server, topic)] == [1]


def test_a_stored_batch_that_does_not_read_is_its_partitions_error_and_the_rest_is_served(stored_server, caplog):
    """A row no producer could have had stored (its records inflate to four times MAX_RECORDS_BYTES: a
    corrupt or hostile row, written here by the test) is read within that bound, never inflated: an HTTP
    fetch and ListOffsets answer its partition UNKNOWN_SERVER_ERROR naming the batch, and the rest of
    the request as usual; reading past it works; the log cleaner leaves its partition uncompacted and
    compacts the others."""
    server = stored_server
    topic = "stored-unreadable"
    config = {"cleanup_policy": "compact", "delete_retention_ms": 0}
    response = server.client.post("/v1/topics", json={"name": topic, "partitions": 2, "config": config})
    assert response.status_code == 201, response.text
    for partition, values in ((0, ["replaced by the bomb", "after"]), (1, ["first", "second"])):
        for value in values:
            http_side.produce(server, topic, partition, [{"key": "k", "value": value}])
    sql(
        server.database_url,
        "UPDATE record_batches b SET records = $2 FROM topics t "
        "WHERE t.topic_id = b.topic_id AND t.name = $1 AND b.partition = 0 AND b.last_offset = 0",
        topic,
        compressed_bomb(CODEC_ZSTD, 4 * MAX_RECORDS_BYTES),
    )
    unreadable = (
        f"the stored batch at offset 0 does not read (the zstd batch decompresses to more than "
        f"{MAX_RECORDS_BYTES} bytes)"
    )

    def fetched(offsets: dict[int, int]) -> list[dict]:
        positions = [{"topic": topic, "partition": p, "offset": offset} for p, offset in offsets.items()]
        response = server.client.post("/v1/fetch", json={"max_records": 100, "partitions": positions})
        assert response.status_code == 200, response.text
        return response.json()["partitions"]

    bombed, other = fetched({0: 0, 1: 0})
    assert (bombed["error"]["code"], bombed["records"]) == ("UNKNOWN_SERVER_ERROR", [])
    assert unreadable in bombed["error"]["message"]
    assert [r["value"] for r in other["records"]] == ["first", "second"]
    [past] = fetched({0: 1})
    assert (past["error"], [r["value"] for r in past["records"]]) == (None, ["after"])
    listed = server.client.post(
        "/v1/offsets/list",
        json={"partitions": [{"topic": topic, "partition": p, "timestamp": 0} for p in (0, 1)]},
    ).json()["partitions"]
    assert listed[0]["error"]["code"] == "UNKNOWN_SERVER_ERROR" and unreadable in listed[0]["error"]["message"]
    assert (listed[1]["error"], listed[1]["offset"]) == (None, 0)

    clean(server)

    assert f"{topic}-0 is not compacted: {unreadable}" in caplog.text
    # Partition 0's two batches stay; partition 1 keeps its second.
    assert [row["base_offset"] for row in stored_rows(server, topic)] == [0, 1, 1]
    page = server.client.get(f"/console/topics/{topic}/partitions/0")
    assert page.status_code == 500 and unreadable in page.text, page.text
    assert [r["value"] for r in fetched({1: 0})[0]["records"]] == ["second"]  # partition 1 compacted
    assert [r["value"] for r in fetched({0: 1})[0]["records"]] == ["after"]
