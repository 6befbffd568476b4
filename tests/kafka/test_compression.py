"""Decompression of produced batches is bounded for every codec: data that inflates beyond the
limit is refused before the excess is produced, garbage is refused, and what fits comes back whole;
a produced batch's records are at most MAX_RECORDS_BYTES.
(Pure: the codecs as kafka-python's clients write them.)"""

from __future__ import annotations

import kafka.codec
import pytest
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka.record_batches import BatchRefused, read_produced
from app.record_batch_codecs import (
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_SNAPPY,
    CODEC_ZSTD,
    MAX_RECORDS_BYTES,
    DecompressionRefused,
    decompress,
)
from tests.unit.test_record_codec import compressed_bomb

DATA = b"\0" * (1 << 20)  # a megabyte of zeros: a few KiB compressed
ENCODERS = {
    CODEC_GZIP: kafka.codec.gzip_encode,
    CODEC_SNAPPY: kafka.codec.snappy_encode,
    CODEC_LZ4: kafka.codec.lz4_encode,
    CODEC_ZSTD: kafka.codec.zstd_encode,
}


@pytest.mark.parametrize("codec", sorted(ENCODERS), ids=["gzip", "snappy", "lz4", "zstd"])
def test_within_the_limit_everything_comes_back(codec):
    assert decompress(codec, ENCODERS[codec](DATA), len(DATA)) == DATA


@pytest.mark.parametrize("codec", sorted(ENCODERS), ids=["gzip", "snappy", "lz4", "zstd"])
def test_beyond_the_limit_it_is_refused(codec):
    compressed = ENCODERS[codec](DATA)
    assert len(compressed) < 64 * 1024
    with pytest.raises(DecompressionRefused, match="decompresses to more than"):
        decompress(codec, compressed, len(DATA) - 1)


def test_the_xerial_snappy_framing_is_bounded_too():
    framed = kafka.codec.snappy_encode(DATA, xerial_compatible=True)
    assert decompress(CODEC_SNAPPY, framed, len(DATA)) == DATA
    with pytest.raises(DecompressionRefused):
        decompress(CODEC_SNAPPY, framed, len(DATA) - 1)


@pytest.mark.parametrize("codec", sorted(ENCODERS), ids=["gzip", "snappy", "lz4", "zstd"])
def test_garbage_is_refused(codec):
    with pytest.raises(DecompressionRefused):
        decompress(codec, b"\x82SNAPPY\0 not compressed data at all", 1 << 20)


def test_an_unknown_codec_is_refused():
    with pytest.raises(DecompressionRefused, match="codec 7 is unknown"):
        decompress(7, b"", 100)


def test_a_produced_batch_holds_at_most_max_records_bytes_whatever_the_request_may_carry():
    """The bound storage reads a stored batch within (record_codec.decode_payload): the door
    refuses a batch beyond it even when kafka_max_request_bytes would let the request carry more."""
    bomb = compressed_bomb(CODEC_GZIP, MAX_RECORDS_BYTES + 1)
    with pytest.raises(BatchRefused) as refused:
        read_produced(bomb, 4 * MAX_RECORDS_BYTES)
    assert refused.value.error == KafkaError.corrupt_message
    assert refused.value.message == (
        f"the gzip batch decompresses to more than {MAX_RECORDS_BYTES} bytes, the most one batch's records "
        f"may hold ({MAX_RECORDS_BYTES} bytes): send smaller batches"
    )
