"""The fast path of POST /v1/produce (app/api/produce_fast_path.py) against the general path (the
pydantic schema, then record_codec.encode_batch), with no I/O: the fast path may only take bodies the
general path accepts, and must store their records byte for byte as it would. Whatever it declines
goes to the general path, so the 400 messages are the general path's (tests/api/test_bad_input.py
checks them over HTTP)."""

from __future__ import annotations

import base64
import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from app.api import schemas
from app.api.produce_fast_path import parse_produce_body
from app.errors import BrokerError
from app.settings import Settings
from app.storage.log import record_codec

NOW_MS = 1_700_000_000_000
SETTINGS = Settings(database_url="postgresql://unused/db")


def general_path(body: bytes):
    """What the route FastAPI builds does with this body: (request, encoded batches) or None when it
    answers 400. FastAPI parses with the standard library's json."""
    try:
        request = schemas.ProduceRequest.model_validate(json.loads(body))
        return request, [
            record_codec.encode_batch(p.records, request.encoding, NOW_MS, f"partitions[{i}].records")
            for i, p in enumerate(request.partitions)
        ]
    except (ValueError, ValidationError, BrokerError):  # malformed JSON, the schema, encode_batch's checks
        return None


def assert_same(body: bytes) -> bool:
    """Asserts the fast path agrees with the general path; returns whether it took the body."""
    fast = parse_produce_body(body, SETTINGS)
    if fast is None:
        return False
    general = general_path(body)
    assert general is not None, f"the fast path took a body the general path refuses: {body[:300]!r}"
    request, batches = general
    assert (fast.transactional_id, fast.producer_id, fast.producer_epoch, fast.encoding) == (
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
        request.encoding,
    )
    assert len(fast.partitions) == len(request.partitions)
    for entry, expected_entry, expected in zip(fast.partitions, request.partitions, batches):
        assert (entry.topic, entry.partition, entry.base_sequence) == (
            expected_entry.topic,
            expected_entry.partition,
            expected_entry.base_sequence,
        )
        got = entry.encoded
        assert (got.record_count, got.size_bytes, got.largest_record_bytes) == (
            expected.record_count,
            expected.size_bytes,
            expected.largest_record_bytes,
        )
        # The timestamps a topic's bounds check: the request's own, not the clock's (either path's reading).
        assert got.producer_timestamps == expected.producer_timestamps
        # Stored alike, but for the append time given to records without a timestamp (each path reads the clock).
        got_stored, expected_stored = orjson.loads(got.payload), orjson.loads(expected.payload)
        assert [s[1:] for s in got_stored] == [s[1:] for s in expected_stored]
        assert [s[0] for s, r in zip(got_stored, expected_entry.records) if r.timestamp_ms is not None] == [
            r.timestamp_ms for r in expected_entry.records if r.timestamp_ms is not None
        ]
    return True


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


def partition(**fields) -> dict:
    return {"topic": "t", "partition": 0, **fields}


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


TAKEN = [
    body(partitions=[partition(records=[{"value": "v"}])]),
    body(producer_id=-1, producer_epoch=-1, partitions=[partition(records=[{"key": None, "value": "x" * 100}] * 100)]),
    body(
        transactional_id="app",
        producer_id=7,
        producer_epoch=3,
        partitions=[
            partition(
                base_sequence=5,
                records=[
                    {
                        "key": "k",
                        "value": "é€😀",
                        "timestamp_ms": 5,
                        "headers": [{"key": "h", "value": None}, {"key": "ü"}],
                    }
                ],
            )
        ],
    ),
    body(
        encoding="base64",
        partitions=[
            partition(
                records=[
                    {
                        "key": b64(b"\xff\x00"),
                        "value": b64("é".encode()),
                        "headers": [{"key": "h", "value": b64(b"\x80")}],
                    }
                ]
            )
        ],
    ),
    body(
        encoding="base64",
        partitions=[
            partition(records=[{"value": b64(b"plain text")}]),
            partition(partition=1, records=[{"value": None}]),
        ],
    ),
    body(partitions=[partition(records=[{"value": "v", "unknown": 1}])], unknown_field=True),
    body(partitions=[partition(records=[{"value": "v", "timestamp_ms": 2**63 - 1}])]),
]

DECLINED = [
    b"",
    b"[]",
    b"{",
    b"null",
    body(),
    body(partitions=[]),
    body(partitions=[partition(records=[])]),
    body(partitions=[partition(records=[{"value": 1}])]),
    body(partitions=[partition(records=[{"value": "v", "timestamp_ms": -1}])]),
    body(partitions=[partition(records=[{"value": "v", "timestamp_ms": 2**63}])]),
    body(partitions=[partition(records=[{"value": "v", "timestamp_ms": True}])]),
    body(partitions=[partition(records=[{"value": "v", "timestamp_ms": 1.0}])]),
    body(partitions=[partition(records=[{"value": "v", "headers": None}])]),
    body(partitions=[partition(records=[{"value": "v", "headers": [{"value": "no key"}]}])]),
    body(partitions=[partition(records=[{"value": "v", "headers": [{"key": "k" * 1_000_001}]}])]),
    body(partitions=[partition(records=["not an object"])]),
    body(partitions=[partition(partition=-1, records=[{"value": "v"}])]),
    body(partitions=[partition(partition=True, records=[{"value": "v"}])]),
    body(partitions=[partition(base_sequence=-2, records=[{"value": "v"}])]),
    body(partitions=[{"partition": 0, "records": [{"value": "v"}]}]),
    body(producer_id="1", partitions=[partition(records=[{"value": "v"}])]),
    body(producer_epoch=2**15, partitions=[partition(records=[{"value": "v"}])]),
    body(transactional_id="", partitions=[partition(records=[{"value": "v"}])]),
    body(encoding="latin1", partitions=[partition(records=[{"value": "v"}])]),
    body(encoding="base64", partitions=[partition(records=[{"value": "not base64!"}])]),
    body(encoding="base64", partitions=[partition(records=[{"value": "YQ"}])]),  # no padding
    b'{"partitions": [{"topic": "t", "partition": 0, "records": [{"value": "\\ud800"}]}]}',  # lone surrogate
]


