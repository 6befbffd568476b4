"""Producing and consuming over HTTP (docs/api.md, "Producing" and "Consuming"), plain (non-idempotent) writes."""

from __future__ import annotations

import base64
import itertools
import os
import threading
import time

import httpx
import pytest

from tests.conftest import SHARED_SSL_CONTEXT
from txbroker.wire import partition_for_key


# One server (and database) for the module: a fresh one per test costs ~0.5 s. Every test uses topics
# of its own (`topic` fixture / `fresh`).
@pytest.fixture(scope="module")
def shared(module_server):
    return module_server


@pytest.fixture
def client(module_client):
    return module_client


_names = itertools.count()


def fresh(client, partitions=1, config=None, prefix="pf"):
    name = f"{prefix}-{next(_names)}"
    response = client.post("/v1/topics", json={"name": name, "partitions": partitions, "config": config or {}})
    assert response.status_code == 201, response.text
    return name


@pytest.fixture
def topic(client):
    return fresh(client, 1)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def produce_raw(client, partitions, encoding=None):
    body = {"partitions": partitions}
    if encoding is not None:
        body["encoding"] = encoding
    return client.post("/v1/produce", json=body)


def produce(client, topic, partition, records, encoding=None):
    response = produce_raw(client, [{"topic": topic, "partition": partition, "records": records}], encoding)
    assert response.status_code == 200, response.text
    [entry] = response.json()["partitions"]
    assert entry["error"] is None, entry
    return entry


def values(n, prefix="v"):
    return [{"value": f"{prefix}{i}"} for i in range(n)]


def fetch(client, positions, **options):
    body = {"partitions": [{"topic": t, "partition": p, "offset": o} for t, p, o in positions], **options}
    response = client.post("/v1/fetch", json=body)
    assert response.status_code == 200, response.text
    return response.json()["partitions"]


def fetch_one(client, topic, partition=0, offset=0, **options):
    [entry] = fetch(client, [(topic, partition, offset)], **options)
    return entry


def high_watermark(client, topic, partition=0):
    return client.get(f"/v1/topics/{topic}").json()["partitions"][partition]["high_watermark"]


# ---- offsets


def test_offsets_start_at_zero_and_are_dense_across_produce_calls(client, topic):
    spans = [(e["base_offset"], e["last_offset"]) for e in (produce(client, topic, 0, values(n)) for n in (1, 3, 2, 1))]
    assert spans == [(0, 0), (1, 3), (4, 5), (6, 6)]
    assert high_watermark(client, topic) == 7
    entry = fetch_one(client, topic)
    assert [r["offset"] for r in entry["records"]] == list(range(7))
    assert [r["value"] for r in entry["records"]] == ["v0", "v0", "v1", "v2", "v0", "v1", "v0"]
    assert entry["next_offset"] == 7


def test_each_partition_has_its_own_offsets(client):
    name = fresh(client, 3)
    assert produce(client, name, 2, values(2))["base_offset"] == 0
    assert produce(client, name, 0, values(1))["base_offset"] == 0
    assert produce(client, name, 2, values(1))["base_offset"] == 2
    hws = [p["high_watermark"] for p in client.get(f"/v1/topics/{name}").json()["partitions"]]
    assert hws == [1, 0, 3]


def test_produce_response_entry_shape(client, topic):
    response = produce_raw(client, [{"topic": topic, "partition": 0, "records": values(2)}])
    assert response.json() == {
        "partitions": [
            {"topic": topic, "partition": 0, "base_offset": 0, "last_offset": 1, "duplicate": False, "error": None}
        ]
    }


def test_multi_partition_produce_returns_entries_in_request_order(client):
    a, b = fresh(client, 3), fresh(client, 2)
    produce(client, a, 0, values(4))
    response = produce_raw(
        client,
        [
            {"topic": b, "partition": 1, "records": values(2)},
            {"topic": a, "partition": 0, "records": values(3)},
            {"topic": a, "partition": 2, "records": values(1)},
            {"topic": b, "partition": 0, "records": values(5)},
        ],
    )
    assert response.status_code == 200
    got = [
        (e["topic"], e["partition"], e["base_offset"], e["last_offset"], e["duplicate"], e["error"])
        for e in response.json()["partitions"]
    ]
    assert got == [
        (b, 1, 0, 1, False, None),
        (a, 0, 4, 6, False, None),
        (a, 2, 0, 0, False, None),
        (b, 0, 0, 4, False, None),
    ]


