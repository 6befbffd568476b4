"""RecordBatches (message format v2) in and out.

In: a produced partition's bytes, checked as Kafka's log validator checks them (one batch of
magic 2, its CRC, no control batch from a client, records numbered 0..n-1, as many as it declares)
and decompressed within a bound (app/record_batch_codecs.py), its records read once for what the write path
needs of them (count, largest record, timestamps). The batch itself is what storage keeps
(record_codec's RecordBatch form): in the codec its producer chose, base offset 0, leader epoch -1
(the core then stores it in its topic's codec, compression.type: storage's batch_form.py). The
door checks a request's first MiB of records on its event loop (read_produced_on_loop) and larger
batches in a thread (read_produced): CHECKED_ON_LOOP_BYTES.

Out: a batch stored in that form as it is, its base offset patched in (stored_batch_at); one
stored in the JSON form (written over HTTP, or rewritten by compaction) rendered, uncompressed,
with its stored base offset, producer id, epoch, base sequence and transactional flag (the fetch
then sends it in its topic's codec); a marker as the control batch Kafka writes, uncompressed as
Kafka writes it, so clients skip it as they do.

The records are read and written by aiokafka's record module, whose reader and builder are compiled
(Cython): kafka-python's (kafka.record), in Python, took several times as long per record
(`python -m bench.kafka.record_costs`, its "before" rows). Both
produce the same bytes and read the same records (leader epoch aside, which _finish sets), also
from corrupt input, which both refuse. The layout's constants are aiokafka's too, and the CRC-32C
app/record_batch_codecs.py's (the crc32c package). kafka-python is not imported: its package loads
its whole client with kafka.record.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from aiokafka.record.default_records import DefaultRecordBase as DefaultRecordBatch  # the v2 layout's constants
from aiokafka.record.default_records import DefaultRecordBatch as RecordReader
from aiokafka.record.default_records import DefaultRecordBatchBuilder as RecordBuilder
from kio.schema.errors import ErrorCode as KafkaError

from app import record_batch_codecs as codecs

HEADER = DefaultRecordBatch.HEADER_STRUCT
MAGIC_V2 = 2
_MAGIC_OFFSET = struct.calcsize(">qii")
_BASE_OFFSET = struct.Struct(">q")
_LEADER_EPOCH = struct.Struct(">i")
_LEADER_EPOCH_OFFSET = struct.calcsize(">qi")
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_OFFSET = DefaultRecordBatch.ATTRIBUTES_OFFSET + struct.calcsize(">h")  # after the attributes
NO_LEADER_EPOCH = -1
NO_SEQUENCE = -1  # a control batch's base sequence, as Kafka writes it
NO_TIMESTAMP = -1  # Kafka's RecordBatch.NO_TIMESTAMP: a record without one, which no timestamp bound refuses
# A control record's key is (version, type) and an end-transaction marker's value (version,
# coordinator epoch), as Kafka's ControlRecordType and EndTransactionMarker write them.
_CONTROL_KEY = struct.Struct(">hh")
_MARKER_VALUE = struct.Struct(">hi")
CONTROL_RECORD_VERSION = 0
UNKNOWN_COORDINATOR_EPOCH = 0
# The builder's size budget: a stored batch is rendered whole, however large.
_UNBOUNDED = 2**62


class KafkaRecord(NamedTuple):
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]


class RecordFields(Protocol):
    """What data_batch reads of a record: a KafkaRecord's fields, which the records the core reads
    back from storage have too (so they are rendered as they come, without a copy per record)."""

    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class ProducedBatch:
    """A produced batch, checked, in the form storage keeps (storage's record_codec, "RecordBatch"):
    in its producer's codec, base offset 0, partition leader epoch -1; and what the write path needs
    of its records, read once while checking them."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    is_transactional: bool
    stored: bytes
    record_count: int
    # The largest record's key, value, header keys (UTF-8) and values: what max_message_bytes bounds.
    largest_record_bytes: int
    first_timestamp_ms: int
    max_timestamp_ms: int
    # The bytes its records took once decompressed: what later batches of the request may still use.
    uncompressed_bytes: int
    # The indexes of its records without a key: a compacted topic refuses the batch (storage's append).
    keyless_records: tuple[int, ...] = ()
    # The earliest and latest of its records' timestamps but Kafka's NO_TIMESTAMP (-1), None if all
    # are -1: what a topic's message.timestamp.before.max.ms and after.max.ms bound (storage's append).
    producer_timestamps: tuple[int, int] | None = None
    # Whether its producer marked it LogAppendTime (its attributes' timestamp-type bit), which only
    # a broker may set: storage's append refuses it as Kafka's LogValidator does.
    marked_log_append_time: bool = False


class BatchRefused(Exception):
    """A produced partition's bytes that Kafka's validator would refuse, with Kafka's error."""

    def __init__(self, error: KafkaError, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


def _corrupt(message: str) -> BatchRefused:
    return BatchRefused(KafkaError.corrupt_message, message)


# The most a Produce request's batches may take uncompressed to be checked on the event loop (the
# door's handler counts it down over the request's partitions: read_produced_on_loop); a batch beyond
# what is left is checked in a thread, so that a large one does not stall the worker's other
# connections, nor the PostgreSQL transactions its other requests hold (docs/kafka.md, "A node
# dies", which has the measured cost of checking that much against the hop to a thread); the usual
# batch (librdkafka's at linger.ms 5, a Java client's 16 KiB) is far below it.
CHECKED_ON_LOOP_BYTES = 1024 * 1024


class _BeyondLoopShare(Exception):
    """The batch's records take more than read_produced_on_loop's share: to check in a thread."""


def read_produced_on_loop(data: bytes, uncompressed_limit: int, loop_share: int) -> ProducedBatch | None:
    """read_produced, if the batch's records take at most `loop_share` bytes uncompressed; else None,
    found before decompressing more than that (its CRC not computed when it is not compressed),
    for the caller to check it whole with read_produced in a thread, which refuses it as this would.
    Raises BatchRefused."""
    try:
        return _read_produced(data, uncompressed_limit, loop_share)
    except _BeyondLoopShare:
        return None


def read_produced(data: bytes, uncompressed_limit: int) -> ProducedBatch:
    """The one batch of a produced partition, checked, and in the form it is stored in. Raises BatchRefused."""
    return _read_produced(data, uncompressed_limit, None)


def _read_produced(data: bytes, uncompressed_limit: int, loop_share: int | None) -> ProducedBatch:
    if loop_share is not None and len(data) - HEADER.size > loop_share:
        raise _BeyondLoopShare  # compressed or not, it takes at least that many bytes to check
    if len(data) < HEADER.size:
        raise _corrupt(f"{len(data)} bytes are shorter than a record batch header ({HEADER.size})")
    magic = data[_MAGIC_OFFSET]
    if magic != MAGIC_V2:
        raise BatchRefused(
            KafkaError.unsupported_for_message_format,
            f"record batch magic {magic}: expected {MAGIC_V2} (Produce v3 and later carry message format v2 only)",
        )
    header = HEADER.unpack_from(data)
    batch_length = header[1] + DefaultRecordBatch.AFTER_LEN_OFFSET
    if batch_length != len(data):
        raise BatchRefused(
            KafkaError.invalid_record,
            f"the partition's records hold {len(data)} bytes but their first batch {batch_length}: "
            f"send exactly one record batch per partition",
        )
    attributes, last_offset_delta, record_count = header[5], header[6], header[12]
    crc = codecs.batch_crc(data)
    if crc != header[4]:
        raise _corrupt(f"record batch CRC {header[4]} does not match its content ({crc})")
    if attributes & DefaultRecordBatch.CONTROL_MASK:
        raise BatchRefused(KafkaError.invalid_record, "clients may not produce control batches")
    if last_offset_delta != record_count - 1:
        # The stored batch is served as it is: its last offset must be where the log puts it.
        raise BatchRefused(
            KafkaError.invalid_record,
            f"the batch declares {record_count} records but a last offset delta of {last_offset_delta}: "
            f"expected {record_count - 1}",
        )
    codec = attributes & DefaultRecordBatch.CODEC_MASK
    stored, readable = _stored_form(data, codec, uncompressed_limit, loop_share)
    largest = 0
    first_timestamp = max_timestamp = None
    earliest_given = latest_given = None  # ProducedBatch.producer_timestamps
    index = -1
    keyless = []
    try:
        for index, record in enumerate(RecordReader(readable)):
            if record.offset != index:
                raise BatchRefused(
                    KafkaError.invalid_record, f"record {index} of the batch has offset delta {record.offset}"
                )
            timestamp, key, value = record.timestamp, record.key, record.value
            if key is None:
                keyless.append(index)
            size = (0 if key is None else len(key)) + (0 if value is None else len(value))
            for header_key, header_value in record.headers:
                size += len(header_key.encode()) + (0 if header_value is None else len(header_value))
            if size > largest:
                largest = size
            if first_timestamp is None:
                first_timestamp = max_timestamp = timestamp
            elif timestamp > max_timestamp:
                max_timestamp = timestamp
            if timestamp != NO_TIMESTAMP:
                if earliest_given is None:
                    earliest_given = latest_given = timestamp
                elif timestamp < earliest_given:
                    earliest_given = timestamp
                elif timestamp > latest_given:
                    latest_given = timestamp
    except BatchRefused:
        raise
    except Exception as error:  # the reader raises CorruptRecordException, or whatever garbage leads to
        raise _corrupt(f"the batch's records do not parse ({error})") from error
    if index + 1 != record_count or first_timestamp is None:
        raise _corrupt(f"the batch declares {record_count} records and holds {index + 1}")
    return ProducedBatch(
        header[9],
        header[10],
        header[11],
        bool(attributes & DefaultRecordBatch.TRANSACTIONAL_MASK),
        stored,
        record_count,
        largest,
        first_timestamp,
        max_timestamp,
        len(readable) - HEADER.size,
        tuple(keyless),
        None if earliest_given is None else (earliest_given, latest_given),
        bool(attributes & DefaultRecordBatch.TIMESTAMP_TYPE_MASK),
    )


_STORED_PREFIX = _BASE_OFFSET.pack(0)
_STORED_LEADER_EPOCH = _LEADER_EPOCH.pack(NO_LEADER_EPOCH)


def _stored_form(data: bytes, codec: int, uncompressed_limit: int, loop_share: int | None) -> tuple[bytes, bytes]:
    """The checked batch as storage keeps it, in the codec its producer chose (the core stores it
    in its topic's codec, compression.type), with base offset 0 and partition leader epoch -1, which
    the CRC does not cover; and the batch uncompressed, whose records the checks read (the same
    bytes when it is not compressed). Its records are at most what the request may still carry, and
    at most MAX_RECORDS_BYTES whatever kafka_max_request_bytes, which storage reads a stored batch
    within (a batch stored uncompressed may be compressed into its topic's codec). With a
    `loop_share` below that bound, decompresses at most that much, and raises _BeyondLoopShare
    if there is more."""
    limit = min(uncompressed_limit, codecs.MAX_RECORDS_BYTES)
    if limit == uncompressed_limit:
        bound = "what this request may still carry (kafka_max_request_bytes)"
    else:
        bound = f"the most one batch's records may hold ({codecs.MAX_RECORDS_BYTES} bytes)"
    if codec == codecs.CODEC_NONE:
        if len(data) - HEADER.size > limit:
            raise _corrupt(f"the batch's {len(data) - HEADER.size} bytes exceed {bound}: send smaller batches")
        readable = None
    else:
        on_loop = loop_share is not None and loop_share < limit
        try:
            body = codecs.decompress(codec, data[HEADER.size :], loop_share if on_loop else limit)
        except codecs.DecompressesTooLarge as error:
            if on_loop:
                raise _BeyondLoopShare from error
            raise _corrupt(f"{error}, {bound}: send smaller batches") from error
        except codecs.DecompressionRefused as error:
            raise _corrupt(str(error)) from error
        # Read only, never sent or stored: its CRC is left as it was.
        readable = codecs.with_records(data, body, codecs.CODEC_NONE)
    if data.startswith(_STORED_PREFIX) and data.startswith(_STORED_LEADER_EPOCH, _LEADER_EPOCH_OFFSET):
        stored = data  # as clients send it: stored without a copy
    else:
        patched = bytearray(data)
        _BASE_OFFSET.pack_into(patched, 0, 0)
        _LEADER_EPOCH.pack_into(patched, _LEADER_EPOCH_OFFSET, NO_LEADER_EPOCH)
        stored = bytes(patched)
    return stored, stored if readable is None else bytes(readable)


def stored_batch_at(base_offset: int, stored: bytes) -> tuple[bytes, memoryview]:
    """A stored RecordBatch (read_produced's `stored`) at its offset in the log, as two parts to
    join into a response: the base offset, then the rest as stored (the CRC does not cover it)."""
    return _BASE_OFFSET.pack(base_offset), memoryview(stored)[_BASE_OFFSET.size :]


def _finish(built: bytearray, base_offset: int, last_offset_delta: int, control: bool) -> bytes:
    """The builder's batch at its offset in the log, with Kafka's fields the builder leaves to the broker."""
    _BASE_OFFSET.pack_into(built, 0, base_offset)
    _LEADER_EPOCH.pack_into(built, _LEADER_EPOCH_OFFSET, NO_LEADER_EPOCH)
    _LAST_OFFSET_DELTA.pack_into(built, _LAST_OFFSET_DELTA_OFFSET, last_offset_delta)
    if control:
        codecs.add_attributes(built, DefaultRecordBatch.CONTROL_MASK)
    return codecs.with_crc(built)


def data_batch(
    base_offset: int,
    last_offset: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    is_transactional: bool,
    records: Iterable[RecordFields | None],
) -> bytes | None:
    """A stored data batch as a RecordBatch: record i at base_offset + i (None: one compaction
    removed, a gap in the offsets as in a compacted Kafka log). None if no record is left."""
    builder = RecordBuilder(
        MAGIC_V2, codecs.CODEC_NONE, is_transactional, producer_id, producer_epoch, base_sequence, _UNBOUNDED
    )
    appended = False
    for index, record in enumerate(records):
        if record is not None:
            builder.append(index, record.timestamp_ms, record.key, record.value, list(record.headers))
            appended = True
    if not appended:
        return None
    return _finish(builder.build(), base_offset, last_offset - base_offset, control=False)


def control_batch(offset: int, producer_id: int, producer_epoch: int, control_type: int, timestamp_ms: int) -> bytes:
    """A transaction marker (control_type: Kafka's ABORT 0 or COMMIT 1) as the control batch Kafka writes."""
    builder = RecordBuilder(MAGIC_V2, codecs.CODEC_NONE, True, producer_id, producer_epoch, NO_SEQUENCE, _UNBOUNDED)
    builder.append(
        0,
        timestamp_ms,
        _CONTROL_KEY.pack(CONTROL_RECORD_VERSION, control_type),
        _MARKER_VALUE.pack(CONTROL_RECORD_VERSION, UNKNOWN_COORDINATOR_EPOCH),
        [],
    )
    return _finish(builder.build(), offset, 0, control=True)
