"""Bad input (docs/api.md, "Conventions"): HTTP 400 INVALID_REQUEST with a message that says what was wrong,
never a 500, never a stack trace, never a partial write -- and the more specific codes where the
contract names one (UNKNOWN_PRODUCER_ID, OFFSET_OUT_OF_RANGE, RECORD_TOO_LARGE)."""

from __future__ import annotations

import base64
import json
import os
import re
import time

import httpx
import pytest

from tests.conftest import SHARED_SSL_CONTEXT, start_server_on_fresh_database, stop_in_process_server

BAD = "bad"  # 2 partitions; nothing in this module may ever be appended to it
TINY = "tiny"  # 2 partitions, max_message_bytes 10
LIMITED = "lim"  # on the `limited` server: max_request_bytes 1024, max_records_per_request 3
TINY_MAX = 10
BOUNDED = "bounded"  # 2 partitions, message_timestamp_before_max_ms and _after_max_ms BOUND_MS
BOUND_MS = 60_000
HOUR_MS = 3_600_000


def _start_server(postgres, name: str, **overrides):
    server = start_server_on_fresh_database(postgres, name, **overrides)
    return server, lambda: stop_in_process_server(server)


# Module-scoped servers: a fresh one per test costs ~0.5 s and this module has hundreds of cases.
@pytest.fixture(scope="module")
def shared(postgres):
    server, stop = _start_server(postgres, f"bad_input_{os.getpid()}")
    with httpx.Client(base_url=server.url, timeout=30, verify=SHARED_SSL_CONTEXT) as c:
        bounds = {"message_timestamp_before_max_ms": BOUND_MS, "message_timestamp_after_max_ms": BOUND_MS}
        for name, config in ((BAD, {}), (TINY, {"max_message_bytes": TINY_MAX}), (BOUNDED, bounds)):
            assert c.post("/v1/topics", json={"name": name, "partitions": 2, "config": config}).status_code == 201
    yield server
    stop()


@pytest.fixture(scope="module")
def limited(postgres):
    server, stop = _start_server(
        postgres, f"bad_input_limited_{os.getpid()}", max_request_bytes=1024, max_records_per_request=3
    )
    with httpx.Client(base_url=server.url, timeout=30, verify=SHARED_SSL_CONTEXT) as c:
        assert c.post("/v1/topics", json={"name": LIMITED, "partitions": 2}).status_code == 201
    yield server
    stop()


@pytest.fixture
def client(shared):
    """A client of its own per test: a server error can break a kept-alive connection."""
    with httpx.Client(base_url=shared.url, timeout=30, verify=SHARED_SSL_CONTEXT) as c:
        yield c


@pytest.fixture
def limited_client(limited):
    with httpx.Client(base_url=limited.url, timeout=30, verify=SHARED_SSL_CONTEXT) as c:
        yield c


class Raw(str):
    """A body sent exactly as written (not JSON-encoded)."""


def send(client, method, path, body):
    content = body.encode("utf-8") if isinstance(body, Raw) else json.dumps(body).encode("ascii")
    return client.request(method, path, content=content, headers={"content-type": "application/json"})


def hws(client, topic):
    response = client.get(f"/v1/topics/{topic}")
    assert response.status_code == 200, response.text
    return [p["high_watermark"] for p in response.json()["partitions"]]


