"""The Spark source's task side (spark_client.reader.read_range) driven directly, without Spark: one
planned offset range read against a real server over HTTP on a real PostgreSQL.
(test_spark_write.py and test_spark_streaming.py read through Spark.)"""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.streaming.datasource import ReadAllAvailable  # noqa: E402

from spark_client.columns import read_schema  # noqa: E402
from spark_client.options import read_options  # noqa: E402
from spark_client.reader import DataLossError, OffsetRange, TxbrokerStreamReader, read_range  # noqa: E402
from txbroker import Admin, Producer, TopicPartition  # noqa: E402


def values(options, split: OffsetRange) -> list[str]:
    return [value for batch in read_range(options, read_schema(), split) for value in batch.column("value").to_pylist()]


def test_a_range_whose_records_were_deleted_since_it_was_planned_fails_unless_told_to_skip(server):
    with Admin(server.url) as admin, Producer(server.url) as producer:
        admin.create_topic("in")
        for i in range(10):
            producer.send("in", f"v{i}", partition=0)
        producer.flush()
        # A micro-batch planned (or checkpointed) as [2, 8), then DeleteRecords (or retention)
        # moves the log start to 5 before the range is read.
        split = OffsetRange("in", 0, 2, 8)
        admin.delete_records({TopicPartition("in", 0): 5})

    options = {"url": server.url, "topic": "in"}
    with pytest.raises(DataLossError, match=r"in-0 from offset 2 to 8: .*expected 5 .*to 10 .*failOnDataLoss to false"):
        values(read_options(options, streaming=True), split)
    skipping = read_options({**options, "failOnDataLoss": "false"}, streaming=True)
    assert values(skipping, split) == ["v5", "v6", "v7"]
    assert values(read_options(options, streaming=True), OffsetRange("in", 0, 5, 8)) == ["v5", "v6", "v7"]


def test_a_stream_whose_topic_was_re_created_fails_unless_told_to_read_it_again(server):
    def produce(count: int) -> None:
        with Producer(server.url) as producer:
            for i in range(count):
                producer.send("in", f"v{i}", partition=0)

    options = {"url": server.url, "topic": "in", "startingOffsets": "earliest"}
    with Admin(server.url) as admin:
        admin.create_topic("in")
        produce(10)
        reader = TxbrokerStreamReader(read_options(options, streaming=True), read_schema())
        checkpointed = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
        assert checkpointed == {"in": {"0": 10}}
        admin.delete_topic("in")
        admin.create_topic("in")
        produce(3)

    # The query restarts from its checkpoint: offset 10 of a topic that now ends at 3.
    restarted = TxbrokerStreamReader(read_options(options, streaming=True), read_schema())
    with pytest.raises(DataLossError, match=r"in-0 ends at offset 3 .*before the stream's position 10: .*re-created"):
        restarted.latestOffset(checkpointed, ReadAllAvailable())

    lenient = read_options({**options, "failOnDataLoss": "false"}, streaming=True)
    restarted = TxbrokerStreamReader(lenient, read_schema())
    end = restarted.latestOffset(checkpointed, ReadAllAvailable())
    assert end == {"in": {"0": 3}}
    [split] = restarted.partitions(checkpointed, end)
    assert values(lenient, split) == ["v0", "v1", "v2"]