@pytest.mark.parametrize("raw", TAKEN)
def test_takes_valid_bodies_and_encodes_them_as_the_general_path(raw):
    assert assert_same(raw)


@pytest.mark.parametrize("raw", DECLINED)
def test_declines_whatever_is_not_plainly_valid(raw):
    assert parse_produce_body(raw, SETTINGS) is None


@pytest.mark.parametrize(
    ("limits", "listed", "refusal"),
    [
        ({"max_partitions_per_request": 2}, [[{"value": "v"}]] * 3, "names 3 partitions: expected at most 2"),
        ({"max_records_per_request": 3}, [[{"value": "v"}] * 2] * 2, "carries 4 records: expected at most 3"),
        (
            {"max_record_headers_per_request": 3},
            [[{"headers": [{"key": "k"}] * 2}], [{"headers": [{"key": "k"}] * 2}]],
            "carries 4 record headers: expected at most 3",
        ),
    ],
)
def test_refuses_a_body_over_the_count_bounds_as_the_general_path_does(limits, listed, refusal):
    """Refused by the fast path itself, with the message of the general path (the same function
    checks both), so that such a body is not parsed a second time there."""
    raw = body(partitions=[partition(partition=i, records=records) for i, records in enumerate(listed)])
    with pytest.raises(BrokerError, match=refusal):
        parse_produce_body(raw, Settings(database_url="postgresql://unused/db", **limits))
    assert parse_produce_body(raw, SETTINGS) is not None


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
texts = st.none() | st.text(max_size=12) | st.sampled_from([b64(b"\xff\xfe"), b64(b"ok"), "", "=="]) | json_values
records = st.fixed_dictionaries(
    {},
    optional={
        "key": texts,
        "value": texts,
        "timestamp_ms": st.none() | st.integers(-5, 2**64) | json_values,
        "headers": st.lists(
            st.fixed_dictionaries({}, optional={"key": texts, "value": texts}) | json_values, max_size=2
        )
        | json_values,
    },
)
partitions = st.fixed_dictionaries(
    {},
    optional={
        "topic": st.sampled_from(["t", "u"]) | json_values,
        "partition": st.integers(-2, 3) | json_values,
        "base_sequence": st.integers(-3, 2**31) | json_values,
        "records": st.lists(records | json_values, max_size=3),
    },
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "transactional_id": st.none() | st.text(max_size=4) | json_values,
        "producer_id": st.integers(-2, 2**64) | json_values,
        "producer_epoch": st.integers(-2, 2**15) | json_values,
        "encoding": st.sampled_from(["utf8", "base64", "hex"]) | json_values,
        "partitions": st.lists(partitions | json_values, max_size=3) | json_values,
    },
)


@settings(max_examples=400, deadline=None)
@given(bodies)
def test_never_takes_a_body_the_general_path_refuses(fields):
    try:
        raw = json.dumps(fields).encode()
    except (TypeError, ValueError):
        return
    assert_same(raw)


# Bodies of the right shape, with values near and past the bounds: the fast path takes many of these.
plain_texts = st.none() | st.text(max_size=12) | st.sampled_from([b64(b"\xff\xfe"), b64("é".encode()), b64(b"ok"), ""])
shaped_records = st.fixed_dictionaries(
    {},
    optional={
        "key": plain_texts,
        "value": plain_texts,
        "timestamp_ms": st.none() | st.integers(-1, 2**63),
        "headers": st.lists(
            st.fixed_dictionaries({"key": st.text(max_size=4)}, optional={"value": plain_texts}), max_size=2
        ),
    },
)
shaped_bodies = st.fixed_dictionaries(
    {
        "partitions": st.lists(
            st.fixed_dictionaries(
                {
                    "topic": st.sampled_from(["t", "u"]),
                    "partition": st.integers(-1, 3),
                    "records": st.lists(shaped_records, min_size=1, max_size=3),
                },
                optional={"base_sequence": st.integers(-2, 5)},
            ),
            min_size=1,
            max_size=3,
        )
    },
    optional={
        "transactional_id": st.none() | st.text(max_size=3),
        "producer_id": st.integers(-2, 2**63),
        "producer_epoch": st.integers(-2, 2**15),
        "encoding": st.sampled_from(["utf8", "base64"]),
    },
)


@settings(max_examples=300, deadline=None)
@given(shaped_bodies)
def test_takes_what_the_general_path_accepts_and_encodes_it_alike(fields):
    assert_same(json.dumps(fields).encode())
