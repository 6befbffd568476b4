"""The Spark source's task side (spark_client.reader.read_range) driven directly, without Spark: one
planned offset range read against a real server over HTTP on a real PostgreSQL.
(test_spark_write.py and test_spark_streaming.py read through Spark.)"""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from spark_client.columns import read_schema  # noqa: E402
from spark_client.options import read_options  # noqa: E402
from spark_client.reader import DataLossError, OffsetRange, read_range  # noqa: E402
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
