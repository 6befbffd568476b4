"""Decompression of produced batches is bounded for every codec: data that inflates beyond the
limit is refused before the excess is produced, garbage is refused, and what fits comes back whole.
(Pure: the codecs as kafka-python's clients write them.)"""

from __future__ import annotations

import kafka.codec
import pytest

from app.record_batch_codecs import (
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_SNAPPY,
    CODEC_ZSTD,
    DecompressionRefused,
    decompress,
)

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
