"""How the records of one batch are stored, and how they go back to the wire.

A batch's `records` column (its payload) has one of two forms, told apart by its first byte, so
that both live in one column without a flag:

- JSON, first byte `[`: the JSON array (orjson) of its records, each
  `[timestamp_ms, key, value, headers, form]` with headers as `[[key, value], ...]`:
  - form TEXT (0): key, value and header values are the text whose UTF-8 encoding is the bytes;
  - form BASE64 (1): they are base64 of arbitrary bytes (used only when some field is not UTF-8).
  What HTTP's produce writes, what the server writes itself, and what compaction rewrites.
- RecordBatch, first byte 0x00: a Kafka RecordBatch (message format v2) as the Kafka door received
  it, in its topic's compression.type (the producer's own codec by default: batch_form.py), with its
  base offset 0 and its partition leader epoch -1 (so a read patches the
  base offset in, outside the CRC). What the Kafka door's produce writes (record_batch), so that its
  fetch answers with the stored bytes; its size_bytes is the stored batch's length.

decode_payload reads either form as the JSON form's records, so every reader but the Kafka door's
fetch (HTTP's fetch, ListOffsets, compaction, the console) deals with one form. A RecordBatch reads
as the JSON form of the same bytes: text when every field is UTF-8, else base64, so each door reads
back what the other wrote byte for byte. A compressed one is decompressed within
record_batch_codecs.MAX_RECORDS_BYTES, the bound the Kafka door produces every batch within: a row
beyond it, or one that does not parse, is corrupt (or was not written by txbroker), and its reader
gets UnreadableBatch, never a worker's memory spent on it.

A compacted batch (log_compaction.py) keeps its offsets: a record compaction removed is a `null` in
its place, so a record's offset is still the batch's base offset plus its index; readers skip nulls.
A RecordBatch that compaction takes records from is rewritten in the JSON form.

Storing text when the bytes are UTF-8 (almost always) lets a utf8 fetch hand the strings back
without decoding anything, and a utf8 produce store them without encoding anything. What goes in
comes out byte for byte in both encodings (docs/api.md, "Conventions").
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import orjson
from aiokafka.record.default_records import DefaultRecordBatch as RecordBatchReader

from app import record_batch_codecs as codecs
from app.errors import BrokerError, ErrorCode, invalid_request

UTF8 = "utf8"
BASE64 = "base64"
ENCODINGS = (UTF8, BASE64)

FORM_TEXT = 0
FORM_BASE64 = 1


class WireHeader(Protocol):
    key: str
    value: str | None


class WireRecord(Protocol):
    key: str | None
    value: str | None
    headers: Sequence[WireHeader]
    timestamp_ms: int | None


@dataclass(frozen=True, slots=True)
class TextRecord:
    """A record the server writes itself (transaction log, offset commits): a WireRecord in utf8."""

    key: str | None
    value: str | None
    headers: tuple = ()
    timestamp_ms: int | None = None


# The first byte of a JSON-form payload; a RecordBatch-form one begins with its base offset, 0.
JSON_FORM_START = ord("[")


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    payload: bytes
    record_count: int
    size_bytes: int
    largest_record_bytes: int
    first_timestamp_ms: int
    max_timestamp_ms: int
    # The indexes of its records without a key, which a compacted topic refuses (append.py).
    keyless_records: tuple[int, ...] = ()
    # A RecordBatch's records section decompressed: the bytes its producer's door read from it, the
    # bound of decompressing it again to store it in its topic's codec (batch_form.py). The JSON
    # form has no codec: 0.
    records_bytes: int = 0
    # The earliest and latest timestamps its producer gave its records: what a topic's
    # message.timestamp.before.max.ms and after.max.ms bound (append.py). None when it gave none,
    # as Kafka's bounds pass a record of NO_TIMESTAMP (-1): an HTTP record without timestamp_ms
    # (it takes the server's clock) and a Kafka record timestamped -1 are not bounded.
    producer_timestamps: tuple[int, int] | None = None
    # A RecordBatch its producer marked LogAppendTime (its attributes' timestamp-type bit), which
    # only a broker may set: refused where Kafka's LogValidator refuses it (append.py).
    marked_log_append_time: bool = False

    @property
    def is_record_batch(self) -> bool:
        """Whether the payload is in the RecordBatch form (else the JSON form)."""
        return is_record_batch(self.payload)

    @classmethod
    def record_batch(
        cls,
        payload: bytes,
        record_count: int,
        largest_record_bytes: int,
        first_timestamp_ms: int,
        max_timestamp_ms: int,
        records_bytes: int,
        keyless_records: tuple[int, ...] = (),
        producer_timestamps: tuple[int, int] | None = None,
        marked_log_append_time: bool = False,
    ) -> EncodedBatch:
        """A payload in the RecordBatch form (the module's docstring), which its producer read and
        checked: its size is the stored batch's bytes, what retention and fetches count;
        `records_bytes` its records section's once decompressed."""
        return cls(
            payload,
            record_count,
            len(payload),
            largest_record_bytes,
            first_timestamp_ms,
            max_timestamp_ms,
            keyless_records,
            records_bytes,
            producer_timestamps,
            marked_log_append_time,
        )


def _utf8_size(text: str | None) -> int:
    if text is None:
        return 0
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def decode_base64(field: str, text: str | None, where: str) -> bytes | None:
    if text is None:
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise invalid_request(
            f'{where}: {field} is not valid base64 (received {text[:40]!r}); with "encoding": '
            f'"base64" every key, value and header value must be standard base64 with padding, '
            f'or send text with "encoding": "utf8"'
        ) from None


def _as_text(raw: bytes | None) -> str | None:
    """The text of these bytes when they are valid UTF-8; raises UnicodeDecodeError otherwise."""
    return None if raw is None else raw.decode("utf-8")


def _as_base64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode("ascii")


def _check_text(field: str, text: str | None, where: str) -> None:
    # A JSON string may carry a lone surrogate (\ud800), which has no UTF-8 encoding: refuse it
    # rather than store something that cannot come back out byte for byte.
    if text is not None and not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise invalid_request(
                f"{where}: {field} is not encodable as UTF-8 (it contains a lone surrogate); send "
                f'arbitrary bytes with "encoding": "base64"'
            ) from None


def _bytes_size(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]) -> int:
    return len(key or b"") + len(value or b"") + sum(_utf8_size(k) + len(v or b"") for k, v in headers)


