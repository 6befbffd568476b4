"""Decompression of produced batches, bounded: a batch of a few bytes must not make the broker
allocate gigabytes (a "zip bomb"). Each codec is read incrementally, or its declared size checked,
and stops at `limit` bytes: a batch that decompresses to more is refused (CORRUPT_MESSAGE) before
the excess is produced. Compression (clients') and the codecs' formats are kafka-python's
(kafka.codec), whose packages (python-snappy, lz4, zstandard) pyproject.toml declares.
"""

from __future__ import annotations

import io
import struct
import zlib

import lz4.frame
import snappy
import zstandard

CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_SNAPPY = 2
CODEC_LZ4 = 3
CODEC_ZSTD = 4
CODEC_NAMES = {CODEC_NONE: "none", CODEC_GZIP: "gzip", CODEC_SNAPPY: "snappy", CODEC_LZ4: "lz4", CODEC_ZSTD: "zstd"}

# The framing the Java client's snappy stream (and kafka-python's) writes: a magic header, two
# versions, then blocks each preceded by its compressed size.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_BYTES = 16
_BLOCK_SIZE = struct.Struct(">i")
# zlib's "detect gzip or zlib header" window bits.
_GZIP_OR_ZLIB = 32 + zlib.MAX_WBITS


class DecompressionRefused(Exception):
    """The data is not valid for its codec, or decompresses to more than allowed."""


def _too_large(codec: int, limit: int) -> DecompressionRefused:
    return DecompressionRefused(
        f"the {CODEC_NAMES[codec]} batch decompresses to more than {limit} bytes, what this request may still "
        f"carry (kafka_max_request_bytes): send smaller batches"
    )


def _gzip(data: bytes, limit: int) -> bytes:
    decompressor = zlib.decompressobj(_GZIP_OR_ZLIB)
    try:
        out = decompressor.decompress(data, limit + 1)
    except zlib.error as error:
        raise DecompressionRefused(f"the gzip data does not decompress ({error})") from error
    if len(out) > limit or decompressor.unconsumed_tail:
        raise _too_large(CODEC_GZIP, limit)
    if not decompressor.eof:
        raise DecompressionRefused("the gzip batch is truncated")
    return out


def _snappy_block_size(block: bytes) -> int:
    """A raw snappy block's uncompressed size: the unsigned varint that starts it."""
    size = shift = 0
    for index, byte in enumerate(block[:5]):
        size |= (byte & 0x7F) << shift
        if byte < 0x80:
            return size
        shift += 7
        if index == 4:
            break
    raise DecompressionRefused("the snappy block does not start with its length")


def _snappy_blocks(data: bytes) -> list[bytes]:
    if not data.startswith(_XERIAL_MAGIC):
        return [data]
    blocks, cursor = [], _XERIAL_HEADER_BYTES
    while cursor < len(data):
        if cursor + _BLOCK_SIZE.size > len(data):
            raise DecompressionRefused("the snappy stream is truncated")
        (size,) = _BLOCK_SIZE.unpack_from(data, cursor)
        cursor += _BLOCK_SIZE.size
        if size < 0 or cursor + size > len(data):
            raise DecompressionRefused("the snappy stream is truncated")
        blocks.append(data[cursor : cursor + size])
        cursor += size
    return blocks


def _snappy(data: bytes, limit: int) -> bytes:
    blocks = _snappy_blocks(data)
    if sum(_snappy_block_size(block) for block in blocks) > limit:
        raise _too_large(CODEC_SNAPPY, limit)
    try:
        return b"".join(snappy.decompress(block) for block in blocks)
    except Exception as error:  # python-snappy raises its own error classes, and cramjam's
        raise DecompressionRefused(f"the snappy data does not decompress ({error})") from error


def _lz4(data: bytes, limit: int) -> bytes:
    decompressor = lz4.frame.LZ4FrameDecompressor()
    try:
        out = decompressor.decompress(data, max_length=limit + 1)
    except RuntimeError as error:
        raise DecompressionRefused(f"the lz4 data does not decompress ({error})") from error
    if len(out) > limit or decompressor.needs_input is False and not decompressor.eof:
        raise _too_large(CODEC_LZ4, limit)
    if not decompressor.eof:
        raise DecompressionRefused("the lz4 frame is truncated")
    return out


def _zstd(data: bytes, limit: int) -> bytes:
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    try:
        out = reader.read(limit + 1)
    except zstandard.ZstdError as error:
        raise DecompressionRefused(f"the zstd data does not decompress ({error})") from error
    if len(out) > limit:
        raise _too_large(CODEC_ZSTD, limit)
    return out


_DECOMPRESS = {CODEC_GZIP: _gzip, CODEC_SNAPPY: _snappy, CODEC_LZ4: _lz4, CODEC_ZSTD: _zstd}


def decompress(codec: int, data: bytes, limit: int) -> bytes:
    """The records of a batch compressed with `codec`, at most `limit` bytes of them."""
    if codec not in _DECOMPRESS:
        raise DecompressionRefused(f"compression codec {codec} is unknown: expected one of {sorted(CODEC_NAMES)}")
    return _DECOMPRESS[codec](data, limit)
