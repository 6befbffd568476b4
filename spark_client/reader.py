"""Reading a topic: `spark.read` (TxbrokerBatchReader) and `spark.readStream` (TxbrokerStreamReader).

Both split the work by topic partition: one Spark task reads one partition's offset range
[start, end) with the SDK's Consumer, and hands Spark Arrow record batches. Under read_committed
`end` is at most the partition's last stable offset when the range was planned, so every
transaction in the range was decided by then: a range reads the same records every time it is read,
never a record of an aborted or still-open transaction -- which is what makes a micro-batch
replayable after a failure, and the stream's checkpointed offsets exact.

Offsets of a stream are `{"<topic>": {"<partition>": <next offset>, ...}}`, as Kafka's source writes
them. Offsets count control records (transaction markers) and aborted records too, so a range of n
offsets holds at most n records; maxRecordsPerTrigger bounds offsets, hence records.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from spark_client.columns import RecordBatchBuilder, check_read_schema
from spark_client.options import EARLIEST, LATEST, ReadOptions
from txbroker import Admin, Consumer, TopicPartition
from txbroker.errors import OffsetOutOfRangeError

STALL_TIMEOUT_S = 120


class DataLossError(RuntimeError):
    """Offsets of a planned range were deleted before the range was read (failOnDataLoss=true)."""


@dataclass
class OffsetRange(InputPartition):
    """One task's work: the records of a partition with start <= offset < end."""

    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class PartitionBounds:
    log_start: int
    end: int  # what a reader may read up to: the last stable offset under read_committed, else the high watermark
    high_watermark: int  # the log's end: no position of a reader is ever past it


def partition_bounds(options: ReadOptions) -> dict[int, PartitionBounds]:
    with Admin(options.connection.url, **options.connection.client_config) as admin:
        described = admin.describe_topic(options.topic)
    end = "last_stable_offset" if options.isolation_level == "read_committed" else "high_watermark"
    return {
        p["partition"]: PartitionBounds(p["log_start_offset"], p[end], p["high_watermark"])
        for p in described["partitions"]
    }


def resolve(spec: str | Mapping[int, int], partition: int, bounds: PartitionBounds, default: str) -> int:
    """An offset of startingOffsets/endingOffsets for one partition: earliest is the log start, latest
    the end; an offset asked for is kept, but never past the log's end (the high watermark). Not
    past the end only: under read_committed an open transaction holds the end back, and moving a
    start asked for back to it would read records before that start (starting_offset checks the
    log start)."""
    wanted = (
        spec.get(partition, EARLIEST if default == "earliest" else LATEST)
        if isinstance(spec, Mapping)
        else (EARLIEST if spec == "earliest" else LATEST)
    )
    if wanted == EARLIEST:
        return bounds.log_start
    if wanted == LATEST:
        return bounds.end
    return min(wanted, bounds.high_watermark)


def starting_offset(options: ReadOptions, partition: int, bounds: PartitionBounds, default: str) -> int:
    """Where a read of the partition starts (startingOffsets). An offset asked for that is below the
    log start was deleted: as Kafka's source, a DataLossError unless failOnDataLoss is false (then the
    log start)."""
    start = resolve(options.starting_offsets, partition, bounds, default)
    if start >= bounds.log_start:
        return start
    if options.fail_on_data_loss:
        raise DataLossError(
            f"option startingOffsets asks for offset {start} of {options.topic}-{partition}, but the partition's "
            f"log starts at {bounds.log_start}: the records before it were deleted (retention, DeleteRecords). "
            f"Start from an offset the log holds ('earliest' is {bounds.log_start}), or set the option "
            f"failOnDataLoss to false to start at the log start"
        )
    return bounds.log_start


def read_range(options: ReadOptions, schema: StructType, split: OffsetRange) -> Iterator[pa.RecordBatch]:
    """The records of the range, as Arrow record batches of `schema`."""
    if split.start >= split.end:
        return
    builder = RecordBatchBuilder(schema)
    tp = TopicPartition(split.topic, split.partition)
    fetch = options.max_records_per_fetch
    with Consumer(
        options.connection.url,
        isolation_level=options.isolation_level,
        # An offset that is gone: OffsetOutOfRangeError, or on from the log start (failOnDataLoss=false).
        auto_offset_reset="none" if options.fail_on_data_loss else "earliest",
        enable_auto_commit=False,
        max_poll_records=fetch,
        fetch_max_records=fetch,
        **options.connection.client_config,
    ) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, split.start)
        position, progressed_at = split.start, time.monotonic()
        while position < split.end:
            try:
                records = consumer.poll(timeout_ms=0)
            except OffsetOutOfRangeError as error:
                raise DataLossError(
                    f"reading {split.topic}-{split.partition} from offset {position} to {split.end}: the "
                    f"offset is no longer in the log (the server: {error.message}). Records of this range "
                    f"were deleted (retention, DeleteRecords, or the topic was re-created) after it was "
                    f"planned or checkpointed, and cannot be read. To skip what is gone and read on from "
                    f"the log start, set the option failOnDataLoss to false"
                ) from error
            if records and records[-1].offset >= split.end:
                records = [r for r in records if r.offset < split.end]
            if records:
                yield builder.build(records)
            new_position = consumer.position(tp)
            if new_position != position:
                position, progressed_at = new_position, time.monotonic()
            elif time.monotonic() - progressed_at > STALL_TIMEOUT_S:
                raise TimeoutError(
                    f"reading {tp} from {position} to {split.end}: no progress for {STALL_TIMEOUT_S}s: the "
                    f"fetches brought nothing in that time (is the server up, and its PostgreSQL? the fetches' "
                    f"errors are in this worker's log, logger txbroker.consumer), or the topic was deleted or "
                    f"truncated"
                )
            else:
                time.sleep(0.05)  # nothing fetched and nothing skipped: the server is catching up