def assert_error(response, status, code, *mentions):
    """The contract's error body, with this status and code, a message naming each of `mentions`,
    a boolean `retriable`, and nothing that looks like a stack trace or framework internals."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"code", "message", "retriable"}, error
    assert error["code"] == code, error
    assert isinstance(error["retriable"], bool)
    assert error["retriable"] is False
    assert isinstance(error["message"], str) and error["message"]
    for mention in mentions:
        assert mention in error["message"], (mention, error["message"])
    for marker in ("Traceback", 'File "', "errors.pydantic.dev", "asyncpg", "line "):
        assert marker not in response.text, response.text
    return error


def assert_invalid_request(response, *mentions):
    return assert_error(response, 400, "INVALID_REQUEST", *mentions)


# ---- request bodies


def part(**overrides):
    return {"topic": BAD, "partition": 0, "records": [{"value": "x"}], **overrides}


def rec(**overrides):
    return {"value": "x", **overrides}


def one_record(encoding=None, **record):
    body = {"partitions": [part(records=[rec(**record)])]}
    if encoding:
        body["encoding"] = encoding
    return body


COMMON_BODY_CASES = [
    ("malformed-json", Raw('{"partitions": ['), ["JSON"]),
    ("trailing-garbage", Raw('{"partitions": []} garbage'), ["JSON"]),
    ("single-quotes", Raw("{'partitions': []}"), ["JSON"]),
    ("json-array", [], ["body"]),
    ("json-string", "text", ["body", "'text'"]),
    ("json-null", None, ["body"]),
    ("json-number", 5, ["body"]),
    ("empty-body", Raw(""), ["body"]),
    ("missing-partitions", {}, ["partitions"]),
    ("partitions-null", {"partitions": None}, ["partitions"]),
    ("partitions-empty", {"partitions": []}, ["partitions"]),
    ("partitions-object", {"partitions": {"topic": BAD}}, ["partitions"]),
]

PRODUCE_CASES = COMMON_BODY_CASES + [
    ("topic-missing", {"partitions": [{"partition": 0, "records": [rec()]}]}, ["partitions[0].topic"]),
    ("topic-number", {"partitions": [part(topic=5)]}, ["partitions[0].topic"]),
    ("partition-missing", {"partitions": [{"topic": BAD, "records": [rec()]}]}, ["partitions[0].partition"]),
    ("partition-string", {"partitions": [part(partition="0")]}, ["partitions[0].partition", "'0'"]),
    ("partition-float", {"partitions": [part(partition=1.5)]}, ["partitions[0].partition", "1.5"]),
    ("partition-bool", {"partitions": [part(partition=True)]}, ["partitions[0].partition", "True"]),
    ("partition-negative", {"partitions": [part(partition=-1)]}, ["partitions[0].partition", "-1"]),
    ("partition-over-int32", {"partitions": [part(partition=2**31)]}, ["partitions[0].partition"]),
    (
        "partition-nan",
        Raw('{"partitions": [{"topic": "bad", "partition": NaN, "records": [{}]}]}'),
        ["partitions[0].partition"],
    ),
    ("records-missing", {"partitions": [{"topic": BAD, "partition": 0}]}, ["partitions[0].records"]),
    ("records-empty", {"partitions": [part(records=[])]}, ["partitions[0].records"]),
    ("records-null", {"partitions": [part(records=None)]}, ["partitions[0].records"]),
    ("record-string", {"partitions": [part(records=["x"])]}, ["partitions[0].records[0]"]),
    ("second-record-bad", {"partitions": [part(records=[rec(), rec(key=7)])]}, ["partitions[0].records[1].key"]),
    ("key-number", one_record(key=5), ["partitions[0].records[0].key", "5"]),
    ("value-bool", one_record(value=True), ["partitions[0].records[0].value"]),
    ("value-object", one_record(value={"a": 1}), ["partitions[0].records[0].value"]),
    ("value-list", one_record(value=["a"]), ["partitions[0].records[0].value"]),
    ("headers-object", one_record(headers={"k": "v"}), ["partitions[0].records[0].headers"]),
    ("header-without-key", one_record(headers=[{"value": "v"}]), ["partitions[0].records[0].headers[0].key"]),
    ("header-key-null", one_record(headers=[{"key": None, "value": "v"}]), ["headers[0].key"]),
    ("header-value-number", one_record(headers=[{"key": "k", "value": 1}]), ["headers[0].value"]),
    ("timestamp-string", one_record(timestamp_ms="1"), ["timestamp_ms", "'1'"]),
    ("timestamp-negative", one_record(timestamp_ms=-1), ["timestamp_ms", "-1"]),
    ("timestamp-float", one_record(timestamp_ms=1.5), ["timestamp_ms"]),
    ("timestamp-over-int64", one_record(timestamp_ms=2**63), ["timestamp_ms"]),
    ("encoding-unknown", {**one_record(), "encoding": "latin1"}, ["encoding", "latin1"]),
    ("encoding-null", {**one_record(), "encoding": None}, ["encoding"]),
    ("producer-id-string", {**one_record(), "producer_id": "5"}, ["producer_id"]),
    ("producer-id-below-minus-one", {**one_record(), "producer_id": -2}, ["producer_id", "-2"]),
    ("producer-id-over-int64", {**one_record(), "producer_id": 2**63}, ["producer_id"]),
    ("producer-epoch-over-int16", {**one_record(), "producer_id": 5, "producer_epoch": 2**15}, ["producer_epoch"]),
    ("base-sequence-string", {"partitions": [part(base_sequence="0")]}, ["base_sequence"]),
    ("base-sequence-below-minus-one", {"partitions": [part(base_sequence=-2)]}, ["base_sequence"]),
    (
        "base-sequence-minus-one-with-producer",
        {"producer_id": 5, "producer_epoch": 0, "partitions": [part(base_sequence=-1)]},
        ["base_sequence", "5"],
    ),
    (
        "base-sequence-omitted-with-producer",
        {"producer_id": 5, "producer_epoch": 0, "partitions": [part()]},
        ["base_sequence"],
    ),
    (
        "transactional-id-with-producer-id-minus-one",
        {"transactional_id": "tx-1", "producer_id": -1, "partitions": [part()]},
        ["transactional_id", "producer_id"],
    ),
    (
        "transactional-id-empty",
        {"transactional_id": "", "producer_id": 5, "producer_epoch": 0, "partitions": [part(base_sequence=0)]},
        ["transactional_id"],
    ),
    ("transactional-id-number", {"transactional_id": 7, "partitions": [part()]}, ["transactional_id"]),
    ("same-partition-twice", {"partitions": [part(), part()]}, [f"{BAD}-0", "twice"]),
    (
        "same-partition-twice-not-adjacent",
        {"partitions": [part(partition=1), part(partition=0), part(partition=1)]},
        [f"{BAD}-1"],
    ),
    (
        "invalid-base64-value",
        one_record("base64", value="not base64!"),
        ["partitions[0].records[0]", "value", "base64"],
    ),
    ("invalid-base64-missing-padding", one_record("base64", value="YQ"), ["value", "base64"]),
    ("invalid-base64-key", one_record("base64", key="***", value="YQ=="), ["key", "base64"]),
    (
        "invalid-base64-header-value",
        one_record("base64", value="YQ==", headers=[{"key": "h", "value": "?"}]),
        ["headers[0]", "header value", "base64"],
    ),
    (
        "invalid-base64-after-a-valid-partition",
        {
            "encoding": "base64",
            "partitions": [
                part(partition=0, records=[rec(value="YQ==")]),
                part(partition=1, records=[rec(value="YQ=="), rec(value="@@@@")]),
            ],
        },
        ["partitions[1].records[1]", "base64"],
    ),
    ("lone-surrogate-value", one_record(value="\ud800"), ["partitions[0].records[0]", "value", "surrogate"]),
    ("lone-surrogate-key", one_record(key="ok\udc00"), ["key", "surrogate"]),
    ("lone-surrogate-header-key", one_record(headers=[{"key": "\ud800", "value": "v"}]), ["headers[0].key"]),
    ("lone-surrogate-header-value", one_record(headers=[{"key": "k", "value": "\udfff"}]), ["header value"]),
    (
        "lone-surrogate-after-a-valid-partition",
        {
            "partitions": [
                part(partition=0, records=[rec(value="fine")]),
                part(partition=1, records=[rec(value="\ud800")]),
            ]
        },
        ["partitions[1].records[0]"],
    ),
]


@pytest.mark.parametrize(("body", "mentions"), [c[1:] for c in PRODUCE_CASES], ids=[c[0] for c in PRODUCE_CASES])
def test_produce_bad_input_is_invalid_request_and_appends_nothing(client, body, mentions):
    assert_invalid_request(send(client, "POST", "/v1/produce", body), *mentions)
    assert hws(client, BAD) == [0, 0]


def fpart(**overrides):
    return {"topic": BAD, "partition": 0, "offset": 0, **overrides}


FETCH_CASES = COMMON_BODY_CASES + [
    ("offset-string", {"partitions": [fpart(offset="0")]}, ["partitions[0].offset", "'0'"]),
    ("offset-float", {"partitions": [fpart(offset=1.5)]}, ["partitions[0].offset", "1.5"]),
    ("offset-bool", {"partitions": [fpart(offset=True)]}, ["partitions[0].offset"]),
    ("offset-null", {"partitions": [fpart(offset=None)]}, ["partitions[0].offset"]),
    ("offset-missing", {"partitions": [{"topic": BAD, "partition": 0}]}, ["partitions[0].offset"]),
    ("offset-negative", {"partitions": [fpart(offset=-1)]}, ["partitions[0].offset", "-1"]),
    ("offset-over-int64", {"partitions": [fpart(offset=2**63)]}, ["partitions[0].offset"]),
    ("partition-negative", {"partitions": [fpart(partition=-1)]}, ["partitions[0].partition"]),
    ("partition-string", {"partitions": [fpart(partition="1")]}, ["partitions[0].partition"]),
    ("topic-missing", {"partitions": [{"partition": 0, "offset": 0}]}, ["partitions[0].topic"]),
    ("topic-number", {"partitions": [fpart(topic=1)]}, ["partitions[0].topic"]),
    ("second-partition-bad", {"partitions": [fpart(), fpart(partition=1, offset=-5)]}, ["partitions[1].offset"]),
    ("max-records-zero", {"max_records": 0, "partitions": [fpart()]}, ["max_records", "0"]),
    ("max-records-10001", {"max_records": 10001, "partitions": [fpart()]}, ["max_records", "10001"]),
    ("max-records-negative", {"max_records": -1, "partitions": [fpart()]}, ["max_records"]),
    ("max-records-string", {"max_records": "10", "partitions": [fpart()]}, ["max_records"]),
    ("max-records-float", {"max_records": 2.0, "partitions": [fpart()]}, ["max_records"]),
    (
        "max-records-nan",
        Raw('{"max_records": NaN, "partitions": [{"topic": "bad", "partition": 0, "offset": 0}]}'),
        ["max_records"],
    ),
    ("max-wait-30001", {"max_wait_ms": 30001, "partitions": [fpart()]}, ["max_wait_ms", "30001"]),
    ("max-wait-negative", {"max_wait_ms": -1, "partitions": [fpart()]}, ["max_wait_ms"]),
    ("max-wait-string", {"max_wait_ms": "100", "partitions": [fpart()]}, ["max_wait_ms"]),
    (
        "isolation-unknown",
        {"isolation_level": "serializable", "partitions": [fpart()]},
        ["isolation_level", "serializable"],
    ),
    ("isolation-wrong-case", {"isolation_level": "READ_COMMITTED", "partitions": [fpart()]}, ["isolation_level"]),
    ("isolation-null", {"isolation_level": None, "partitions": [fpart()]}, ["isolation_level"]),
    ("encoding-unknown", {"encoding": "hex", "partitions": [fpart()]}, ["encoding", "hex"]),
]


@pytest.mark.parametrize(("body", "mentions"), [c[1:] for c in FETCH_CASES], ids=[c[0] for c in FETCH_CASES])
def test_fetch_bad_input_is_invalid_request(client, body, mentions):
    assert_invalid_request(send(client, "POST", "/v1/fetch", body), *mentions)


def lpart(**overrides):
    return {"topic": BAD, "partition": 0, "timestamp": -1, **overrides}


LIST_OFFSETS_CASES = COMMON_BODY_CASES + [
    ("timestamp-minus-four", {"partitions": [lpart(timestamp=-4)]}, ["partitions[0].timestamp", "-4"]),
    ("timestamp-string", {"partitions": [lpart(timestamp="latest")]}, ["partitions[0].timestamp", "latest"]),
    ("timestamp-float", {"partitions": [lpart(timestamp=1.5)]}, ["partitions[0].timestamp"]),
    ("timestamp-over-int64", {"partitions": [lpart(timestamp=2**63)]}, ["partitions[0].timestamp"]),
    ("partition-negative", {"partitions": [lpart(partition=-1)]}, ["partitions[0].partition"]),
    ("partition-missing", {"partitions": [{"topic": BAD}]}, ["partitions[0].partition"]),
    ("topic-missing", {"partitions": [{"partition": 0}]}, ["partitions[0].topic"]),
    ("isolation-unknown", {"isolation_level": "dirty", "partitions": [lpart()]}, ["isolation_level", "dirty"]),
]


@pytest.mark.parametrize(
    ("body", "mentions"), [c[1:] for c in LIST_OFFSETS_CASES], ids=[c[0] for c in LIST_OFFSETS_CASES]
)
def test_list_offsets_bad_input_is_invalid_request(client, body, mentions):
    assert_invalid_request(send(client, "POST", "/v1/offsets/list", body), *mentions)


CREATE_TOPIC_CASES = [
    ("malformed-json", Raw('{"name": "x"'), ["JSON"]),
    ("json-array", [], ["body"]),
    ("json-string", "x", ["body"]),
    ("empty-body", Raw(""), ["body"]),
    ("name-missing", {"partitions": 1}, ["name"]),
    ("name-number", {"name": 5}, ["name"]),
    ("name-null", {"name": None}, ["name"]),
    ("name-list", {"name": ["a"]}, ["name"]),
    ("partitions-string", {"name": "p-s", "partitions": "3"}, ["partitions", "'3'"]),
    ("partitions-float", {"name": "p-f", "partitions": 1.5}, ["partitions", "1.5"]),
    ("partitions-bool", {"name": "p-b", "partitions": True}, ["partitions"]),
    ("partitions-null", {"name": "p-n", "partitions": None}, ["partitions"]),
    ("config-string", {"name": "c-s", "config": "retention_ms=1"}, ["config"]),
    ("config-list", {"name": "c-l", "config": []}, ["config"]),
    ("config-number", {"name": "c-n", "config": 5}, ["config"]),
]


@pytest.mark.parametrize(
    ("body", "mentions"), [c[1:] for c in CREATE_TOPIC_CASES], ids=[c[0] for c in CREATE_TOPIC_CASES]
)
def test_create_topic_bad_input_is_invalid_request_and_creates_nothing(client, body, mentions):
    before = client.get("/v1/cluster").json()["topics"]
    assert_invalid_request(send(client, "POST", "/v1/topics", body), *mentions)
    assert client.get("/v1/cluster").json()["topics"] == before


RECORDS_CASES = [
    ("malformed-json", Raw('{"records": [}'), ["JSON"]),
    ("json-array", [{"value": "x"}], ["body"]),
    ("json-string", "x", ["body"]),
    ("empty-body", Raw(""), ["body"]),
    ("records-missing", {"partition": 0}, ["records"]),
    ("records-empty", {"partition": 0, "records": []}, ["records"]),
    ("records-null", {"partition": 0, "records": None}, ["records"]),
    ("records-object", {"partition": 0, "records": {"value": "x"}}, ["records"]),
    ("partition-negative", {"partition": -1, "records": [rec()]}, ["partition", "-1"]),
    ("partition-string", {"partition": "0", "records": [rec()]}, ["partition", "'0'"]),
    ("partition-float", {"partition": 0.5, "records": [rec()]}, ["partition"]),
    ("partition-over-int32", {"partition": 2**31, "records": [rec()]}, ["partition"]),
    ("encoding-unknown", {"encoding": "utf16", "partition": 0, "records": [rec()]}, ["encoding", "utf16"]),
    ("key-number", {"partition": 0, "records": [rec(key=1)]}, ["records[0].key"]),
    ("value-bool", {"partition": 0, "records": [rec(value=False)]}, ["records[0].value"]),
    ("timestamp-negative", {"partition": 0, "records": [rec(timestamp_ms=-7)]}, ["timestamp_ms"]),
    ("invalid-base64-value", {"encoding": "base64", "partition": 0, "records": [rec(value="!!")]}, ["value", "base64"]),
    (
        "invalid-base64-key-partition-null",
        {"encoding": "base64", "partition": None, "records": [rec(key="~~")]},
        ["key", "base64"],
    ),
    (
        "invalid-base64-second-record",
        {"encoding": "base64", "partition": 0, "records": [rec(value="YQ=="), rec(value="Y")]},
        ["records[1]", "base64"],
    ),
    ("lone-surrogate-value", {"partition": 0, "records": [rec(value="a\ud800b")]}, ["value", "surrogate"]),
    ("lone-surrogate-key-partition-null", {"partition": None, "records": [rec(key="\ud800")]}, ["key", "surrogate"]),
    ("mixed-keys-partition-null", {"partition": None, "records": [rec(key="a"), rec(key="b")]}, ["key"]),
]


@pytest.mark.parametrize(("body", "mentions"), [c[1:] for c in RECORDS_CASES], ids=[c[0] for c in RECORDS_CASES])
def test_records_endpoint_bad_input_is_invalid_request_and_appends_nothing(client, body, mentions):
    assert_invalid_request(send(client, "POST", f"/v1/topics/{BAD}/records", body), *mentions)
    assert hws(client, BAD) == [0, 0]


GET_RECORDS_CASES = [
    ("0/records?offset=-1", ["offset", "-1"]),
    ("0/records?offset=abc", ["offset", "abc"]),
    ("0/records?offset=1.5", ["offset"]),
    ("0/records?offset=9223372036854775808", ["offset"]),
    ("0/records?max_records=0", ["max_records"]),
    ("0/records?max_records=10001", ["max_records", "10001"]),
    ("0/records?max_wait_ms=30001", ["max_wait_ms", "30001"]),
    ("0/records?isolation_level=bogus", ["isolation_level", "bogus"]),
    ("0/records?encoding=hex", ["encoding", "hex"]),
    ("-1/records", ["partition", "-1"]),
    ("x/records", ["partition", "x"]),
    ("2147483648/records", ["partition"]),
]


@pytest.mark.parametrize(("path", "mentions"), GET_RECORDS_CASES, ids=[c[0] for c in GET_RECORDS_CASES])
def test_get_records_bad_parameters_are_invalid_request(client, path, mentions):
    assert_invalid_request(client.get(f"/v1/topics/{BAD}/partitions/{path}"), *mentions)


# ---- unparseable bodies: still 400, and the message still says what was wrong


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        (b'{"partitions": [{"topic": "bad", "partition": 0, "records": [{"value": "\xff\xfe"}]}]}', r"UTF-8|utf-8"),
        (
            b'{"producer_id": 1' + b"1" * 5000 + b', "partitions": []}',
            r"producer_id|digits|integer|too (long|large|big)",
        ),
        (b"[" * 100_000 + b"]" * 100_000, r"JSON|nest|deep"),
    ],
    ids=["not-utf8", "5000-digit-integer", "nested-100000-deep"],
)
def test_unparseable_body_message_says_what_was_wrong(client, content, pattern):
    response = client.post("/v1/produce", content=content, headers={"content-type": "application/json"})
    error = assert_invalid_request(response)
    assert re.search(pattern, error["message"]), error["message"]
    assert hws(client, BAD) == [0, 0]


def test_body_declared_as_form_is_read_as_json(client):
    # curl -d sends application/x-www-form-urlencoded; the contract has no other body format.
    response = client.post(
        "/v1/fetch",
        content=b'{"partitions": [{"topic": "bad", "partition": 0, "offset": -1}]}',
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert_invalid_request(response, "offset")


# ---- more specific codes


def test_producer_id_never_issued_is_409_unknown_producer_id_and_appends_nothing(client):
    body = {
        "producer_id": 5,
        "producer_epoch": 0,
        "partitions": [part(partition=0, base_sequence=0), part(partition=1, base_sequence=0)],
    }
    error = assert_error(send(client, "POST", "/v1/produce", body), 409, "UNKNOWN_PRODUCER_ID", "5")
    assert error["retriable"] is False
    assert hws(client, BAD) == [0, 0]


def test_unknown_producer_id_on_unknown_topic_is_still_request_level(client):
    body = {
        "producer_id": 123456,
        "producer_epoch": 0,
        "partitions": [{"topic": "never-made", "partition": 0, "base_sequence": 0, "records": [rec()]}],
    }
    assert_error(send(client, "POST", "/v1/produce", body), 409, "UNKNOWN_PRODUCER_ID", "123456")


def _topic_with_records(client, name, count):
    response = client.post("/v1/topics", json={"name": name, "partitions": 2})
    assert response.status_code == 201
    response = client.post(f"/v1/topics/{name}/records", json={"partition": 0, "records": [rec()] * count})
    assert response.status_code == 200


def test_get_records_past_high_watermark_is_416_offset_out_of_range(client):
    _topic_with_records(client, "oor-get", 3)
    assert client.get("/v1/topics/oor-get/partitions/0/records", params={"offset": 3}).status_code == 200
    error = assert_error(
        client.get("/v1/topics/oor-get/partitions/0/records", params={"offset": 4}),
        416,
        "OFFSET_OUT_OF_RANGE",
        "4",
        "3",
    )
    assert error["retriable"] is False
    assert_error(
        client.get("/v1/topics/oor-get/partitions/1/records", params={"offset": 1}), 416, "OFFSET_OUT_OF_RANGE"
    )


def test_fetch_past_high_watermark_is_partition_level_with_watermarks(client):
    _topic_with_records(client, "oor-fetch", 3)
    response = send(
        client,
        "POST",
        "/v1/fetch",
        {
            "partitions": [
                {"topic": "oor-fetch", "partition": 0, "offset": 9},
                {"topic": "oor-fetch", "partition": 1, "offset": 0},
                {"topic": "oor-fetch", "partition": 0, "offset": 2**63 - 1},
            ]
        },
    )
    assert response.status_code == 200, response.text
    out, fine, far = response.json()["partitions"]
    assert out["error"]["code"] == "OFFSET_OUT_OF_RANGE"
    assert out["error"]["retriable"] is False
    assert "9" in out["error"]["message"]
    assert (out["high_watermark"], out["log_start_offset"], out["last_stable_offset"]) == (3, 0, 3)
    assert out["records"] == []
    assert fine["error"] is None and fine["records"] == [] and fine["high_watermark"] == 0
    assert far["error"]["code"] == "OFFSET_OUT_OF_RANGE" and far["high_watermark"] == 3


def test_fetch_past_high_watermark_with_long_poll_answers_at_once(client):
    _topic_with_records(client, "oor-wait", 1)
    started = time.monotonic()
    response = send(
        client,
        "POST",
        "/v1/fetch",
        {"max_wait_ms": 5000, "partitions": [{"topic": "oor-wait", "partition": 0, "offset": 5}]},
    )
    assert response.json()["partitions"][0]["error"]["code"] == "OFFSET_OUT_OF_RANGE"
    assert time.monotonic() - started < 4


def tiny_record_of(size_bytes):
    return rec(value="é" * (size_bytes // 2) + "a" * (size_bytes % 2))


def test_record_at_max_message_bytes_is_accepted_counting_utf8_bytes(client):
    before = hws(client, TINY)
    # 5 characters, 10 bytes: at the limit.
    response = send(client, "POST", f"/v1/topics/{TINY}/records", {"partition": 1, "records": [rec(value="ééééé")]})
    assert response.status_code == 200, response.text
    assert hws(client, TINY) == [before[0], before[1] + 1]


def test_record_over_max_message_bytes_on_records_endpoint_is_413_and_appends_nothing(client):
    before = hws(client, TINY)
    # 6 characters but 12 bytes; the second record is too large, so nothing of the request is written.
    body = {"partition": 1, "records": [rec(value="ok"), rec(value="éééééé")]}
    error = assert_error(
        send(client, "POST", f"/v1/topics/{TINY}/records", body), 413, "RECORD_TOO_LARGE", "12", str(TINY_MAX)
    )
    assert error["retriable"] is False
    assert hws(client, TINY) == before


@pytest.mark.parametrize(
    "record",
    [
        rec(key="abcde", value="fghijk"),  # 5 + 6
        rec(key=None, value="abcdefgh", headers=[{"key": "hk", "value": "v"}]),  # 8 + 2 + 1
        rec(value=None, headers=[{"key": "h" * 11, "value": None}]),  # header key alone
        rec(value="abcdefghi", headers=[{"key": "", "value": "😀"}]),  # 9 + 4
    ],
    ids=["key-plus-value", "value-plus-header", "header-key", "emoji-header-value"],
)
def test_max_message_bytes_counts_key_value_and_headers(client, record):
    before = hws(client, TINY)
    assert_error(
        send(client, "POST", f"/v1/topics/{TINY}/records", {"partition": 0, "records": [record]}),
        413,
        "RECORD_TOO_LARGE",
    )
    assert hws(client, TINY) == before


def test_max_message_bytes_counts_decoded_bytes_for_base64(client):
    before = hws(client, TINY)
    ten = base64.b64encode(bytes(range(10))).decode()  # 16 characters of base64, 10 bytes
    eleven = base64.b64encode(bytes(range(11))).decode()
    ok = send(
        client,
        "POST",
        f"/v1/topics/{TINY}/records",
        {"encoding": "base64", "partition": 0, "records": [rec(value=ten)]},
    )
    assert ok.status_code == 200, ok.text
    assert_error(
        send(
            client,
            "POST",
            f"/v1/topics/{TINY}/records",
            {"encoding": "base64", "partition": 0, "records": [rec(value=eleven)]},
        ),
        413,
        "RECORD_TOO_LARGE",
        "11",
    )
    assert hws(client, TINY) == [before[0] + 1, before[1]]


def test_record_too_large_in_produce_is_partition_level(client):
    before = hws(client, TINY)
    response = send(
        client,
        "POST",
        "/v1/produce",
        {
            "partitions": [
                {"topic": TINY, "partition": 0, "records": [rec(value="small")]},
                {"topic": TINY, "partition": 1, "records": [rec(value="fits"), rec(value="x" * (TINY_MAX + 1))]},
            ]
        },
    )
    assert response.status_code == 200, response.text
    ok, too_large = response.json()["partitions"]
    assert ok["error"] is None and ok["base_offset"] == before[0]
    assert too_large["error"]["code"] == "RECORD_TOO_LARGE"
    assert too_large["error"]["retriable"] is False
    assert str(TINY_MAX + 1) in too_large["error"]["message"]
    assert (too_large["base_offset"], too_large["last_offset"], too_large["duplicate"]) == (None, None, False)
    assert hws(client, TINY) == [before[0] + 1, before[1]]


# ---- message_timestamp_before_max_ms, message_timestamp_after_max_ms (Kafka's KIP-937)


def now_ms() -> int:
    return int(time.time() * 1000)


def test_record_out_of_the_timestamp_bounds_on_records_endpoint_is_400_invalid_record_and_appends_nothing(client):
    before = hws(client, BOUNDED)
    ahead = now_ms() + HOUR_MS
    body = {"partition": 1, "records": [rec(timestamp_ms=now_ms()), rec(timestamp_ms=ahead), rec()]}
    assert_error(
        send(client, "POST", f"/v1/topics/{BOUNDED}/records", body),
        400,
        "INVALID_RECORD",
        f"record 1 of the batch to {BOUNDED}-1 has timestamp {ahead}",
        "after the server's clock",
        f"message_timestamp_after_max_ms ({BOUND_MS})",
        "nothing of the batch was written",
    )
    assert hws(client, BOUNDED) == before
    # Within the bounds, and without a timestamp (the server's clock): written.
    body = {"partition": 1, "records": [rec(timestamp_ms=now_ms() - BOUND_MS // 2), rec()]}
    assert send(client, "POST", f"/v1/topics/{BOUNDED}/records", body).status_code == 200
    assert hws(client, BOUNDED) == [before[0], before[1] + 2]


def test_timestamp_out_of_bounds_in_produce_is_partition_level(client):
    before = hws(client, BOUNDED)
    old = now_ms() - HOUR_MS
    response = send(
        client,
        "POST",
        "/v1/produce",
        {
            "partitions": [
                {"topic": BOUNDED, "partition": 0, "records": [rec(), rec(timestamp_ms=now_ms())]},
                {"topic": BOUNDED, "partition": 1, "records": [rec(timestamp_ms=now_ms()), rec(timestamp_ms=old)]},
            ]
        },
    )
    assert response.status_code == 200, response.text
    ok, refused = response.json()["partitions"]
    assert ok["error"] is None and ok["base_offset"] == before[0]
    assert refused["error"]["code"] == "INVALID_RECORD" and refused["error"]["retriable"] is False
    message = refused["error"]["message"]
    assert f"record 1 of the batch to {BOUNDED}-1 has timestamp {old}" in message
    assert "before the server's clock" in message and f"message_timestamp_before_max_ms ({BOUND_MS})" in message
    assert (refused["base_offset"], refused["last_offset"], refused["duplicate"]) == (None, None, False)
    assert hws(client, BOUNDED) == [before[0] + 2, before[1]]


def test_a_refused_transactional_batch_takes_no_sequence_and_leaves_its_transaction_whole(client):
    """The refused batch is written nowhere: the producer's next batch takes its sequence, and the
    transaction commits only what was accepted."""
    before = hws(client, BOUNDED)
    ids = send(client, "POST", "/v1/producers/init", {"transactional_id": "bounded-txn"}).json()
    ids["transactional_id"] = "bounded-txn"

    def produce(records):
        partitions = [{"topic": BOUNDED, "partition": 0, "base_sequence": 0, "records": records}]
        response = send(client, "POST", "/v1/produce", {**ids, "partitions": partitions})
        assert response.status_code == 200, response.text
        return response.json()["partitions"][0]

    assert produce([rec(value="in"), rec(value="ahead", timestamp_ms=now_ms() + HOUR_MS)])["error"]["code"] == (
        "INVALID_RECORD"
    )
    written = produce([rec(value="a"), rec(value="b", timestamp_ms=now_ms())])
    assert (written["error"], written["base_offset"], written["duplicate"]) == (None, before[0], False)
    ended = send(client, "POST", "/v1/txn/end", {**ids, "committed": True})
    assert ended.status_code == 200, ended.text
    fetched = send(
        client,
        "POST",
        "/v1/fetch",
        {
            "isolation_level": "read_committed",
            "partitions": [{"topic": BOUNDED, "partition": 0, "offset": before[0]}],
        },
    ).json()["partitions"][0]
    assert [record["value"] for record in fetched["records"]] == ["a", "b"]
    assert hws(client, BOUNDED)[0] == before[0] + 3  # the two records and the commit marker


# ---- request limits (max_records_per_request, max_request_bytes)


def test_more_records_than_max_records_per_request_in_produce_is_invalid_request(limited_client):
    before = hws(limited_client, LIMITED)
    body = {
        "partitions": [
            {"topic": LIMITED, "partition": 0, "records": [rec()] * 2},
            {"topic": LIMITED, "partition": 1, "records": [rec()] * 2},
        ]
    }
    assert_invalid_request(send(limited_client, "POST", "/v1/produce", body), "4", "3")
    assert hws(limited_client, LIMITED) == before


def test_max_records_per_request_itself_is_allowed(limited_client):
    before = hws(limited_client, LIMITED)
    body = {
        "partitions": [
            {"topic": LIMITED, "partition": 0, "records": [rec()] * 2},
            {"topic": LIMITED, "partition": 1, "records": [rec()]},
        ]
    }
    assert send(limited_client, "POST", "/v1/produce", body).status_code == 200
    assert hws(limited_client, LIMITED) == [before[0] + 2, before[1] + 1]


def test_more_records_than_max_records_per_request_on_records_endpoint_is_invalid_request(limited_client):
    before = hws(limited_client, LIMITED)
    body = {"partition": 0, "records": [rec()] * 4}
    assert_invalid_request(send(limited_client, "POST", f"/v1/topics/{LIMITED}/records", body), "4", "3")
    assert hws(limited_client, LIMITED) == before


def _padded_produce_body(total_bytes):
    skeleton = {"partitions": [{"topic": LIMITED, "partition": 0, "records": [{"value": ""}]}]}
    padding = total_bytes - len(json.dumps(skeleton).encode())
    skeleton["partitions"][0]["records"][0]["value"] = "x" * padding
    body = json.dumps(skeleton).encode()
    assert len(body) == total_bytes
    return body


def test_body_at_max_request_bytes_is_accepted(limited_client):
    before = hws(limited_client, LIMITED)
    response = limited_client.post(
        "/v1/produce", content=_padded_produce_body(1024), headers={"content-type": "application/json"}
    )
    assert response.status_code == 200, response.text
    assert hws(limited_client, LIMITED) == [before[0] + 1, before[1]]


def test_body_over_max_request_bytes_is_invalid_request(limited_client):
    before = hws(limited_client, LIMITED)
    response = limited_client.post(
        "/v1/produce", content=_padded_produce_body(1025), headers={"content-type": "application/json"}
    )
    assert_invalid_request(response, "max_request_bytes", "1024")
    assert hws(limited_client, LIMITED) == before


def test_chunked_body_over_max_request_bytes_is_invalid_request_naming_the_limit(limited_client):
    before = hws(limited_client, LIMITED)
    body = _padded_produce_body(4000)

    def chunks():  # no Content-Length: the server must count the streamed bytes
        for start in range(0, len(body), 500):
            yield body[start : start + 500]

    response = limited_client.post("/v1/produce", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in response.request.headers
    assert_invalid_request(response, "max_request_bytes")
    assert hws(limited_client, LIMITED) == before


# ---- never a 500: names that cannot be stored in PostgreSQL text


def assert_rejected_cleanly(response, *, allow_partition_level=False):
    """A 4xx in the contract's format, or a 200 whose partition entries carry the error."""
    assert response.status_code != 500, response.text
    if response.status_code == 200 and allow_partition_level:
        entries = response.json()["partitions"]
        assert all(
            entry["error"]["code"] in ("UNKNOWN_TOPIC_OR_PARTITION", "INVALID_TOPIC_EXCEPTION") for entry in entries
        ), entries
        return
    assert response.status_code in (400, 404), response.text
    error = response.json()["error"]
    assert error["code"] in ("INVALID_REQUEST", "INVALID_TOPIC_EXCEPTION", "UNKNOWN_TOPIC_OR_PARTITION")
    assert "Traceback" not in response.text


