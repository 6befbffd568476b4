"""Unit tests of app/storage/log/record_codec.py: how records are validated, sized, stored and rendered."""

from __future__ import annotations

import base64
import tracemalloc
from dataclasses import dataclass, field

import orjson
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from app import record_batch_codecs as codecs
from app.errors import BrokerError, ErrorCode
from app.storage.log import record_codec
from app.storage.log.record_codec import (
    BASE64,
    FORM_BASE64,
    FORM_TEXT,
    UTF8,
    decode_base64,
    decode_payload,
    encode_batch,
    render_record,
    render_records,
)

NOW = 1_700_000_000_000


@dataclass
class H:
    key: str
    value: str | None


@dataclass
class R:
    key: str | None = None
    value: str | None = None
    headers: list = field(default_factory=list)
    timestamp_ms: int | None = None


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def stored_of(batch) -> list:
    return orjson.loads(batch.payload)


def invalid(excinfo) -> BrokerError:
    error = excinfo.value
    assert isinstance(error, BrokerError)
    assert error.code == ErrorCode.INVALID_REQUEST
    assert error.http_status == 400
    return error


# ---- encode_batch: utf8


def test_utf8_batch_stores_text_form_with_all_fields():
    batch = encode_batch([R("k", "v", [H("h", "hv"), H("n", None)], 5)], UTF8, NOW, "partitions[0].records")
    assert stored_of(batch) == [[5, "k", "v", [["h", "hv"], ["n", None]], FORM_TEXT]]
    assert batch.record_count == 1


def test_utf8_sizes_count_utf8_bytes_not_characters():
    # key é (2 bytes) + value 日本 (6) + header key ü (2) + header value 😀 (4) = 14 bytes, 5 characters.
    batch = encode_batch([R("é", "日本", [H("ü", "😀")])], UTF8, NOW, "p")
    assert batch.size_bytes == 14
    assert batch.largest_record_bytes == 14


def test_ascii_sizes_are_lengths():
    batch = encode_batch([R("key", "value", [H("hk", "hv")])], UTF8, NOW, "p")
    assert batch.size_bytes == 3 + 5 + 2 + 2


def test_null_key_value_and_header_value_count_zero_bytes():
    batch = encode_batch([R(None, None, [H("h", None)])], UTF8, NOW, "p")
    assert batch.size_bytes == 1
    assert stored_of(batch) == [[NOW, None, None, [["h", None]], FORM_TEXT]]


def test_empty_strings_are_stored_as_empty_not_null():
    batch = encode_batch([R("", "", [H("", "")])], UTF8, NOW, "p")
    assert stored_of(batch) == [[NOW, "", "", [["", ""]], FORM_TEXT]]
    assert batch.size_bytes == 0


def test_total_size_sums_records_and_largest_is_the_max():
    batch = encode_batch([R(value="ab"), R(value="ééé"), R(key="k", value="x")], UTF8, NOW, "p")
    assert batch.size_bytes == 2 + 6 + 2
    assert batch.largest_record_bytes == 6
    assert batch.record_count == 3


def test_timestamps_default_to_now_and_first_and_max_are_tracked():
    batch = encode_batch([R(value="a", timestamp_ms=50), R(value="b"), R(value="c", timestamp_ms=10)], UTF8, NOW, "p")
    assert [record[0] for record in stored_of(batch)] == [50, NOW, 10]
    assert batch.first_timestamp_ms == 50
    assert batch.max_timestamp_ms == NOW


def test_timestamp_zero_is_kept_not_replaced_by_now():
    batch = encode_batch([R(value="a", timestamp_ms=0)], UTF8, NOW, "p")
    assert stored_of(batch)[0][0] == 0
    assert batch.first_timestamp_ms == 0 and batch.max_timestamp_ms == 0


def test_negative_timestamp_is_invalid_request_naming_the_record():
    with pytest.raises(BrokerError) as excinfo:
        encode_batch([R(value="a"), R(value="b", timestamp_ms=-3)], UTF8, NOW, "partitions[2].records")
    error = invalid(excinfo)
    assert "partitions[2].records[1]" in error.message
    assert "timestamp_ms" in error.message and "-3" in error.message