def _stored_from_bytes(
    ts: int, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]
) -> list:
    """A record of raw bytes in its stored form: text when every field is UTF-8, else base64."""
    try:
        return [ts, _as_text(key), _as_text(value), [[k, _as_text(v)] for k, v in headers], FORM_TEXT]
    except UnicodeDecodeError:
        return [ts, _as_base64(key), _as_base64(value), [[k, _as_base64(v)] for k, v in headers], FORM_BASE64]


@dataclass(frozen=True, slots=True)
class ByteRecord:
    """A record as a binary protocol carries it (the Kafka listener's): bytes or None, headers as
    (key, value) pairs, the timestamp in ms."""

    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] = ()


def _field_bytes(text: str | None, form: int) -> bytes | None:
    if text is None:
        return None
    return base64.b64decode(text) if form == FORM_BASE64 else text.encode("utf-8", "surrogatepass")


def byte_record(stored: list) -> ByteRecord:
    """A stored record back as bytes: what the Kafka listener puts in a RecordBatch."""
    ts, key, value, headers, form = stored
    return ByteRecord(
        ts, _field_bytes(key, form), _field_bytes(value, form), [(k, _field_bytes(v, form)) for k, v in headers]
    )


def encode_batch(records: Sequence[WireRecord], encoding: str, now_ms: int, where: str) -> EncodedBatch:
    """Validates and encodes one partition's records. Raises INVALID_REQUEST (naming `where`, e.g.
    "partitions[0].records[3]") for bad encodings or timestamps, before anything is written."""
    if encoding not in ENCODINGS:
        raise invalid_request(f"encoding {encoding!r} is not supported: expected one of {list(ENCODINGS)}")
    stored = []
    total = 0
    largest = 0
    first_ts = None
    max_ts = -1
    given: tuple[int, int] | None = None  # EncodedBatch.producer_timestamps
    for index, record in enumerate(records):
        at = f"{where}[{index}]"
        ts = now_ms if record.timestamp_ms is None else record.timestamp_ms
        if ts < 0:
            raise invalid_request(f"{at}: timestamp_ms is {ts}: expected milliseconds since the epoch, >= 0")
        if record.timestamp_ms is not None:
            given = (ts, ts) if given is None else (min(given[0], ts), max(given[1], ts))
        first_ts = ts if first_ts is None else first_ts
        max_ts = max(max_ts, ts)
        if encoding == UTF8:
            _check_text("key", record.key, at)
            _check_text("value", record.value, at)
            headers = []
            size = _utf8_size(record.key) + _utf8_size(record.value)
            for h_index, header in enumerate(record.headers):
                _check_text("header key", header.key, f"{at}.headers[{h_index}]")
                _check_text("header value", header.value, f"{at}.headers[{h_index}]")
                size += _utf8_size(header.key) + _utf8_size(header.value)
                headers.append([header.key, header.value])
            stored.append([ts, record.key, record.value, headers, FORM_TEXT])
        else:
            key = decode_base64("key", record.key, at)
            value = decode_base64("value", record.value, at)
            raw_headers = []
            for h_index, header in enumerate(record.headers):
                _check_text("header key", header.key, f"{at}.headers[{h_index}]")
                raw_headers.append(
                    (header.key, decode_base64("header value", header.value, f"{at}.headers[{h_index}]"))
                )
            size = _bytes_size(key, value, raw_headers)
            stored.append(_stored_from_bytes(ts, key, value, raw_headers))
        total += size
        largest = max(largest, size)
    return EncodedBatch(
        orjson.dumps(stored),
        len(stored),
        total,
        largest,
        now_ms if first_ts is None else first_ts,
        max_ts,
        _keyless(stored),
        producer_timestamps=given,
    )


