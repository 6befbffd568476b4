"""Storage recompresses a RecordBatch into its topic's codec (batch_form.py) within a bound: the
bytes its door read from its records when it was produced. A batch whose records decompress to more
is refused with the error the door's bounded decompression gives (app/record_batch_codecs.py), before
the excess is produced. (Pure: batches built by aiokafka's record builder, as the door's are.)"""

from __future__ import annotations

import uuid

import pytest
from aiokafka.record.default_records import DefaultRecordBatch as RecordReader
from aiokafka.record.default_records import DefaultRecordBatchBuilder as RecordBuilder

from app import record_batch_codecs as codecs
from app.storage.log import batch_form
from app.storage.log.record_codec import EncodedBatch
from app.storage.log.topics import TopicInfo

VALUE = b"\0" * (1 << 20)  # a megabyte of zeros: a few KiB compressed
NOW_MS = 1_700_000_000_000


def gzip_batch() -> tuple[bytes, int]:
    """A gzip RecordBatch of one record of VALUE, and the bytes its records section decompresses to."""
    builder = RecordBuilder(2, codecs.CODEC_GZIP, False, -1, -1, -1, 1 << 30)
    builder.append(0, NOW_MS, b"k", VALUE, [])
    batch = bytes(builder.build())
    return batch, len(codecs.decompress(codecs.CODEC_GZIP, batch[codecs.HEADER_BYTES :], 2 * len(VALUE)))


def stored_in(compression_type: str) -> TopicInfo:
    return TopicInfo(1, "t", 1, {"compression_type": compression_type}, False, uuid.uuid4())


def encoded(batch: bytes, records_bytes: int) -> EncodedBatch:
    return EncodedBatch.record_batch(batch, 1, len(VALUE) + 1, NOW_MS, NOW_MS, records_bytes)


def test_a_batch_within_what_its_door_read_is_recompressed_whole():
    batch, records_bytes = gzip_batch()
    stored = batch_form.as_topic_stores(encoded(batch, records_bytes), stored_in("zstd"), NOW_MS)
    assert codecs.batch_codec(stored.payload) == codecs.CODEC_ZSTD
    assert stored.size_bytes == len(stored.payload)
    (record,) = list(RecordReader(stored.payload))
    assert (record.key, record.value) == (b"k", VALUE)


def test_a_batch_decompressing_beyond_what_its_door_read_is_refused_as_the_door_refuses_it():
    batch, records_bytes = gzip_batch()
    limit = records_bytes - 1
    with pytest.raises(codecs.DecompressesTooLarge) as refused_by_the_door:
        codecs.decompress(codecs.CODEC_GZIP, batch[codecs.HEADER_BYTES :], limit)
    with pytest.raises(codecs.DecompressesTooLarge) as refused_by_storage:
        batch_form.as_topic_stores(encoded(batch, limit), stored_in("zstd"), NOW_MS)
    assert str(refused_by_storage.value) == str(refused_by_the_door.value)
    assert str(refused_by_storage.value) == f"the gzip batch decompresses to more than {limit} bytes"


def test_a_batch_kept_in_its_codec_is_not_decompressed():
    batch, _ = gzip_batch()
    assert batch_form.as_topic_stores(encoded(batch, 0), stored_in("gzip"), NOW_MS).payload is batch