@pytest.mark.parametrize(
    ("record", "field_name"),
    [
        (R(key="\ud800"), "key"),
        (R(value="ok\udfffok"), "value"),
        (R(headers=[H("\ud800", "v")]), "header key"),
        (R(headers=[H("k", "\udc00")]), "header value"),
    ],
)
def test_lone_surrogate_in_utf8_is_invalid_request_naming_field(record, field_name):
    with pytest.raises(BrokerError) as excinfo:
        encode_batch([R(value="fine"), record], UTF8, NOW, "partitions[0].records")
    error = invalid(excinfo)
    assert "partitions[0].records[1]" in error.message
    assert field_name in error.message
    assert "surrogate" in error.message


def test_surrogate_pair_written_as_real_emoji_is_fine():
    batch = encode_batch([R(value="😀")], UTF8, NOW, "p")
    assert batch.size_bytes == 4


def test_unknown_encoding_is_invalid_request():
    with pytest.raises(BrokerError) as excinfo:
        encode_batch([R(value="a")], "latin1", NOW, "p")
    assert "latin1" in invalid(excinfo).message


# ---- encode_batch: base64


def test_base64_of_utf8_bytes_is_stored_as_text_form():
    batch = encode_batch([R(b64("clé".encode()), b64("☃".encode()), [H("h", b64(b"x"))])], BASE64, NOW, "p")
    assert stored_of(batch) == [[NOW, "clé", "☃", [["h", "x"]], FORM_TEXT]]


def test_base64_of_non_utf8_bytes_is_stored_in_base64_form():
    raw = bytes([0xFF, 0x00, 0xFE, 0x80])
    batch = encode_batch([R(b64(b"k"), b64(raw), [H("h", b64(b"\xc3"))])], BASE64, NOW, "p")
    [[ts, key, value, headers, form]] = stored_of(batch)
    assert form == FORM_BASE64
    assert base64.b64decode(key) == b"k"
    assert base64.b64decode(value) == raw
    assert headers == [["h", b64(b"\xc3")]]


def test_form_is_chosen_per_record():
    batch = encode_batch([R(value=b64(b"text")), R(value=b64(b"\xff")), R(value=b64(b"more"))], BASE64, NOW, "p")
    assert [record[4] for record in stored_of(batch)] == [FORM_TEXT, FORM_BASE64, FORM_TEXT]


def test_base64_sizes_count_decoded_bytes():
    # 'AAECAw==' is 4 bytes, header key 'hé' is 3 UTF-8 bytes, header value 2 bytes.
    batch = encode_batch([R(key=None, value="AAECAw==", headers=[H("hé", b64(b"\xff\xfe"))])], BASE64, NOW, "p")
    assert batch.size_bytes == 4 + 3 + 2


def test_base64_nulls_stay_null():
    batch = encode_batch([R(None, None, [H("h", None)])], BASE64, NOW, "p")
    assert stored_of(batch) == [[NOW, None, None, [["h", None]], FORM_TEXT]]


def test_base64_empty_string_is_empty_bytes_not_null():
    batch = encode_batch([R("", "")], BASE64, NOW, "p")
    assert stored_of(batch)[0][1:3] == ["", ""]


@pytest.mark.parametrize("bad", ["!!!!", "YQ", "YQ=", "YQ==\n", "Y Q==", "é", "YQ==YQ", "-_-_"])
def test_invalid_base64_value_is_invalid_request(bad):
    with pytest.raises(BrokerError) as excinfo:
        encode_batch([R(value=b64(b"ok")), R(value=bad)], BASE64, NOW, "partitions[1].records")
    error = invalid(excinfo)
    assert "partitions[1].records[1]" in error.message
    assert "value" in error.message and "base64" in error.message


def test_invalid_base64_key_names_key():
    with pytest.raises(BrokerError) as excinfo:
        encode_batch([R(key="%%%")], BASE64, NOW, "w")
    error = invalid(excinfo)
    assert "key" in error.message and "'%%%'" in error.message


def test_invalid_base64_header_value_names_header():
    with pytest.raises(BrokerError) as excinfo:
        encode_batch([R(headers=[H("a", "AA=="), H("b", "*")])], BASE64, NOW, "w")
    error = invalid(excinfo)
    assert "w[0].headers[1]" in error.message and "header value" in error.message


def test_header_key_lone_surrogate_rejected_in_base64_mode_too():
    with pytest.raises(BrokerError) as excinfo:
        encode_batch([R(headers=[H("\ud800", "AA==")])], BASE64, NOW, "w")
    assert "header key" in invalid(excinfo).message