def _keyless(stored: list[list]) -> tuple[int, ...]:
    """The indexes of the JSON form's records ([timestamp, key, ...] each) without a key."""
    return tuple(index for index, record in enumerate(stored) if record[1] is None)


def is_record_batch(payload: bytes) -> bool:
    """Whether a payload is in the RecordBatch form (else the JSON form)."""
    return payload[0] != JSON_FORM_START


class UnreadableBatch(BrokerError):
    """A stored batch that does not read: its records decompress beyond MAX_RECORDS_BYTES, or do not
    parse. UNKNOWN_SERVER_ERROR for the reader (the partition's error of an HTTP fetch or ListOffsets);
    the log cleaner leaves its partition uncompacted, as Kafka's leaves an uncleanable partition."""

    def __init__(self, reason: str, base_offset: int | None) -> None:
        where = "" if base_offset is None else f" at offset {base_offset}"
        super().__init__(
            ErrorCode.UNKNOWN_SERVER_ERROR,
            f"the stored batch{where} does not read ({reason}); every batch is checked when produced, so "
            f"this row of record_batches is corrupt or was not written by txbroker: read past the batch "
            f"(from its last offset + 1), and restore or delete the row",
        )


def _record_batch_records(payload: bytes) -> RecordBatchReader:
    """The records of a RecordBatch-form payload, its records section decompressed within
    MAX_RECORDS_BYTES (raises DecompressionRefused beyond it)."""
    codec = codecs.batch_codec(payload)
    if codec != codecs.CODEC_NONE:
        records = codecs.decompress(codec, payload[codecs.HEADER_BYTES :], codecs.MAX_RECORDS_BYTES)
        payload = codecs.with_records(payload, records, codecs.CODEC_NONE)
    return RecordBatchReader(payload)


def decode_payload(payload: bytes, base_offset: int | None = None) -> list[list | None]:
    """The batch's records by index in the JSON form's lists, whichever form it is stored in; None
    where compaction removed one. UnreadableBatch (naming `base_offset`, the batch's) for a payload
    that does not read within MAX_RECORDS_BYTES."""
    try:
        if not is_record_batch(payload):
            return orjson.loads(payload)
        return [
            _stored_from_bytes(record.timestamp, record.key, record.value, record.headers)
            for record in _record_batch_records(payload)
        ]
    except codecs.DecompressionRefused as error:  # beyond the bound, or not valid for its codec
        raise UnreadableBatch(str(error), base_offset) from error
    except Exception as error:  # aiokafka's CorruptRecordException, orjson's, or whatever garbage leads to
        raise UnreadableBatch(f"{type(error).__name__}: {error}", base_offset) from error