@pytest.mark.parametrize("topic", ["nul\u0000byte", "lone\ud800surrogate"], ids=["nul", "lone-surrogate"])
@pytest.mark.parametrize("endpoint", ["produce", "fetch", "offsets-list"])
def test_unstorable_topic_name_in_body_is_not_a_server_error(client, endpoint, topic):
    path, body = {
        "produce": ("/v1/produce", {"partitions": [{"topic": topic, "partition": 0, "records": [rec()]}]}),
        "fetch": ("/v1/fetch", {"partitions": [{"topic": topic, "partition": 0, "offset": 0}]}),
        "offsets-list": ("/v1/offsets/list", {"partitions": [{"topic": topic, "partition": 0, "timestamp": -1}]}),
    }[endpoint]
    assert_rejected_cleanly(send(client, "POST", path, body), allow_partition_level=True)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/topics/nul%00byte"),
        ("DELETE", "/v1/topics/nul%00byte"),
        ("GET", "/v1/topics/nul%00byte/partitions/0/records"),
        ("POST", "/v1/topics/nul%00byte/records"),
    ],
)
def test_unstorable_topic_name_in_path_is_not_a_server_error(client, method, path):
    kwargs = {"json": {"partition": 0, "records": [rec()]}} if method == "POST" else {}
    assert_rejected_cleanly(client.request(method, path, **kwargs))


def test_unstorable_topic_name_in_create_is_invalid_topic_exception(client):
    for name in ("nul\u0000byte", "lone\ud800"):
        assert_error(send(client, "POST", "/v1/topics", {"name": name}), 400, "INVALID_TOPIC_EXCEPTION")


def test_unstorable_transactional_id_in_produce_is_not_a_server_error(client):
    # A transactional id that can never have been initialized: INVALID_PRODUCER_ID_MAPPING (docs/api.md: an
    # unknown transactional id) or INVALID_REQUEST, never a 500, and nothing appended.
    body = {
        "transactional_id": "tx\u0000nul",
        "producer_id": 5,
        "producer_epoch": 0,
        "partitions": [part(base_sequence=0)],
    }
    response = send(client, "POST", "/v1/produce", body)
    assert response.status_code != 500, response.text
    assert (response.status_code, response.json()["error"]["code"]) in (
        (400, "INVALID_REQUEST"),
        (409, "INVALID_PRODUCER_ID_MAPPING"),
    )
    assert hws(client, BAD) == [0, 0]
