"""The data source's columns, and their conversion from and to Arrow record batches (what Python data
sources exchange with Spark fastest: no Row object per record).

Read: `key`, `value` (string, or binary with the option binary=true), `headers` (array of
struct<key: string, value: string|binary>), `partition` (int), `offset` (long), `timestamp`
(timestamp). A user schema (`spark.read.schema(...)`) may pick, reorder or retype (string or
binary) these columns.
Write: `value` (string or binary, null allowed), and optionally `key` (string or binary),
`partition` (an integer type; null: Kafka's default partitioner, murmur2 of the key), `headers`
(array of struct<key, value> or map<string, string|binary>) and `timestamp` (timestamp, or long
milliseconds). Other columns (a read's `offset`, say) are ignored, so a read DataFrame writes back
as is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from txbroker.records import ConsumerRecord

READ_COLUMNS = ("key", "value", "headers", "partition", "offset", "timestamp")
WRITE_COLUMNS = ("key", "value", "partition", "headers", "timestamp")
_TEXT = (StringType, BinaryType)
_INTEGER = (ByteType, ShortType, IntegerType, LongType)


class SchemaError(ValueError):
    """A DataFrame schema the txbroker data source cannot read into or write from."""


def read_schema(binary: bool = False) -> StructType:
    text: DataType = BinaryType() if binary else StringType()
    return StructType(
        [
            StructField("key", text),
            StructField("value", text),
            StructField(
                "headers", ArrayType(StructType([StructField("key", StringType()), StructField("value", text)]))
            ),
            StructField("partition", IntegerType(), False),
            StructField("offset", LongType(), False),
            StructField("timestamp", TimestampType(), False),
        ]
    )


def _is(data_type: DataType, kinds: tuple[type, ...]) -> bool:
    return isinstance(data_type, kinds)


def _header_struct_ok(element: DataType) -> bool:
    return (
        isinstance(element, StructType)
        and [f.name for f in element.fields] == ["key", "value"]
        and isinstance(element["key"].dataType, StringType)
        and _is(element["value"].dataType, _TEXT)
    )


def _headers_ok(data_type: DataType) -> bool:
    if isinstance(data_type, ArrayType):
        return _header_struct_ok(data_type.elementType)
    return (
        isinstance(data_type, MapType) and isinstance(data_type.keyType, StringType) and _is(data_type.valueType, _TEXT)
    )


# ---- reading: ConsumerRecords -> an Arrow record batch of the query's schema


def _decode(data: bytes | None) -> str | None:
    # The SDK hands out bytes; bytes that are not UTF-8 become U+FFFD (read with binary=true to keep them).
    return None if data is None else data.decode("utf-8", "replace")


def _column(field: StructField) -> Callable[[Sequence[ConsumerRecord]], list]:
    name, data_type = field.name, field.dataType
    if name in ("key", "value"):
        if not _is(data_type, _TEXT):
            raise SchemaError(f"column {name!r} must be string or binary, not {data_type.simpleString()}")
        if isinstance(data_type, BinaryType):
            return (lambda rs: [r.key for r in rs]) if name == "key" else (lambda rs: [r.value for r in rs])
        return (
            (lambda rs: [_decode(r.key) for r in rs]) if name == "key" else (lambda rs: [_decode(r.value) for r in rs])
        )
    if name == "headers":
        if not (isinstance(data_type, ArrayType) and _header_struct_ok(data_type.elementType)):
            raise SchemaError(
                "column 'headers' must be array<struct<key: string, value: string or binary>>, not "
                f"{data_type.simpleString()}"
            )
        binary = isinstance(data_type.elementType["value"].dataType, BinaryType)
        return lambda rs: [[{"key": k, "value": v if binary else _decode(v)} for k, v in r.headers] for r in rs]
    if name == "partition" and _is(data_type, _INTEGER):
        return lambda rs: [r.partition for r in rs]
    if name == "offset" and isinstance(data_type, LongType):
        return lambda rs: [r.offset for r in rs]
    if name == "timestamp" and isinstance(data_type, TimestampType):
        return lambda rs: [r.timestamp_ms * 1000 for r in rs]  # Spark's timestamps are microseconds
    if name in READ_COLUMNS:
        raise SchemaError(
            f"column {name!r} cannot be read as {data_type.simpleString()}: see {read_schema().simpleString()}"
        )
    raise SchemaError(f"the txbroker data source has no column {name!r}; its columns: {', '.join(READ_COLUMNS)}")


class RecordBatchBuilder:
    """Turns fetched records into Arrow record batches with exactly the Arrow schema Spark expects
    for the query's schema (Spark checks it)."""

    def __init__(self, schema: StructType) -> None:
        self._columns = [_column(field) for field in schema.fields]
        self._arrow = to_arrow_schema(schema, timezone="UTC")

    def build(self, records: Sequence[ConsumerRecord]) -> pa.RecordBatch:
        arrays = [
            pa.array(column(records), type=arrow_field.type) for column, arrow_field in zip(self._columns, self._arrow)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self._arrow)


