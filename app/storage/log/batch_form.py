"""The form a topic gives the batches it stores, as Kafka's log validator gives it: their codec
(compression.type, with its levels, KIP-390) and their timestamps (message.timestamp.type).

Timestamps: with `CreateTime` (the default) records keep their producers' timestamps. With
`LogAppendTime` a batch takes the time of its write batch: a RecordBatch is marked LogAppendTime
(its attributes' timestamp-type bit) with that time as its max timestamp, which readers report as
every record's timestamp (Kafka's clients, and the record module the other readers use); its
records are left as sent, as Kafka leaves them. A JSON-form batch (HTTP's) has each record's
timestamp set to that time (the Kafka listener renders it as a CreateTime batch of those
timestamps: a JSON-form batch does not say under which type it was written, and marking one
written before a change to LogAppendTime would give its records its max timestamp). Either way
the batch's first and max timestamps (ListOffsets by time) are that time.

A batch its producer marked LogAppendTime, a type only a broker sets, that a `CreateTime` topic
takes (append.py refuses it unless it has a max timestamp) is stored marked CreateTime, its max
timestamp kept: Kafka's validator rewrites every batch's attributes to its topic's timestamp type
(LogValidator's setMaxTimestamp), so consumers read each record's own timestamp as sent, not the
batch's max timestamp for every record. (Kafka, when it recompresses such a batch into another
codec, rebuilds its records from what the mark made them read, every one the max timestamp;
txbroker, recompressing only the records section, keeps each record's own in every codec.)

Codecs:

- `producer` (the default): a batch stays in the codec its producer chose;
- `uncompressed`, `gzip`, `snappy`, `lz4`, `zstd`: a batch in another codec is recompressed into
  this one before it is stored (one already in it is kept as sent, whatever level it was made with,
  as Kafka keeps it). Only the records section changes: the producer id, epoch and base sequence,
  the transactional and control flags, the timestamps and the offsets stay; the length, the codec
  bits and the CRC are written again.

A batch stored in the JSON form (HTTP's produce, compaction's rewrites) has no codec: the Kafka
listener renders it at fetch, then sends it in the topic's codec (`in_codec` with `topic_codec`;
none for `producer`: an HTTP producer chose no codec), so over Kafka every data batch of a topic with
a codec comes in that codec.

The codecs, and the rewrite of a batch's header, are app/record_batch_codecs.py's, the Kafka door's
too. Decompressing is bounded there, here by the bytes the door read from the batch's records when
it was produced (EncodedBatch.records_bytes): the same records section decompresses to exactly that
many, so the bound refuses no batch the door took and lets no other allocate more.
"""

from __future__ import annotations

import dataclasses
import struct

from aiokafka.record.default_records import DefaultRecordBase as DefaultRecordBatch  # the v2 layout's constants

from app import record_batch_codecs as codecs
from app.storage.log import record_codec
from app.storage.log.record_codec import EncodedBatch
from app.storage.log.topics import TopicInfo

# compression.type's codecs; `producer` is none of them (the batch's own).
CODECS = {
    "uncompressed": codecs.CODEC_NONE,
    "gzip": codecs.CODEC_GZIP,
    "snappy": codecs.CODEC_SNAPPY,
    "lz4": codecs.CODEC_LZ4,
    "zstd": codecs.CODEC_ZSTD,
}
# Kafka's gzip level -1 is zlib's default compression, level 6 (aiokafka takes no -1).
_ZLIB_DEFAULT_LEVEL = 6

_TIMESTAMP = struct.Struct(">q")
_FIRST_TIMESTAMP_OFFSET = 27  # after base offset, length, leader epoch, magic, CRC, attributes, last offset delta
_MAX_TIMESTAMP_OFFSET = _FIRST_TIMESTAMP_OFFSET + _TIMESTAMP.size
LOG_APPEND_TIME = "LogAppendTime"


@dataclasses.dataclass(frozen=True, slots=True)
class TopicCodec:
    """The codec a topic's batches are stored or sent in (None: the producer's own), with its level."""

    codec: int | None
    level: int | None = None


PRODUCERS_CODEC = TopicCodec(None)


