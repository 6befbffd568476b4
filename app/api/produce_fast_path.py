"""The fast path of POST /v1/produce: the body parsed with orjson, checked and encoded in one pass.

Through FastAPI, a produce request costs more server CPU than the append itself: the body parsed by
the standard library, every record instantiated as a pydantic model, the dependencies solved, then
every record read back to be encoded. Here a body is parsed with orjson and checked field by field
while its records are encoded (encode_json_records); the route (app/api/produce.py)
then calls its dependencies (readiness, the principal) directly.

It says yes, or refuses a body over the request's count bounds (partitions, records, headers:
request_limits.check_listed_entries, which the general path runs on its own parse, so the message is
the same) before it encodes a record of it, not to parse such a body twice. A body it does not find
plainly valid (not JSON to orjson — which also refuses lone surrogates —, a wrong type, a bound, bad
base64) goes to the route FastAPI built from the schema, so every 400 INVALID_REQUEST keeps the
message that path gives.
Bounds are those of schemas.ProduceRequest; tests/unit/test_produce_fast_path.py holds the two paths to
the same answers.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.api.request_limits import check_listed_entries
from app.api.schemas import INT16_MAX, INT32_MAX, INT64_MAX, plain_identifier, plain_int_in, plain_json_object
from app.clock import now_ms
from app.coordinator.produce import (
    ENCODINGS,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    UTF8,
    PartitionRecords,
    encode_json_records,
)
from app.settings import Settings

DEFAULT_ENCODING = UTF8


@dataclass(frozen=True, slots=True)
class ParsedProduce:
    transactional_id: str | None
    producer_id: int
    producer_epoch: int
    encoding: str
    partitions: list[PartitionRecords]


def parse_produce_body(body: bytes, settings: Settings) -> ParsedProduce | None:
    """The request, its records encoded, or None: take the general path. Raises the refusal of a body
    over the request's count bounds."""
    parsed = plain_json_object(body)
    if parsed is None:
        return None
    check_listed_entries(settings, parsed)
    transactional_id = parsed.get("transactional_id")
    producer_id = parsed.get("producer_id", NO_PRODUCER_ID)
    producer_epoch = parsed.get("producer_epoch", NO_PRODUCER_EPOCH)
    encoding = parsed.get("encoding", DEFAULT_ENCODING)
    partitions = parsed.get("partitions")
    if not (transactional_id is None or plain_identifier(transactional_id)):
        return None
    if not (
        plain_int_in(producer_id, NO_PRODUCER_ID, INT64_MAX)
        and plain_int_in(producer_epoch, NO_PRODUCER_EPOCH, INT16_MAX)
        and encoding in ENCODINGS
        and partitions.__class__ is list
        and partitions
    ):
        return None
    appended_ms = now_ms()
    entries = []
    for entry in partitions:
        if entry.__class__ is not dict:
            return None
        topic, partition = entry.get("topic"), entry.get("partition")
        base_sequence, records = entry.get("base_sequence", NO_SEQUENCE), entry.get("records")
        if not (
            topic.__class__ is str
            and plain_int_in(partition, 0, INT32_MAX)
            and plain_int_in(base_sequence, NO_SEQUENCE, INT32_MAX)
            and records.__class__ is list
        ):
            return None
        encoded = encode_json_records(records, encoding, appended_ms)
        if encoded is None:
            return None
        entries.append(PartitionRecords(topic, partition, base_sequence, records, encoded))
    return ParsedProduce(transactional_id, producer_id, producer_epoch, encoding, entries)