def record_timestamps(payload: bytes) -> list[int | None]:
    """Each record's timestamp by index, whichever form the batch is stored in (None where
    compaction removed one): what a refusal for out-of-bounds timestamps reads (append.py)."""
    if not is_record_batch(payload):
        return [None if record is None else record[0] for record in orjson.loads(payload)]
    return [record.timestamp for record in _record_batch_records(payload)]


def key_bytes(stored: list) -> bytes | None:
    """The key's bytes whatever form the record was stored in: what compaction compares."""
    return _field_bytes(stored[1], stored[4])


def stored_size(stored: list) -> int:
    """The record's bytes (key, value, header keys and values), as size_bytes counts them."""
    _ts, key, value, headers, form = stored
    if form == FORM_BASE64:

        def field_size(text: str | None) -> int:
            return 0 if text is None else len(base64.b64decode(text))
    else:
        field_size = _utf8_size
    return field_size(key) + field_size(value) + sum(_utf8_size(k) + field_size(v) for k, v in headers)


def with_holes(stored: list[list | None], keep: Sequence[bool]) -> tuple[bytes, int, int, int]:
    """The payload of a compacted batch keeping only the records where `keep` is true, each at its
    index: (payload, size_bytes, first_timestamp_ms, max_timestamp_ms). At least one must be kept."""
    kept = [record if wanted else None for record, wanted in zip(stored, keep, strict=True)]
    present = [record for record in kept if record is not None]
    return (
        orjson.dumps(kept),
        sum(stored_size(record) for record in present),
        present[0][0],
        max(record[0] for record in present),
    )


def with_timestamp(payload: bytes, timestamp_ms: int) -> bytes:
    """A JSON-form payload with every record's timestamp `timestamp_ms` (a topic whose records take
    their append time: Kafka's LogAppendTime)."""
    stored = orjson.loads(payload)
    for record in stored:
        if record is not None:
            record[0] = timestamp_ms
    return orjson.dumps(stored)


def _text_to_base64(text: str | None) -> str | None:
    return None if text is None else base64.b64encode(text.encode("utf-8")).decode("ascii")


def render_record(stored: list, offset: int, encoding: str) -> dict:
    """One stored record as the contract's fetch record, in the encoding the fetch asked for. A
    record whose bytes are not UTF-8 is returned base64-encoded, marked "encoding": "base64"."""
    ts, key, value, headers, form = stored
    if form == FORM_TEXT and encoding == BASE64:
        key, value = _text_to_base64(key), _text_to_base64(value)
        headers = [[k, _text_to_base64(v)] for k, v in headers]
    record = {
        "offset": offset,
        "key": key,
        "value": value,
        "headers": [{"key": k, "value": v} for k, v in headers],
        "timestamp_ms": ts,
    }
    if form == FORM_BASE64 and encoding == UTF8:
        record["encoding"] = BASE64
    return record


# A record without headers renders them as this: orjson writes it as [], and being an empty tuple it
# is one shared object that the garbage collector never tracks (a fetch builds a record per record).
NO_HEADERS = ()


def render_records(stored: list[list | None], base_offset: int, start: int, stop: int, encoding: str) -> list[dict]:
    """render_record of stored[start:stop] (record i at offset base_offset + i), skipping the nulls
    compaction left. One call per batch, and the usual record (stored as text, read in utf8) built
    inline: a fetch renders every record it returns, so per-record calls were a large part of its CPU."""
    rendered = []
    append = rendered.append
    as_text = encoding == UTF8
    for index in range(start, stop):
        record = stored[index]
        if record is None:
            continue
        if as_text and record[4] == FORM_TEXT:
            headers = record[3]
            append(
                {
                    "offset": base_offset + index,
                    "key": record[1],
                    "value": record[2],
                    "headers": [{"key": k, "value": v} for k, v in headers] if headers else NO_HEADERS,
                    "timestamp_ms": record[0],
                }
            )
        else:
            append(render_record(record, base_offset + index, encoding))
    return rendered


# The bounds of schemas.RecordIn and schemas.Header (app/api), which the fast path below must not
# loosen: a record outside them goes to the general path, whose validation names the field.
MAX_TIMESTAMP_MS = 2**63 - 1
MAX_HEADER_KEY_CHARS = 1_000_000


def _fast_text_size(text) -> int:
    """The UTF-8 size of a JSON string or null, or -1 for anything else (or text that has no UTF-8
    encoding: a lone surrogate, which orjson never produces, checked anyway)."""
    if text is None:
        return 0
    if text.__class__ is not str:
        return -1
    if text.isascii():
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return -1