def test_unknown_topic_or_partition_is_partition_level_and_others_are_appended(client):
    name = fresh(client, 2)
    response = produce_raw(
        client,
        [
            {"topic": name, "partition": 0, "records": values(2, "a")},
            {"topic": "no-such-topic-anywhere", "partition": 0, "records": values(1)},
            {"topic": name, "partition": 7, "records": values(1)},
            {"topic": name, "partition": 1, "records": values(3, "b")},
        ],
    )
    assert response.status_code == 200, response.text
    entries = response.json()["partitions"]
    assert [(e["topic"], e["partition"]) for e in entries] == [
        (name, 0),
        ("no-such-topic-anywhere", 0),
        (name, 7),
        (name, 1),
    ]
    assert (entries[0]["base_offset"], entries[0]["last_offset"], entries[0]["error"]) == (0, 1, None)
    assert (entries[3]["base_offset"], entries[3]["last_offset"], entries[3]["error"]) == (0, 2, None)
    for failed in (entries[1], entries[2]):
        assert failed["base_offset"] is None and failed["last_offset"] is None
        assert failed["duplicate"] is False
        assert failed["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
        assert failed["error"]["retriable"] is False
    assert "no-such-topic-anywhere" in entries[1]["error"]["message"]
    assert "7" in entries[2]["error"]["message"]
    assert [r["value"] for r in fetch_one(client, name, 0)["records"]] == ["a0", "a1"]
    assert [r["value"] for r in fetch_one(client, name, 1)["records"]] == ["b0", "b1", "b2"]


def test_all_partitions_unknown_is_still_200(client):
    response = produce_raw(
        client,
        [
            {"topic": "ghost-1", "partition": 0, "records": values(1)},
            {"topic": "ghost-2", "partition": 3, "records": values(1)},
        ],
    )
    assert response.status_code == 200
    assert [e["error"]["code"] for e in response.json()["partitions"]] == ["UNKNOWN_TOPIC_OR_PARTITION"] * 2


# ---- round trips

TEXT_RECORDS = [
    {"key": "k1", "value": "plain", "headers": [{"key": "h", "value": "hv"}]},
    {"key": None, "value": "null key", "headers": []},
    {"key": "null value", "value": None, "headers": []},
    {"key": None, "value": None, "headers": [{"key": "nullh", "value": None}]},
    {"key": "", "value": "", "headers": [{"key": "", "value": ""}]},
    {"key": "ключ", "value": "日本語 ü é ß 中文", "headers": [{"key": "ünï", "value": "çödé"}]},
    {"key": "😀", "value": "emoji 🎉👩‍👩‍👧 ok", "headers": [{"key": "🔑", "value": "🙂"}]},
    {"key": "nul\u0000in key", "value": "tab\tnl\ncr\r\u0000\u001f\u007f", "headers": []},
    {
        "key": "dup",
        "value": "dup headers",
        "headers": [{"key": "x", "value": "1"}, {"key": "x", "value": "2"}, {"key": "a", "value": None}],
    },
    {"key": "quotes", "value": "\"'\\ {} [] <>&", "headers": []},
]


def _strip(record):
    return {"key": record["key"], "value": record["value"], "headers": record["headers"]}


def test_utf8_round_trip_is_exact(client, topic):
    produce(client, topic, 0, TEXT_RECORDS)
    records = fetch_one(client, topic)["records"]
    assert [_strip(r) for r in records] == TEXT_RECORDS
    assert all("encoding" not in r or r["encoding"] is None for r in records)


def test_default_encoding_is_utf8_for_produce_and_fetch(client, topic):
    produce(client, topic, 0, [{"key": "k", "value": "YQ=="}])  # looks like base64, must stay text
    [record] = fetch_one(client, topic)["records"]
    assert (record["key"], record["value"]) == ("k", "YQ==")


def _to_b64(text):
    return None if text is None else b64(text.encode("utf-8"))


def test_write_utf8_read_base64_gives_the_utf8_bytes(client, topic):
    produce(client, topic, 0, TEXT_RECORDS)
    records = fetch_one(client, topic, encoding="base64")["records"]
    expected = [
        {
            "key": _to_b64(r["key"]),
            "value": _to_b64(r["value"]),
            "headers": [{"key": h["key"], "value": _to_b64(h["value"])} for h in r["headers"]],
        }
        for r in TEXT_RECORDS
    ]
    assert [_strip(r) for r in records] == expected


def test_write_base64_read_utf8_gives_the_text(client, topic):
    written = [
        {
            "key": _to_b64(r["key"]),
            "value": _to_b64(r["value"]),
            "headers": [{"key": h["key"], "value": _to_b64(h["value"])} for h in r["headers"]],
        }
        for r in TEXT_RECORDS
    ]
    produce(client, topic, 0, written, encoding="base64")
    records = fetch_one(client, topic, encoding="utf8")["records"]
    assert [_strip(r) for r in records] == TEXT_RECORDS
    assert all(r.get("encoding") in (None,) for r in records)


def test_arbitrary_bytes_round_trip_in_base64(client, topic):
    blobs = [bytes(range(256)), b"\x00", b"\xff\xfe\xfd", b"\xc3\x28", b"\xed\xa0\x80", os.urandom(1000)]
    records = [
        {"key": b64(blob[:7]), "value": b64(blob), "headers": [{"key": "raw", "value": b64(blob[::-1])}]}
        for blob in blobs
    ]
    produce(client, topic, 0, records, encoding="base64")
    fetched = fetch_one(client, topic, encoding="base64")["records"]
    for blob, record in zip(blobs, fetched):
        assert base64.b64decode(record["key"]) == blob[:7]
        assert base64.b64decode(record["value"]) == blob
        assert base64.b64decode(record["headers"][0]["value"]) == blob[::-1]
        assert record.get("encoding") in (None, "base64")
    assert len(fetched) == len(blobs)


def test_non_utf8_bytes_in_utf8_fetch_come_back_base64_and_marked(client, topic):
    produce(
        client,
        topic,
        0,
        [
            {"key": b64(b"text-key"), "value": b64("fine ü".encode())},
            {"key": b64(b"k"), "value": b64(b"\xff\x00bad"), "headers": [{"key": "h", "value": b64(b"ok")}]},
            {"key": b64(b"k2"), "value": b64(b"good"), "headers": [{"key": "h", "value": b64(b"\x80")}]},
            {"key": b64(b"\xc0"), "value": None},
        ],
        encoding="base64",
    )
    records = fetch_one(client, topic, encoding="utf8")["records"]
    first, second, third, fourth = records
    assert (first["key"], first["value"]) == ("text-key", "fine ü")
    assert "encoding" not in first or first["encoding"] is None
    assert second["encoding"] == "base64"
    assert base64.b64decode(second["key"]) == b"k"
    assert base64.b64decode(second["value"]) == b"\xff\x00bad"
    assert base64.b64decode(second["headers"][0]["value"]) == b"ok"
    assert second["headers"][0]["key"] == "h"
    assert third["encoding"] == "base64"
    assert base64.b64decode(third["value"]) == b"good"
    assert base64.b64decode(third["headers"][0]["value"]) == b"\x80"
    assert fourth["encoding"] == "base64"
    assert base64.b64decode(fourth["key"]) == b"\xc0" and fourth["value"] is None


def test_empty_base64_is_empty_bytes_not_null(client, topic):
    produce(client, topic, 0, [{"key": "", "value": ""}], encoding="base64")
    [record] = fetch_one(client, topic)["records"]
    assert (record["key"], record["value"]) == ("", "")


def test_large_value_round_trips(client, topic):
    value = "é" * 200_000 + "end"
    produce(client, topic, 0, [{"value": value}])
    assert fetch_one(client, topic)["records"][0]["value"] == value


# ---- timestamps


def test_given_timestamp_is_kept(client, topic):
    produce(
        client,
        topic,
        0,
        [
            {"value": "a", "timestamp_ms": 0},
            {"value": "b", "timestamp_ms": 1234567890123},
            {"value": "c", "timestamp_ms": 2**62},
        ],
    )
    assert [r["timestamp_ms"] for r in fetch_one(client, topic)["records"]] == [0, 1234567890123, 2**62]


def test_omitted_or_null_timestamp_becomes_append_time(client, topic):
    before = int(time.time() * 1000)
    produce(client, topic, 0, [{"value": "a"}, {"value": "b", "timestamp_ms": None}])
    after = int(time.time() * 1000)
    stamps = [r["timestamp_ms"] for r in fetch_one(client, topic)["records"]]
    assert all(before - 5 <= ts <= after + 5 for ts in stamps), (before, stamps, after)


# ---- fetch


def test_read_committed_and_read_uncommitted_agree_for_plain_writes(client, topic):
    produce(client, topic, 0, values(3))
    produce(client, topic, 0, values(2, "w"))
    committed = fetch_one(client, topic, isolation_level="read_committed")
    uncommitted = fetch_one(client, topic, isolation_level="read_uncommitted")
    default = fetch_one(client, topic)
    assert committed == uncommitted == default
    assert committed["high_watermark"] == committed["last_stable_offset"] == 5
    assert committed["log_start_offset"] == 0


def test_fetch_entry_shape(client, topic):
    produce(client, topic, 0, [{"key": "k", "value": "v", "timestamp_ms": 9}])
    entry = fetch_one(client, topic)
    assert entry == {
        "topic": topic,
        "partition": 0,
        "error": None,
        "high_watermark": 1,
        "last_stable_offset": 1,
        "log_start_offset": 0,
        "next_offset": 1,
        "records": [{"offset": 0, "key": "k", "value": "v", "headers": [], "timestamp_ms": 9}],
    }


def test_fetch_from_a_middle_offset(client, topic):
    produce(client, topic, 0, values(4))
    produce(client, topic, 0, values(4, "w"))
    entry = fetch_one(client, topic, offset=2)
    assert [r["offset"] for r in entry["records"]] == [2, 3, 4, 5, 6, 7]
    assert [r["value"] for r in entry["records"]] == ["v2", "v3", "w0", "w1", "w2", "w3"]
    assert entry["next_offset"] == 8
    entry = fetch_one(client, topic, offset=5)
    assert [r["value"] for r in entry["records"]] == ["w1", "w2", "w3"]


def test_fetch_at_high_watermark_is_empty_without_error(client, topic):
    produce(client, topic, 0, values(3))
    entry = fetch_one(client, topic, offset=3)
    assert entry["error"] is None
    assert entry["records"] == []
    assert entry["next_offset"] == 3
    assert entry["high_watermark"] == 3


def test_fetch_of_empty_partition(client, topic):
    entry = fetch_one(client, topic)
    assert (entry["records"], entry["next_offset"], entry["high_watermark"], entry["error"]) == ([], 0, 0, None)


def test_max_records_bounds_the_result_and_next_offset_continues_exactly(client, topic):
    for n in (4, 4, 2):
        produce(client, topic, 0, values(n, f"b{n}-"))
    seen, offset = [], 0
    for expected in ([0, 1, 2], [3, 4, 5], [6, 7, 8], [9], []):
        entry = fetch_one(client, topic, offset=offset, max_records=3)
        assert [r["offset"] for r in entry["records"]] == expected
        seen += entry["records"]
        offset = entry["next_offset"]
        assert offset == (expected[-1] + 1 if expected else 10)
    assert [r["offset"] for r in seen] == list(range(10))


def test_max_records_one_walks_one_record_at_a_time(client, topic):
    produce(client, topic, 0, values(3))
    offsets, offset = [], 0
    for _ in range(3):
        entry = fetch_one(client, topic, offset=offset, max_records=1)
        assert len(entry["records"]) == 1
        offsets.append(entry["records"][0]["offset"])
        offset = entry["next_offset"]
    assert offsets == [0, 1, 2] and offset == 3


def test_small_fetches_walk_batches_of_every_size_without_loss_or_repeat(client, topic):
    # A read's page covers max_records offsets plus the batch that straddles its end: walking with
    # every budget, against batches smaller and larger than it, must see each record once, in order.
    sizes = (1, 5, 1, 20, 3, 1, 7)
    for index, n in enumerate(sizes):
        produce(client, topic, 0, values(n, f"b{index}-"))
    expected = [f"b{index}-{i}" for index, n in enumerate(sizes) for i in range(n)]
    for max_records in (1, 2, 3, 6, 19, 37, 38, 500):
        seen, offset = [], 0
        while offset < len(expected):
            entry = fetch_one(client, topic, offset=offset, max_records=max_records)
            assert 1 <= len(entry["records"]) <= max_records, (max_records, offset, entry)
            assert [r["offset"] for r in entry["records"]] == list(range(offset, entry["next_offset"]))
            seen += [r["value"] for r in entry["records"]]
            offset = entry["next_offset"]
        assert seen == expected, max_records


def test_fetch_several_partitions_in_one_request(client):
    a, b = fresh(client, 2), fresh(client, 1)
    produce(client, a, 0, values(2, "a0-"))
    produce(client, a, 1, values(3, "a1-"))
    produce(client, b, 0, values(1, "b0-"))
    entries = fetch(client, [(b, 0, 0), (a, 1, 1), (a, 0, 0)])
    assert [(e["topic"], e["partition"]) for e in entries] == [(b, 0), (a, 1), (a, 0)]
    assert [r["value"] for r in entries[0]["records"]] == ["b0-0"]
    assert [r["value"] for r in entries[1]["records"]] == ["a1-1", "a1-2"]
    assert [r["value"] for r in entries[2]["records"]] == ["a0-0", "a0-1"]
    assert [e["next_offset"] for e in entries] == [1, 3, 2]
    assert [e["high_watermark"] for e in entries] == [1, 3, 2]


def test_max_records_bounds_the_total_over_partitions_and_resumes_without_gaps(client):
    name = fresh(client, 2)
    produce(client, name, 0, values(5, "p0-"))
    produce(client, name, 1, values(5, "p1-"))
    positions = {0: 0, 1: 0}
    collected = {0: [], 1: []}
    for _ in range(10):
        entries = fetch(client, [(name, p, o) for p, o in positions.items()], max_records=3)
        assert sum(len(e["records"]) for e in entries) <= 3
        for entry in entries:
            records = entry["records"]
            if records:
                assert records[0]["offset"] == positions[entry["partition"]]
                assert entry["next_offset"] == records[-1]["offset"] + 1
            else:
                assert entry["next_offset"] == positions[entry["partition"]]
            collected[entry["partition"]] += [r["value"] for r in records]
            positions[entry["partition"]] = entry["next_offset"]
        if positions == {0: 5, 1: 5}:
            break
    assert collected == {0: [f"p0-{i}" for i in range(5)], 1: [f"p1-{i}" for i in range(5)]}


def test_fetch_unknown_topic_or_partition_is_partition_level(client, topic):
    produce(client, topic, 0, values(1))
    entries = fetch(client, [("never-made", 0, 0), (topic, 4, 0), (topic, 0, 0)])
    assert [e["error"]["code"] if e["error"] else None for e in entries] == [
        "UNKNOWN_TOPIC_OR_PARTITION",
        "UNKNOWN_TOPIC_OR_PARTITION",
        None,
    ]
    assert entries[0]["records"] == [] and entries[1]["records"] == []
    assert [r["value"] for r in entries[2]["records"]] == ["v0"]


# ---- GET convenience endpoint


def test_get_records_endpoint_returns_one_fetch_entry(client, topic):
    produce(client, topic, 0, [{"key": "k", "value": "v", "timestamp_ms": 5}])
    response = client.get(f"/v1/topics/{topic}/partitions/0/records")
    assert response.status_code == 200
    assert response.json() == {
        "topic": topic,
        "partition": 0,
        "error": None,
        "high_watermark": 1,
        "last_stable_offset": 1,
        "log_start_offset": 0,
        "next_offset": 1,
        "records": [{"offset": 0, "key": "k", "value": "v", "headers": [], "timestamp_ms": 5}],
    }


def test_get_records_endpoint_honours_offset_and_max_records(client, topic):
    produce(client, topic, 0, values(6))
    body = client.get(f"/v1/topics/{topic}/partitions/0/records", params={"offset": 2, "max_records": 3}).json()
    assert [r["offset"] for r in body["records"]] == [2, 3, 4]
    assert body["next_offset"] == 5


def test_get_records_endpoint_honours_isolation_level_and_encoding(client, topic):
    produce(client, topic, 0, [{"key": "ü", "value": "😀"}])
    for level in ("read_committed", "read_uncommitted"):
        body = client.get(
            f"/v1/topics/{topic}/partitions/0/records", params={"isolation_level": level, "encoding": "base64"}
        ).json()
        [record] = body["records"]
        assert base64.b64decode(record["key"]) == "ü".encode()
        assert base64.b64decode(record["value"]) == "😀".encode()


def test_get_records_endpoint_marks_non_utf8_records(client, topic):
    produce(client, topic, 0, [{"value": b64(b"\xfe")}], encoding="base64")
    [record] = client.get(f"/v1/topics/{topic}/partitions/0/records").json()["records"]
    assert record["encoding"] == "base64" and base64.b64decode(record["value"]) == b"\xfe"


def test_get_records_endpoint_unknown_topic_and_partition_are_404(client, topic):
    for path in ("/v1/topics/never-made/partitions/0/records", f"/v1/topics/{topic}/partitions/3/records"):
        response = client.get(path)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"


# ---- POST /v1/topics/{topic}/records


def test_records_endpoint_with_partition_appends_there(client):
    name = fresh(client, 3)
    response = client.post(f"/v1/topics/{name}/records", json={"partition": 2, "records": values(2)})
    assert response.status_code == 200
    assert response.json() == {
        "topic": name,
        "partition": 2,
        "base_offset": 0,
        "last_offset": 1,
        "duplicate": False,
        "error": None,
    }
    assert [r["value"] for r in fetch_one(client, name, 2)["records"]] == ["v0", "v1"]


def test_records_endpoint_same_key_always_lands_on_the_murmur2_partition(client):
    name = fresh(client, 7)
    for key in ("user-1", "order-42", "ü-key", "😀"):
        expected = partition_for_key(key.encode("utf-8"), 7)
        for _ in range(2):
            response = client.post(
                f"/v1/topics/{name}/records", json={"partition": None, "records": [{"key": key, "value": "x"}]}
            )
            assert response.status_code == 200, response.text
            assert response.json()["partition"] == expected, key


def test_records_endpoint_without_partition_field_also_partitions_by_key(client):
    name = fresh(client, 5)
    response = client.post(f"/v1/topics/{name}/records", json={"records": [{"key": "abc", "value": "x"}]})
    assert response.status_code == 200
    assert response.json()["partition"] == partition_for_key(b"abc", 5)


def test_records_endpoint_base64_key_is_hashed_as_its_bytes(client):
    name = fresh(client, 11)
    raw = b"\xff\x00\x10binary"
    response = client.post(
        f"/v1/topics/{name}/records", json={"encoding": "base64", "records": [{"key": b64(raw), "value": b64(b"v")}]}
    )
    assert response.status_code == 200
    assert response.json()["partition"] == partition_for_key(raw, 11)
    same_as_text = client.post(
        f"/v1/topics/{name}/records", json={"encoding": "base64", "records": [{"key": b64(b"abc"), "value": None}]}
    )
    assert same_as_text.json()["partition"] == partition_for_key(b"abc", 11)


def test_records_endpoint_many_keys_use_several_partitions(client):
    name = fresh(client, 4)
    used = {
        client.post(f"/v1/topics/{name}/records", json={"records": [{"key": f"key-{i}", "value": "x"}]}).json()[
            "partition"
        ]
        for i in range(12)
    }
    assert used == {partition_for_key(f"key-{i}".encode(), 4) for i in range(12)}
    assert len(used) > 1


def test_records_endpoint_null_keys_go_round_robin(client):
    name = fresh(client, 3)
    chosen = []
    for _ in range(6):
        response = client.post(f"/v1/topics/{name}/records", json={"partition": None, "records": [{"value": "x"}]})
        assert response.status_code == 200
        chosen.append(response.json()["partition"])
    assert all((b - a) % 3 == 1 for a, b in zip(chosen, chosen[1:])), chosen
    assert sorted(chosen) == [0, 0, 1, 1, 2, 2]
    hws = [p["high_watermark"] for p in client.get(f"/v1/topics/{name}").json()["partitions"]]
    assert hws == [2, 2, 2]


def test_records_endpoint_several_records_with_one_key_stay_together(client):
    name = fresh(client, 4)
    response = client.post(
        f"/v1/topics/{name}/records", json={"records": [{"key": "same", "value": str(i)} for i in range(3)]}
    )
    body = response.json()
    assert body["partition"] == partition_for_key(b"same", 4)
    assert (body["base_offset"], body["last_offset"]) == (0, 2)


@pytest.mark.parametrize("keys", [["a", "b"], ["a", None], [None, "a"], ["a", "a", "A"]])
def test_records_endpoint_mixed_keys_without_partition_is_invalid_request(client, keys):
    name = fresh(client, 3)
    response = client.post(
        f"/v1/topics/{name}/records", json={"partition": None, "records": [{"key": k, "value": "x"} for k in keys]}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "INVALID_REQUEST"
    assert "key" in error["message"]
    assert [p["high_watermark"] for p in client.get(f"/v1/topics/{name}").json()["partitions"]] == [0, 0, 0]


def test_records_endpoint_mixed_keys_with_explicit_partition_are_fine(client):
    name = fresh(client, 3)
    response = client.post(
        f"/v1/topics/{name}/records", json={"partition": 1, "records": [{"key": "a"}, {"key": None}, {"key": "b"}]}
    )
    assert response.status_code == 200
    assert (response.json()["partition"], response.json()["last_offset"]) == (1, 2)


def test_records_endpoint_unknown_topic_or_partition_is_404(client, topic):
    for path, partition in (
        ("/v1/topics/never-made/records", None),
        ("/v1/topics/never-made/records", 0),
        (f"/v1/topics/{topic}/records", 1),
    ):
        response = client.post(path, json={"partition": partition, "records": [{"key": "k", "value": "v"}]})
        assert response.status_code == 404, response.text
        assert response.json()["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"


# ---- long polling


def test_long_poll_returns_when_another_client_appends(client, shared, topic):
    produce(client, topic, 0, values(2))

    def append_later():
        time.sleep(0.4)
        with httpx.Client(base_url=shared.url, timeout=30, verify=SHARED_SSL_CONTEXT) as other:
            other.post(
                "/v1/produce", json={"partitions": [{"topic": topic, "partition": 0, "records": [{"value": "late"}]}]}
            )

    writer = threading.Thread(target=append_later)
    started = time.monotonic()
    writer.start()
    entry = fetch_one(client, topic, offset=2, max_wait_ms=5000)
    elapsed = time.monotonic() - started
    writer.join()
    assert [(r["offset"], r["value"]) for r in entry["records"]] == [(2, "late")]
    assert entry["next_offset"] == 3
    assert elapsed < 5.0


def test_long_poll_on_several_partitions_wakes_for_any_of_them(client, shared):
    name = fresh(client, 3)

    def append_later():
        time.sleep(0.3)
        with httpx.Client(base_url=shared.url, timeout=30, verify=SHARED_SSL_CONTEXT) as other:
            other.post(f"/v1/topics/{name}/records", json={"partition": 2, "records": [{"value": "p2"}]})

    writer = threading.Thread(target=append_later)
    started = time.monotonic()
    writer.start()
    entries = fetch(client, [(name, 0, 0), (name, 1, 0), (name, 2, 0)], max_wait_ms=5000)
    elapsed = time.monotonic() - started
    writer.join()
    assert [len(e["records"]) for e in entries] == [0, 0, 1]
    assert entries[2]["records"][0]["value"] == "p2"
    assert elapsed < 5.0


def test_long_poll_returns_empty_after_max_wait_when_nothing_arrives(client, topic):
    produce(client, topic, 0, values(1))
    started = time.monotonic()
    entry = fetch_one(client, topic, offset=1, max_wait_ms=1000)
    elapsed = time.monotonic() - started
    assert entry["records"] == [] and entry["error"] is None
    assert entry["next_offset"] == 1 and entry["high_watermark"] == 1
    assert elapsed >= 1000 * 0.9 / 1000


def test_long_poll_is_not_woken_by_other_topics(client, shared, topic):
    other_topic = fresh(client, 1)

    def append_elsewhere():
        time.sleep(0.2)
        with httpx.Client(base_url=shared.url, timeout=30, verify=SHARED_SSL_CONTEXT) as other:
            other.post(f"/v1/topics/{other_topic}/records", json={"partition": 0, "records": [{"value": "x"}]})

    writer = threading.Thread(target=append_elsewhere)
    started = time.monotonic()
    writer.start()
    entry = fetch_one(client, topic, max_wait_ms=700)
    elapsed = time.monotonic() - started
    writer.join()
    assert entry["records"] == []
    assert elapsed >= 0.7 * 0.9


def test_long_poll_with_data_available_returns_at_once(client, topic):
    produce(client, topic, 0, values(1))
    started = time.monotonic()
    entry = fetch_one(client, topic, max_wait_ms=5000)
    assert len(entry["records"]) == 1
    assert time.monotonic() - started < 4.0


def test_get_records_endpoint_long_polls_too(client, shared, topic):
    def append_later():
        time.sleep(0.3)
        with httpx.Client(base_url=shared.url, timeout=30, verify=SHARED_SSL_CONTEXT) as other:
            other.post(f"/v1/topics/{topic}/records", json={"partition": 0, "records": [{"value": "g"}]})

    writer = threading.Thread(target=append_later)
    started = time.monotonic()
    writer.start()
    body = client.get(f"/v1/topics/{topic}/partitions/0/records", params={"max_wait_ms": 5000}).json()
    writer.join()
    assert [r["value"] for r in body["records"]] == ["g"]
    assert time.monotonic() - started < 5.0


# ---- ListOffsets


def list_offsets(client, partitions, isolation_level=None):
    body = {"partitions": [{"topic": t, "partition": p, "timestamp": ts} for t, p, ts in partitions]}
    if isolation_level:
        body["isolation_level"] = isolation_level
    response = client.post("/v1/offsets/list", json=body)
    assert response.status_code == 200, response.text
    return response.json()["partitions"]


def test_list_offsets_earliest_and_latest(client, topic):
    produce(client, topic, 0, values(3))
    produce(client, topic, 0, values(2))
    for level in (None, "read_committed", "read_uncommitted"):
        latest, earliest = list_offsets(client, [(topic, 0, -1), (topic, 0, -2)], level)
        assert (latest["topic"], latest["partition"], latest["offset"], latest["error"]) == (topic, 0, 5, None)
        assert (earliest["offset"], earliest["error"]) == (0, None)


def test_list_offsets_timestamp_defaults_to_latest(client, topic):
    produce(client, topic, 0, values(4))
    response = client.post("/v1/offsets/list", json={"partitions": [{"topic": topic, "partition": 0}]})
    assert response.json()["partitions"][0]["offset"] == 4


def test_list_offsets_of_empty_partition(client, topic):
    latest, earliest, by_time = list_offsets(client, [(topic, 0, -1), (topic, 0, -2), (topic, 0, 0)])
    assert (latest["offset"], earliest["offset"], by_time["offset"]) == (0, 0, -1)
    assert by_time["timestamp_ms"] == -1 and by_time["error"] is None


@pytest.mark.parametrize(
    ("timestamp", "offset", "found_ts"),
    [
        (0, 0, 100),
        (50, 0, 100),
        (100, 0, 100),
        (101, 1, 200),
        (200, 1, 200),
        (201, 4, 300),
        (300, 4, 300),
        (301, 5, 400),
        (400, 5, 400),
        (401, -1, -1),
        (2**62, -1, -1),
    ],
)
def test_list_offsets_by_timestamp_is_first_offset_at_or_after(client, topic, timestamp, offset, found_ts):
    produce(client, topic, 0, [{"value": "a", "timestamp_ms": 100}, {"value": "b", "timestamp_ms": 200}])
    produce(
        client,
        topic,
        0,
        [{"value": "c", "timestamp_ms": 200}, {"value": "d", "timestamp_ms": 200}, {"value": "e", "timestamp_ms": 300}],
    )
    produce(client, topic, 0, [{"value": "f", "timestamp_ms": 400}])
    [entry] = list_offsets(client, [(topic, 0, timestamp)])
    assert (entry["offset"], entry["timestamp_ms"], entry["error"]) == (offset, found_ts, None)


def test_list_offsets_by_timestamp_follows_log_order_not_time_order(client, topic):
    produce(client, topic, 0, [{"value": "a", "timestamp_ms": 500}])
    produce(client, topic, 0, [{"value": "b", "timestamp_ms": 100}, {"value": "c", "timestamp_ms": 300}])
    assert [
        (e["offset"], e["timestamp_ms"])
        for e in list_offsets(client, [(topic, 0, 200), (topic, 0, 500), (topic, 0, 501), (topic, 0, 50)])
    ] == [(0, 500), (0, 500), (-1, -1), (0, 500)]


def test_list_offsets_by_timestamp_within_a_batch_with_unordered_times(client, topic):
    produce(
        client,
        topic,
        0,
        [{"value": "a", "timestamp_ms": 100}, {"value": "b", "timestamp_ms": 900}, {"value": "c", "timestamp_ms": 400}],
    )
    [entry] = list_offsets(client, [(topic, 0, 300)])
    assert (entry["offset"], entry["timestamp_ms"]) == (1, 900)


def test_list_offsets_unknown_topic_or_partition_is_partition_level_in_order(client, topic):
    produce(client, topic, 0, values(2))
    entries = list_offsets(client, [("never-made", 0, -1), (topic, 9, -1), (topic, 0, -1)])
    assert [(e["topic"], e["partition"]) for e in entries] == [("never-made", 0), (topic, 9), (topic, 0)]
    assert [e["error"]["code"] if e["error"] else None for e in entries] == [
        "UNKNOWN_TOPIC_OR_PARTITION",
        "UNKNOWN_TOPIC_OR_PARTITION",
        None,
    ]
    assert [e["offset"] for e in entries] == [-1, -1, 2]


# ---- concurrency


def test_concurrent_appends_to_one_partition_get_dense_unique_offsets(client, shared, topic):
    spans, errors = [], []

    def writer(index):
        with httpx.Client(base_url=shared.url, timeout=60, verify=SHARED_SSL_CONTEXT) as own:
            for round_ in range(8):
                response = own.post(
                    "/v1/produce",
                    json={
                        "partitions": [
                            {"topic": topic, "partition": 0, "records": values(1 + (index + round_) % 3, f"w{index}-")}
                        ]
                    },
                )
                if response.status_code != 200 or response.json()["partitions"][0]["error"]:
                    errors.append(response.text)
                    return
                entry = response.json()["partitions"][0]
                spans.append((entry["base_offset"], entry["last_offset"]))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    covered = sorted(offset for base, last in spans for offset in range(base, last + 1))
    assert covered == list(range(len(covered)))
    assert high_watermark(client, topic) == len(covered)
    fetched = fetch_one(client, topic, max_records=10_000)["records"]
    assert [r["offset"] for r in fetched] == covered


def test_concurrent_multi_partition_produces_in_opposite_orders_do_not_fail(client, shared):
    name = fresh(client, 2)
    errors = []

    def writer(order):
        with httpx.Client(base_url=shared.url, timeout=60, verify=SHARED_SSL_CONTEXT) as own:
            for _ in range(10):
                response = own.post(
                    "/v1/produce",
                    json={"partitions": [{"topic": name, "partition": p, "records": values(2)} for p in order]},
                )
                if response.status_code != 200 or any(e["error"] for e in response.json()["partitions"]):
                    errors.append(response.text)

    threads = [threading.Thread(target=writer, args=(order,)) for order in ([0, 1], [1, 0], [0, 1], [1, 0])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [p["high_watermark"] for p in client.get(f"/v1/topics/{name}").json()["partitions"]] == [80, 80]


def test_list_offsets_max_timestamp_is_the_first_record_with_the_highest(client, topic):
    """KIP-734's -3, as the Kafka door answers it: the record with the highest timestamp (the first
    of those that share it), with its timestamp; none in an empty partition."""
    [empty] = list_offsets(client, [(topic, 0, -3)])
    assert (empty["offset"], empty["timestamp_ms"], empty["error"]) == (-1, -1, None)
    produce(client, topic, 0, [{"value": "a", "timestamp_ms": 300}, {"value": "b", "timestamp_ms": 500}])
    produce(client, topic, 0, [{"value": "c", "timestamp_ms": 100}, {"value": "d", "timestamp_ms": 500}])
    [found] = list_offsets(client, [(topic, 0, -3)])
    assert (found["offset"], found["timestamp_ms"], found["error"]) == (1, 500, None)


def test_a_fetch_answers_at_most_max_fetch_bytes_of_batches_and_its_first_whatever_its_size(make_server):
    """Regression: an HTTP fetch read every batch its max_records reached, whatever their size, so one
    asking 10,000 records of a topic of large records made the worker read and hold gigabytes. It now
    answers from at most the server's max_fetch_bytes of stored batches, over all its partitions, as
    Kafka's fetch.max.bytes bounds a fetch, and its first batch whatever its size (KIP-74): a consumer
    continues from next_offset, and nothing is skipped."""
    server = make_server(max_fetch_bytes=1024)
    client = server.client
    assert client.post("/v1/topics", json={"name": "large", "partitions": 2}).status_code == 201
    for i in range(6):
        produce(client, "large", 0, [{"value": f"{i}" + "x" * 400}])
    produce(client, "large", 1, [{"value": "y" * 3000}])
    produce(client, "large", 1, [{"value": "z"}])

    first, second = fetch(client, [("large", 0, 0), ("large", 1, 0)], max_records=100)
    assert 1 <= len(first["records"]) < 6 and second["records"] == []  # the budget went on partition 0
    assert first["next_offset"] == first["records"][-1]["offset"] + 1
    seen, offset = [], 0
    while offset < 6:
        entry = fetch_one(client, "large", 0, offset, max_records=100)
        assert entry["records"], entry
        seen += [record["value"][0] for record in entry["records"]]
        offset = entry["next_offset"]
    assert seen == [str(i) for i in range(6)]
    oversized = fetch_one(client, "large", 1, 0, max_records=100)
    assert [len(r["value"]) for r in oversized["records"]] == [3000]  # the first batch, larger than the budget
    assert oversized["next_offset"] == 1
    get = client.get("/v1/topics/large/partitions/0/records", params={"offset": 0, "max_records": 100})
    assert 1 <= len(get.json()["records"]) < 6