def topic_codec(topic: TopicInfo) -> TopicCodec:
    """The topic's compression.type and the level of its codec (compression.gzip.level, ...)."""
    codec_id = CODECS.get(topic.setting("compression_type"))
    if codec_id == codecs.CODEC_GZIP:
        level = topic.setting("compression_gzip_level")
        return TopicCodec(codec_id, _ZLIB_DEFAULT_LEVEL if level == -1 else level)
    if codec_id == codecs.CODEC_LZ4:
        return TopicCodec(codec_id, topic.setting("compression_lz4_level"))
    if codec_id == codecs.CODEC_ZSTD:
        return TopicCodec(codec_id, topic.setting("compression_zstd_level"))
    return PRODUCERS_CODEC if codec_id is None else TopicCodec(codec_id)


def in_codec(batch: bytes, wanted: TopicCodec, records_bytes: int) -> bytes:
    """The RecordBatch in the wanted codec: as it is when it is in it already (or `wanted` is the
    producer's), else its records section, which decompresses to `records_bytes` (at most: more is
    refused, DecompressesTooLarge), compressed again, its header rewritten."""
    if wanted.codec is None or wanted.codec == codecs.batch_codec(batch):
        return batch
    return codecs.recompressed(batch, wanted.codec, wanted.level, records_bytes)


def marked_log_append_time(batch: bytes, appended_ms: int) -> bytes:
    """A RecordBatch marked LogAppendTime (its attributes' timestamp-type bit), `appended_ms` its max
    timestamp, which readers then give every record; its records as they are."""
    stamped = bytearray(batch)
    codecs.add_attributes(stamped, DefaultRecordBatch.TIMESTAMP_TYPE_MASK)
    _TIMESTAMP.pack_into(stamped, _MAX_TIMESTAMP_OFFSET, appended_ms)
    return codecs.with_crc(stamped)


def uses_log_append_time(topic: TopicInfo) -> bool:
    return topic.setting("message_timestamp_type") == LOG_APPEND_TIME


def _at_append_time(batch: EncodedBatch, appended_ms: int) -> EncodedBatch:
    """The batch with its records' timestamps the append time (the module's docstring)."""
    if batch.is_record_batch:
        payload = marked_log_append_time(batch.payload, appended_ms)
    else:
        payload = record_codec.with_timestamp(batch.payload, appended_ms)
    return dataclasses.replace(batch, payload=payload, first_timestamp_ms=appended_ms, max_timestamp_ms=appended_ms)


def _marked_create_time(batch: EncodedBatch) -> EncodedBatch:
    """A RecordBatch its producer marked LogAppendTime marked CreateTime instead, its max timestamp
    kept (the module's docstring): its records then read their own timestamps, the first of which
    is its header's first timestamp. It stays `marked_log_append_time`, what its producer sent,
    which append.py's checks go by."""
    unmarked = bytearray(batch.payload)
    codecs.remove_attributes(unmarked, DefaultRecordBatch.TIMESTAMP_TYPE_MASK)
    (first_timestamp_ms,) = _TIMESTAMP.unpack_from(unmarked, _FIRST_TIMESTAMP_OFFSET)
    return dataclasses.replace(batch, payload=codecs.with_crc(unmarked), first_timestamp_ms=first_timestamp_ms)


@dataclasses.dataclass(frozen=True, slots=True)
class StoredForm:
    """What of a topic's config decides the form it stores batches in: two topics (or one topic
    before and after a config change) of equal forms store a batch alike."""

    log_append_time: bool
    codec: TopicCodec


def stored_form(topic: TopicInfo) -> StoredForm:
    return StoredForm(uses_log_append_time(topic), topic_codec(topic))


def as_topic_stores(batch: EncodedBatch, topic: TopicInfo, appended_ms: int) -> EncodedBatch:
    """A batch about to be appended at `appended_ms`, in the form its topic stores: its timestamps
    (message.timestamp.type) and, for a RecordBatch, its codec (compression.type; a JSON-form batch
    takes its topic's codec when the Kafka listener renders it). Its stored size is then its length."""
    return in_stored_form(batch, stored_form(topic), appended_ms)


def in_stored_form(batch: EncodedBatch, form: StoredForm, appended_ms: int) -> EncodedBatch:
    """`as_topic_stores` for a topic of that form. Its cost grows with the batch's records (a
    recompression, a LogAppendTime stamp), to minutes at zstd's highest levels for the largest
    batches (docs/kafka.md, "A node dies")."""
    if form.log_append_time:
        batch = _at_append_time(batch, appended_ms)
    elif batch.marked_log_append_time:
        batch = _marked_create_time(batch)
    if not batch.is_record_batch:
        return batch
    stored = in_codec(batch.payload, form.codec, batch.records_bytes)
    if stored is batch.payload:
        return batch
    return dataclasses.replace(batch, payload=stored, size_bytes=len(stored))