def _fast_base64(text) -> tuple[bytes | None, bool]:
    """(bytes, ok) of a JSON string of standard base64, or null."""
    if text is None:
        return None, True
    if text.__class__ is not str:
        return None, False
    try:
        return base64.b64decode(text, validate=True), True
    except (binascii.Error, ValueError):
        return None, False


def encode_json_records(records: list, encoding: str, now_ms: int) -> EncodedBatch | None:
    """The fast path of encode_batch for records as parsed from a request's JSON (dicts of the
    contract's record fields, not yet validated): one pass that checks and encodes. Returns None as
    soon as anything is not plainly valid (a wrong type, a bound, bad base64); the caller then takes
    the general path (schema validation, then encode_batch), which reports exactly what is wrong.
    So it accepts a subset of what the general path accepts, and encodes those records identically."""
    if encoding not in ENCODINGS or not records:
        return None
    text_form = encoding == UTF8
    stored = []
    total = 0
    largest = 0
    max_ts = -1
    # The earliest and latest timestamps the request gave (EncodedBatch.producer_timestamps).
    earliest_given = MAX_TIMESTAMP_MS + 1
    latest_given = -1
    for record in records:
        if record.__class__ is not dict:
            return None
        ts = record.get("timestamp_ms")
        if ts is None:
            ts = now_ms
        elif ts.__class__ is not int or not 0 <= ts <= MAX_TIMESTAMP_MS:
            return None
        else:
            if ts < earliest_given:
                earliest_given = ts
            if ts > latest_given:
                latest_given = ts
        if ts > max_ts:
            max_ts = ts
        key, value, headers = record.get("key"), record.get("value"), record.get("headers")
        if headers is None:
            if "headers" in record:  # null is not a list: the general path says so
                return None
            headers = ()
        elif headers.__class__ is not list:
            return None
        if text_form:
            # The common record first, without a call: ASCII text (or null) and no headers.
            if value.__class__ is str and value.isascii():
                value_size = len(value)
            else:
                value_size = _fast_text_size(value)
            if key is None:
                key_size = 0
            elif key.__class__ is str and key.isascii():
                key_size = len(key)
            else:
                key_size = _fast_text_size(key)
            if key_size < 0 or value_size < 0:
                return None
            size = key_size + value_size
            stored_headers = []
            for header in headers:
                if header.__class__ is not dict:
                    return None
                header_key, header_value = header.get("key"), header.get("value")
                key_chars = _fast_text_size(header_key)
                value_chars = _fast_text_size(header_value)
                if header_key is None or key_chars < 0 or value_chars < 0 or len(header_key) > MAX_HEADER_KEY_CHARS:
                    return None
                size += key_chars + value_chars
                stored_headers.append([header_key, header_value])
            stored.append([ts, key, value, stored_headers, FORM_TEXT])
        else:
            (raw_key, key_ok), (raw_value, value_ok) = _fast_base64(key), _fast_base64(value)
            if not (key_ok and value_ok):
                return None
            raw_headers = []
            size = len(raw_key or b"") + len(raw_value or b"")
            for header in headers:
                if header.__class__ is not dict:
                    return None
                header_key = header.get("key")
                key_chars = _fast_text_size(header_key)
                raw_header_value, header_ok = _fast_base64(header.get("value"))
                if header_key is None or key_chars < 0 or not header_ok or len(header_key) > MAX_HEADER_KEY_CHARS:
                    return None
                size += key_chars + len(raw_header_value or b"")
                raw_headers.append((header_key, raw_header_value))
            try:
                stored.append(
                    [ts, _as_text(raw_key), _as_text(raw_value), [[k, _as_text(v)] for k, v in raw_headers], FORM_TEXT]
                )
            except UnicodeDecodeError:
                stored.append(
                    [
                        ts,
                        _as_base64(raw_key),
                        _as_base64(raw_value),
                        [[k, _as_base64(v)] for k, v in raw_headers],
                        FORM_BASE64,
                    ]
                )
        total += size
        if size > largest:
            largest = size
    return EncodedBatch(
        orjson.dumps(stored),
        len(stored),
        total,
        largest,
        stored[0][0],
        max_ts,
        _keyless(stored),
        producer_timestamps=(earliest_given, latest_given) if latest_given >= 0 else None,
    )
