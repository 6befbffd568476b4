"""The codecs of Kafka's RecordBatches (message format v2), for both layers that handle them: the
Kafka door, which decompresses a produced batch to check its records (app/kafka/record_batches.py),
and storage, which recompresses a batch into its topic's codec (app/storage/log/batch_form.py). So
this module imports neither (pyproject's import contracts).

- The codec numbers, as a batch's attributes carry them (their low three bits).
- Decompression, bounded: a batch of a few bytes must not make the broker allocate gigabytes (a
  "zip bomb"). Each codec is read incrementally, or its declared size checked, and stops at `limit`
  bytes: a batch that decompresses to more is refused (DecompressesTooLarge) before the excess is
  produced. The caller says what the limit is: the door what its request may still carry, and at most
  MAX_RECORDS_BYTES; storage what the door read from that very batch when it recompresses it, and
  MAX_RECORDS_BYTES when it reads a stored one (record_codec.decode_payload). So every stored batch
  reads within the bound its readers use, and a row that does not (corrupt, or not written by
  txbroker) is refused rather than inflated. Output is taken in growing parts, so that a large bound
  costs nothing for the usual batch of a few KiB.
- Compression, as Kafka's clients write it (aiokafka.codec: gzip, xerial-framed snappy as Kafka's
  Java client writes it, lz4 frames, zstd).
- A batch's header rewritten for other records: its codec bits, its length, its CRC-32C.

The codecs' packages (python-snappy, lz4, zstandard) are declared in pyproject.toml.

    Exception
     └── DecompressionRefused     not valid for its codec (or an unknown codec)
          └── DecompressesTooLarge  decompresses to more than the limit
"""

from __future__ import annotations

import io
import struct
import zlib

import lz4.frame
import snappy
import zstandard
from aiokafka import codec as encoders
from aiokafka.record.default_records import DefaultRecordBase as DefaultRecordBatch  # the v2 layout's constants

# The CRC-32C of Kafka's batches, hardware-assisted (kafka-python's calc_crc32c is this function).
from crc32c import crc32c as calc_crc32c

CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_SNAPPY = 2
CODEC_LZ4 = 3
CODEC_ZSTD = 4
CODEC_NAMES = {CODEC_NONE: "none", CODEC_GZIP: "gzip", CODEC_SNAPPY: "snappy", CODEC_LZ4: "lz4", CODEC_ZSTD: "zstd"}

HEADER_BYTES = DefaultRecordBatch.HEADER_STRUCT.size
_ATTRIBUTES = struct.Struct(">h")
_LENGTH = struct.Struct(">i")
_LENGTH_OFFSET = 8  # after the base offset
_CRC = struct.Struct(">I")

# The framing the Java client's snappy stream (and kafka-python's) writes: a magic header, two
# versions, then blocks each preceded by its compressed size.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_BYTES = 16
_BLOCK_SIZE = struct.Struct(">i")
# zlib's "detect gzip or zlib header" window bits.
_GZIP_OR_ZLIB = 32 + zlib.MAX_WBITS

# The most a batch's records section may decompress to: what the Kafka door lets a produced batch
# hold (whatever kafka_max_request_bytes, whose default it is), and so what storage reads a stored one within.
MAX_RECORDS_BYTES = 100 * 1024 * 1024
# The first part of a decompression's output (lz4, zstd), doubled while more comes, up to the limit:
# the codecs allocate the part asked for before they fill it.
_FIRST_PART_BYTES = 256 * 1024


class DecompressionRefused(Exception):
    """The data is not valid for its codec, or decompresses to more than allowed."""


class DecompressesTooLarge(DecompressionRefused):
    """The data decompresses to more than the caller's limit (whose message says what the limit is)."""


def _too_large(codec: int, limit: int) -> DecompressesTooLarge:
    return DecompressesTooLarge(f"the {CODEC_NAMES[codec]} batch decompresses to more than {limit} bytes")


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
    parts, total, wanted, pending = [], 0, min(limit + 1, _FIRST_PART_BYTES), data
    try:
        while True:
            part = decompressor.decompress(pending, max_length=wanted)
            pending = b""
            parts.append(part)
            total += len(part)
            if total > limit:
                raise _too_large(CODEC_LZ4, limit)
            if decompressor.eof or decompressor.needs_input:
                break
            wanted = min(limit + 1 - total, 2 * wanted)  # more output is pending
    except RuntimeError as error:
        raise DecompressionRefused(f"the lz4 data does not decompress ({error})") from error
    if not decompressor.eof:
        raise DecompressionRefused("the lz4 frame is truncated")
    return b"".join(parts)


