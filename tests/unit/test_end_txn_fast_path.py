"""EndTxn's fast path (app/api/transactions.parse_end_txn_body) against the general path (the pydantic
schema FastAPI validates with), with no I/O: the fast path may only take bodies the general path
accepts, with the same values. What it declines goes to the general path, so the 400 messages are
that path's (tests/api/test_bad_input.py checks them over HTTP)."""

from __future__ import annotations

import json

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from app.api import schemas
from app.api.transactions import parse_end_txn_body


def general_path(body: bytes) -> schemas.EndTxnRequest | None:
    try:
        return schemas.EndTxnRequest.model_validate(json.loads(body))
    except (ValueError, ValidationError):
        return None


def assert_same(body: bytes) -> bool:
    """Asserts the fast path agrees with the general path; returns whether it took the body."""
    fast = parse_end_txn_body(body)
    if fast is None:
        return False
    general = general_path(body)
    assert general is not None, f"the fast path took a body the general path refuses: {body[:300]!r}"
    assert (fast.transactional_id, fast.producer_id, fast.producer_epoch, fast.committed) == (
        general.transactional_id,
        general.producer_id,
        general.producer_epoch,
        general.committed,
    )
    return True


VALID = {"transactional_id": "tx-1", "producer_id": 7, "producer_epoch": 3, "committed": True}


def test_a_plain_body_takes_the_fast_path():
    assert assert_same(orjson.dumps(VALID))
    assert assert_same(orjson.dumps({**VALID, "committed": False, "producer_id": 2**63 - 1, "producer_epoch": 32767}))
    assert assert_same(orjson.dumps({**VALID, "transactional_id": "é" * 512}))  # 1024 bytes exactly


def test_what_the_schema_refuses_goes_to_the_general_path():
    refused = [
        b"not json",
        b"[]",
        orjson.dumps({k: v for k, v in VALID.items() if k != "committed"}),
        orjson.dumps({**VALID, "committed": 1}),  # strict: no int for a bool
        orjson.dumps({**VALID, "committed": "true"}),
        orjson.dumps({**VALID, "producer_id": -1}),
        orjson.dumps({**VALID, "producer_id": 2**63}),
        orjson.dumps({**VALID, "producer_id": 7.0}),
        orjson.dumps({**VALID, "producer_id": True}),
        orjson.dumps({**VALID, "producer_epoch": 32768}),
        orjson.dumps({**VALID, "transactional_id": ""}),
        orjson.dumps({**VALID, "transactional_id": None}),
        orjson.dumps({**VALID, "transactional_id": "é" * 513}),  # 1026 bytes
        b'{"transactional_id": "\\ud800", "producer_id": 1, "producer_epoch": 0, "committed": true}',
    ]
    for body in refused:
        assert parse_end_txn_body(body) is None, body
        assert general_path(body) is None, f"the schema should refuse {body!r} too"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=6,
)
field_values = {
    "transactional_id": st.text(max_size=4) | json_values,
    "producer_id": st.integers(-2, 2**63 + 1) | json_values,
    "producer_epoch": st.integers(-2, 2**15 + 1) | json_values,
    "committed": st.booleans() | json_values,
}


@settings(max_examples=400, deadline=None)
@given(st.fixed_dictionaries({}, optional=field_values))
def test_the_fast_path_never_takes_what_the_schema_refuses(body):
    assert_same(json.dumps(body).encode())