class TxbrokerBatchReader(DataSourceReader):
    """`spark.read`: the offsets between startingOffsets and endingOffsets, fixed at planning."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        check_read_schema(schema)
        self.options = options
        self.schema = schema

    def partitions(self) -> list[OffsetRange]:
        options = self.options
        ranges = []
        for partition, bounds in sorted(partition_bounds(options).items()):
            start = starting_offset(options, partition, bounds, "earliest")
            end = min(resolve(options.ending_offsets, partition, bounds, "latest"), bounds.end)
            if start < end:
                ranges.append(OffsetRange(options.topic, partition, start, end))
        return ranges

    def read(self, partition: OffsetRange) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, self.schema, partition)


class TxbrokerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream`: micro-batches of new offsets, read_committed by default. Lives in one
    driver-side process for the whole query (its state: the Trigger.AvailableNow target)."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        check_read_schema(schema)
        self.options = options
        self.schema = schema
        self._target: dict[int, int] | None = None

    # offsets <-> {"<topic>": {"<partition>": offset}}

    def _to_json(self, offsets: Mapping[int, int]) -> dict:
        return {self.options.topic: {str(p): offsets[p] for p in sorted(offsets)}}

    def _from_json(self, offsets: dict) -> dict[int, int]:
        if self.options.topic not in offsets:
            raise ValueError(
                f"the checkpointed offsets {offsets} are not of topic {self.options.topic!r}: a "
                f"checkpoint belongs to one query; use a new checkpointLocation for another topic"
            )
        return {int(p): int(o) for p, o in offsets[self.options.topic].items()}

    def _positions(self, start: Mapping[int, int]) -> tuple[dict[int, int], dict[int, int]]:
        """(begin, latest) of every partition: `start` (a partition new since has its log start),
        and its end now, never below its begin."""
        begin, latest = dict(start), {}
        for partition, bounds in partition_bounds(self.options).items():
            begin.setdefault(partition, bounds.log_start)
            if bounds.high_watermark < begin[partition]:
                # A log's end never goes back in a topic's life: the topic was deleted and re-created
                # since `start` was planned or checkpointed. (The last stable offset may be below a
                # position: one that startingOffsets asked for past an open transaction.)
                if self.options.fail_on_data_loss:
                    raise DataLossError(
                        f"{self.options.topic}-{partition} ends at offset {bounds.high_watermark} (its high "
                        f"watermark), before the stream's position {begin[partition]}: the topic was deleted and "
                        f"re-created since, so its records before the position are gone, and the new topic's "
                        f"would be taken for old ones. Start the query with a new checkpointLocation, or set the "
                        f"option failOnDataLoss to false to read the partition again from its log start"
                    )
                begin[partition] = bounds.log_start  # partitions() reads it from its log start
            latest[partition] = max(begin[partition], bounds.end)
        return begin, latest

    def initialOffset(self) -> dict:
        return self._to_json(
            {
                partition: starting_offset(self.options, partition, bounds, "latest")
                for partition, bounds in partition_bounds(self.options).items()
            }
        )

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger:
            return ReadMaxRows(self.options.max_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._positions({})[1]

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin, latest = self._positions(self._from_json(start))
        if self._target is not None:  # Trigger.AvailableNow: nothing past what existed when it began
            latest = {p: max(begin[p], min(end, self._target.get(p, begin[p]))) for p, end in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = _capped(begin, latest, limit.max_rows)
        return self._to_json(latest)

    def reportLatestOffset(self) -> dict | None:
        return self._to_json(self._positions({})[1])

    def partitions(self, start: dict, end: dict) -> list[OffsetRange]:
        begin, until = self._from_json(start), self._from_json(end)
        # A partition whose end went back (failOnDataLoss=false, _positions): from its log start.
        begin = {p: 0 if offset > until.get(p, offset) else offset for p, offset in begin.items()}
        return [
            OffsetRange(self.options.topic, p, begin.get(p, 0), until[p])
            for p in sorted(until)
            if begin.get(p, 0) < until[p]
        ]

    def read(self, partition: OffsetRange) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, self.schema, partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: the stream's position lives in Spark's checkpoint, not in a consumer group."""


def _capped(begin: Mapping[int, int], latest: Mapping[int, int], budget: int) -> dict[int, int]:
    """`latest`, with at most `budget` offsets past `begin` in all, shared fairly: each partition
    gets an equal share of what is left, and the share a partition does not need goes to the others.
    What equal shares cannot split (fewer offsets left than partitions wanting them, as when the
    budget is below the number of partitions) goes one offset each to partitions in turn, the turn
    moving with the stream's position: handing it always to the same partitions (the furthest
    behind, say) would starve the others for as long as those keep growing."""
    capped = {p: begin[p] for p in latest}
    waiting = sorted((p for p in latest if latest[p] > begin[p]), key=lambda p: latest[p] - begin[p])
    for i, partition in enumerate(waiting):
        share = budget // (len(waiting) - i)
        if latest[partition] - begin[partition] > share:
            short = sorted(waiting[i:])  # each wants more than the share: all get it
            for each in short:
                capped[each] += share
            budget -= share * len(short)
            turn = sum(begin.values()) % len(short)
            for each in (short[turn:] + short[:turn])[:budget]:
                capped[each] += 1
            break
        capped[partition] = latest[partition]
        budget -= latest[partition] - begin[partition]
    return capped