def test_decode_base64_of_none_is_none_and_valid_text_decodes():
    assert decode_base64("key", None, "w") is None
    assert decode_base64("key", "AP8=", "w") == b"\x00\xff"


def test_invalid_base64_message_truncates_huge_input():
    with pytest.raises(BrokerError) as excinfo:
        decode_base64("value", "!" * 100_000, "w")
    assert len(invalid(excinfo).message) < 1000


# ---- render_record


def test_render_text_form_in_utf8_is_unchanged_without_encoding_marker():
    rendered = render_record([7, "k", "v", [["h", "x"], ["n", None]], FORM_TEXT], 42, UTF8)
    assert rendered == {
        "offset": 42,
        "key": "k",
        "value": "v",
        "headers": [{"key": "h", "value": "x"}, {"key": "n", "value": None}],
        "timestamp_ms": 7,
    }


def test_render_text_form_in_base64_encodes_utf8_bytes():
    rendered = render_record([7, "é", "😀", [["h", "日"], ["n", None]], FORM_TEXT], 0, BASE64)
    assert rendered["key"] == b64("é".encode())
    assert rendered["value"] == b64("😀".encode())
    assert rendered["headers"] == [{"key": "h", "value": b64("日".encode())}, {"key": "n", "value": None}]
    assert "encoding" not in rendered


def test_render_text_form_nulls_stay_null_in_base64():
    rendered = render_record([7, None, None, [], FORM_TEXT], 0, BASE64)
    assert rendered["key"] is None and rendered["value"] is None


def test_render_base64_form_in_utf8_is_marked_base64():
    rendered = render_record([7, "AP8=", "gA==", [["h", "/w=="]], FORM_BASE64], 3, UTF8)
    assert rendered["encoding"] == "base64"
    assert rendered["key"] == "AP8=" and rendered["value"] == "gA=="
    assert rendered["headers"] == [{"key": "h", "value": "/w=="}]


def test_render_base64_form_in_base64_is_unmarked():
    rendered = render_record([7, "AP8=", "gA==", [], FORM_BASE64], 3, BASE64)
    assert rendered["value"] == "gA==" and "encoding" not in rendered


@pytest.mark.parametrize("write_encoding", [UTF8, BASE64])
@pytest.mark.parametrize("read_encoding", [UTF8, BASE64])
def test_round_trip_through_payload_is_byte_exact(write_encoding, read_encoding):
    originals = [
        (b"k", b"plain", [("h", b"v")]),
        ("ключ".encode(), "😀 ü 日本".encode(), [("é", "☃".encode()), ("none", None)]),
        (None, None, []),
        (b"", b"", [("", b"")]),
    ]
    if write_encoding == BASE64:
        originals.append((b"\xff\x00", bytes(range(256)), [("bin", b"\x80\x81")]))

    def enc(raw):
        if raw is None:
            return None
        return b64(raw) if write_encoding == BASE64 else raw.decode("utf-8")

    records = [R(enc(k), enc(v), [H(hk, enc(hv)) for hk, hv in hs], 1000 + i) for i, (k, v, hs) in enumerate(originals)]
    batch = encode_batch(records, write_encoding, NOW, "p")
    stored = decode_payload(batch.payload)
    for index, ((key, value, headers), row) in enumerate(zip(originals, stored)):
        rendered = render_record(row, 100 + index, read_encoding)

        def dec(text, rendered=rendered):
            if text is None:
                return None
            if read_encoding == BASE64 or rendered.get("encoding") == BASE64:
                return base64.b64decode(text)
            return text.encode("utf-8")

        assert rendered["offset"] == 100 + index
        assert rendered["timestamp_ms"] == 1000 + index
        assert dec(rendered["key"]) == key
        assert dec(rendered["value"]) == value
        assert [(h["key"], dec(h["value"])) for h in rendered["headers"]] == headers


def test_encodings_constant_lists_both():
    assert set(record_codec.ENCODINGS) == {"utf8", "base64"}