def _zstd(data: bytes, limit: int) -> bytes:
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    parts, total, wanted = [], 0, min(limit + 1, _FIRST_PART_BYTES)
    try:
        while part := reader.read(wanted):
            parts.append(part)
            total += len(part)
            if total > limit:
                raise _too_large(CODEC_ZSTD, limit)
            wanted = min(limit + 1 - total, 2 * wanted)
    except zstandard.ZstdError as error:
        raise DecompressionRefused(f"the zstd data does not decompress ({error})") from error
    return b"".join(parts)


_DECOMPRESS = {CODEC_GZIP: _gzip, CODEC_SNAPPY: _snappy, CODEC_LZ4: _lz4, CODEC_ZSTD: _zstd}


def decompress(codec: int, data: bytes, limit: int) -> bytes:
    """The records of a batch compressed with `codec`, at most `limit` bytes of them."""
    if codec not in _DECOMPRESS:
        raise DecompressionRefused(f"compression codec {codec} is unknown: expected one of {sorted(CODEC_NAMES)}")
    return _DECOMPRESS[codec](data, limit)


def compress(codec: int, records: bytes, level: int | None) -> bytes:
    """A batch's records section compressed with `codec` (not CODEC_NONE) at `level` (None: the codec's default)."""
    if codec == CODEC_GZIP:
        return encoders.gzip_encode(records, compresslevel=level)
    if codec == CODEC_SNAPPY:
        return encoders.snappy_encode(records)
    if codec == CODEC_LZ4:
        return encoders.lz4_encode(records, level=level)
    return encoders.zstd_encode(records, level=level)


def batch_codec(batch: bytes) -> int:
    """The codec of a RecordBatch (its attributes' low three bits)."""
    (attributes,) = _ATTRIBUTES.unpack_from(batch, DefaultRecordBatch.ATTRIBUTES_OFFSET)
    return attributes & DefaultRecordBatch.CODEC_MASK


def add_attributes(batch: bytearray, bits: int) -> None:
    """Sets attribute bits of a batch (DefaultRecordBatch's masks); its CRC is then to write again."""
    (attributes,) = _ATTRIBUTES.unpack_from(batch, DefaultRecordBatch.ATTRIBUTES_OFFSET)
    _ATTRIBUTES.pack_into(batch, DefaultRecordBatch.ATTRIBUTES_OFFSET, attributes | bits)


def remove_attributes(batch: bytearray, bits: int) -> None:
    """Clears attribute bits of a batch (add_attributes' counterpart); its CRC is then to write again."""
    (attributes,) = _ATTRIBUTES.unpack_from(batch, DefaultRecordBatch.ATTRIBUTES_OFFSET)
    _ATTRIBUTES.pack_into(batch, DefaultRecordBatch.ATTRIBUTES_OFFSET, attributes & ~bits)


def with_records(batch: bytes, records: bytes, codec: int) -> bytearray:
    """The batch's header over other `records`, which are in `codec`: its codec bits and its length
    written again (not its CRC, which with_crc writes when the batch is to be sent or stored)."""
    rewrapped = bytearray(batch[:HEADER_BYTES]) + records
    (attributes,) = _ATTRIBUTES.unpack_from(rewrapped, DefaultRecordBatch.ATTRIBUTES_OFFSET)
    _ATTRIBUTES.pack_into(
        rewrapped, DefaultRecordBatch.ATTRIBUTES_OFFSET, (attributes & ~DefaultRecordBatch.CODEC_MASK) | codec
    )
    _LENGTH.pack_into(rewrapped, _LENGTH_OFFSET, len(rewrapped) - DefaultRecordBatch.AFTER_LEN_OFFSET)
    return rewrapped


def batch_crc(batch: bytes | bytearray) -> int:
    """The CRC-32C a RecordBatch's header must carry: of everything from its attributes on."""
    return calc_crc32c(memoryview(batch)[DefaultRecordBatch.ATTRIBUTES_OFFSET :])


def with_crc(batch: bytearray) -> bytes:
    """The batch with its CRC written again (batch_crc)."""
    _CRC.pack_into(batch, DefaultRecordBatch.CRC_OFFSET, batch_crc(batch))
    return bytes(batch)


def recompressed(batch: bytes, codec: int, level: int | None, records_limit: int) -> bytes:
    """The RecordBatch with its records section in `codec` (at `level`): decompressed, at most
    `records_limit` bytes of it, and compressed again; its header rewritten. Only the records
    section, the codec bits, the length and the CRC change."""
    current = batch_codec(batch)
    records = batch[HEADER_BYTES:]
    if current != CODEC_NONE:
        records = decompress(current, records, records_limit)
    if codec != CODEC_NONE:
        records = compress(codec, records, level)
    return with_crc(with_records(batch, records, codec))