def check_read_schema(schema: StructType) -> None:
    for field in schema.fields:
        _column(field)


# ---- writing: an Arrow record batch of the DataFrame -> (key, value, partition, headers, timestamp)


def check_write_schema(schema: StructType) -> None:
    """Fails at planning, with what to change, for a DataFrame the sink cannot write."""
    names = {field.name: field.dataType for field in schema.fields}
    if "value" not in names:
        raise SchemaError(
            f"writing to txbroker needs a 'value' column (string or binary); the DataFrame has "
            f"{sorted(names)}: select one, e.g. df.selectExpr('CAST(x AS STRING) AS value')"
        )
    for name in ("key", "value"):
        if name in names and not _is(names[name], _TEXT):
            raise SchemaError(
                f"column {name!r} must be string or binary, not {names[name].simpleString()}: "
                f"cast or serialize it (to_json, CAST(... AS STRING))"
            )
    if "partition" in names and not _is(names["partition"], _INTEGER):
        raise SchemaError(f"column 'partition' must be an integer type, not {names['partition'].simpleString()}")
    if "headers" in names and not _headers_ok(names["headers"]):
        raise SchemaError(
            "column 'headers' must be array<struct<key: string, value: string or binary>> or "
            f"map<string, string or binary>, not {names['headers'].simpleString()}"
        )
    if "timestamp" in names and not _is(names["timestamp"], (TimestampType, TimestampNTZType, LongType)):
        raise SchemaError(
            "column 'timestamp' must be a timestamp or a long (epoch milliseconds), not "
            f"{names['timestamp'].simpleString()}"
        )


def _headers(value) -> list[tuple[str, object]] | None:
    if not value:
        return None
    if isinstance(value[0], dict):  # array<struct<key, value>>
        return [(h["key"], h["value"]) for h in value]
    return list(value)  # map<string, ...>: Arrow gives (key, value) pairs


def _timestamps_ms(column: pa.Array) -> list[int | None]:
    if pa.types.is_timestamp(column.type):
        micros = column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64()).to_pylist()
        return [None if t is None else t // 1000 for t in micros]
    return column.to_pylist()


def write_rows(batch: pa.RecordBatch) -> Iterator[tuple]:
    """(key, value, partition, headers, timestamp_ms) of each row, None where the column is absent."""
    count = batch.num_rows
    names = batch.schema.names
    absent = [None] * count

    def column(name: str) -> list:
        return batch.column(names.index(name)).to_pylist() if name in names else absent

    headers = [_headers(h) for h in column("headers")] if "headers" in names else absent
    timestamps = _timestamps_ms(batch.column(names.index("timestamp"))) if "timestamp" in names else absent
    return zip(column("key"), column("value"), column("partition"), headers, timestamps)