@pytest.mark.parametrize("read_encoding", [UTF8, BASE64])
def test_render_records_writes_the_same_json_as_render_record_and_skips_holes(read_encoding):
    stored = [
        [1, "k", "v", [["h", "x"], ["n", None]], FORM_TEXT],
        None,  # compacted
        [2, None, "no headers", [], FORM_TEXT],
        [3, "AP8=", "gA==", [["h", "/w=="]], FORM_BASE64],
        None,
        [4, "é", "😀", [], FORM_TEXT],
        [5, None, None, [], FORM_BASE64],
    ]
    for start, stop in ((0, 7), (1, 4), (2, 3), (4, 5), (6, 7)):
        expected = [
            render_record(stored[i], 50 + i, read_encoding) for i in range(start, stop) if stored[i] is not None
        ]
        rendered = render_records(stored, 50, start, stop, read_encoding)
        assert orjson.dumps(rendered) == orjson.dumps(expected), (start, stop)


# ---- the RecordBatch form (a Kafka client's batch as stored)


def test_a_record_batch_reads_as_the_json_form_of_the_same_bytes():
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 2**30)
    builder.append(0, 5, b"k", "välue".encode(), [("h", b"x"), ("n", None)])
    builder.append(1, 7, None, None, [])
    builder.append(2, 6, b"\xff", b"v", [("h", b"y")])
    payload = bytes(builder.build())
    assert payload[0] == 0 and record_codec.is_record_batch(payload)
    assert not record_codec.is_record_batch(encode_batch([R("k", "v")], UTF8, NOW, "p").payload)
    assert decode_payload(payload) == [
        [5, "k", "välue", [["h", "x"], ["n", None]], FORM_TEXT],
        [7, None, None, [], FORM_TEXT],
        [6, b64(b"\xff"), b64(b"v"), [["h", b64(b"y")]], FORM_BASE64],
    ]


# ---- reading a stored batch within the bound its door produced it within

MAX = codecs.MAX_RECORDS_BYTES


def compressed_bomb(codec: int, inflated_bytes: int) -> bytes:
    """A RecordBatch of one record (its header says) whose records section, in `codec`, decompresses
    to `inflated_bytes` zeros: what no Kafka producer could have had stored, a few KiB to KiBs."""
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 2**30)
    builder.append(0, NOW, b"k", b"v", [])
    header = bytes(builder.build())[: codecs.HEADER_BYTES]
    return codecs.with_crc(codecs.with_records(header, codecs.compress(codec, bytes(inflated_bytes), None), codec))


@pytest.mark.parametrize(
    "codec", [codecs.CODEC_GZIP, codecs.CODEC_SNAPPY, codecs.CODEC_LZ4, codecs.CODEC_ZSTD], ids=codecs.CODEC_NAMES.get
)
def test_a_stored_batch_beyond_the_bound_is_unreadable_naming_it(codec):
    bomb = compressed_bomb(codec, MAX + 1)
    assert len(bomb) < MAX // 20
    with pytest.raises(record_codec.UnreadableBatch) as refused:
        decode_payload(bomb, 42)
    error = refused.value
    assert (error.code, error.http_status) == (ErrorCode.UNKNOWN_SERVER_ERROR, 500)
    assert error.message.startswith(
        f"the stored batch at offset 42 does not read (the {codecs.CODEC_NAMES[codec]} batch decompresses to "
        f"more than {MAX} bytes)"
    )
    assert "read past the batch (from its last offset + 1)" in error.message


def test_a_bomb_is_not_inflated_beyond_the_bound():
    """Four times the bound, refused after at most the bound's bytes were produced."""
    bomb = compressed_bomb(codecs.CODEC_ZSTD, 4 * MAX)
    tracemalloc.start()
    try:
        with pytest.raises(record_codec.UnreadableBatch):
            decode_payload(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MAX + MAX // 4


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b'[[1, "k", ', "unexpected end of data"),  # a JSON-form row cut short
        (b"", "IndexError"),
    ],
)
def test_a_stored_batch_that_does_not_parse_is_unreadable(payload, reason):
    with pytest.raises(record_codec.UnreadableBatch, match="does not read") as refused:
        decode_payload(payload)
    assert reason in refused.value.message


def test_a_record_batch_whose_records_do_not_parse_is_unreadable():
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 2**30)
    builder.append(0, NOW, b"k", b"v" * 100, [])
    batch = bytes(builder.build())
    cut = codecs.with_records(batch, batch[codecs.HEADER_BYTES : -50], codecs.CODEC_NONE)  # its record cut short
    with pytest.raises(record_codec.UnreadableBatch, match="the stored batch at offset 3 does not read"):
        decode_payload(bytes(cut), 3)
