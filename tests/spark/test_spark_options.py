"""The Spark data source's pure parts, without Spark or a server: option parsing, the names a batch's
transactions and decision live under, the decision record's format, and the stream reader's
fair sharing of maxRecordsPerTrigger."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from spark_client.decisions import Decision, Relation, SinkBatch, SinkStateError  # noqa: E402
from spark_client.faults import Faults, TaskFault  # noqa: E402
from spark_client.options import EARLIEST, LATEST, OptionError, read_options, write_options  # noqa: E402
from spark_client.reader import PartitionBounds, _capped, resolve  # noqa: E402
from txbroker.two_phase import PreparedTransaction  # noqa: E402

URL = "http://127.0.0.1:8080"


def test_read_options_defaults_and_offsets():
    batch = read_options({"URL": URL + "/", "Topic": "in"}, streaming=False)
    assert (batch.connection.url, batch.topic, batch.isolation_level) == (URL, "in", "read_committed")
    assert (batch.starting_offsets, batch.ending_offsets, batch.binary) == ("earliest", "latest", False)
    stream = read_options(
        {
            "url": URL,
            "topic": "in",
            "maxRecordsPerTrigger": "500",
            "binary": "true",
            "startingOffsets": '{"in": {"0": 42, "1": -2}}',
        },
        streaming=True,
    )
    assert stream.starting_offsets == {0: 42, 1: EARLIEST}
    assert (stream.max_records_per_trigger, stream.binary) == (500, True)
    assert read_options({"url": URL, "topic": "in"}, streaming=True).starting_offsets == "latest"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"topic": "in"}, "needs the option 'url'"),
        ({"url": "localhost:8080", "topic": "in"}, "http:// or https://"),
        ({"url": URL}, "needs the option 'topic'"),
        ({"url": URL, "topic": "in", "isolation_level": "dirty"}, "isolation_level"),
        ({"url": URL, "topic": "in", "startingOffsets": "yesterday"}, "startingOffsets"),
        ({"url": URL, "topic": "in", "startingOffsets": '{"other": {"0": 1}}'}, "startingOffsets"),
        # Not an integer offset: 1.5 and true used to be read as 1, and 1e400 failed with an OverflowError.
        ({"url": URL, "topic": "in", "startingOffsets": '{"in": {"0": 1.5}}'}, "startingOffsets"),
        ({"url": URL, "topic": "in", "startingOffsets": '{"in": {"0": true}}'}, "startingOffsets"),
        ({"url": URL, "topic": "in", "startingOffsets": '{"in": {"0": 1e400}}'}, "startingOffsets"),
        ({"url": URL, "topic": "in", "startingOffsets": '{"in": {"x": 1}}'}, "startingOffsets"),
        ({"url": URL, "topic": "in", "maxRecordsPerTrigger": "0"}, "at least 1"),
        ({"url": URL, "topic": "in", "binary": "yes"}, "'true' or 'false'"),
    ],
)
def test_bad_read_options_say_what_is_wrong(options, message):
    with pytest.raises(OptionError, match=message):
        read_options(options, streaming=True)


def test_write_options():
    batch = write_options({"url": URL, "topic": "out", "token": "secret"}, streaming=False)
    assert (batch.sink_id, batch.connection.token, batch.faults) == ("batch", "secret", Faults())
    assert (batch.delivery_timeout_ms, batch.max_block_ms) == (120_000, 60_000)  # the SDK producer's
    tuned = write_options({"url": URL, "topic": "out", "DELIVERY_TIMEOUT_MS": "300000", "max_block_ms": "5000"}, False)
    assert (tuned.producer_config["delivery_timeout_ms"], tuned.producer_config["max_block_ms"]) == (300_000, 5_000)
    with pytest.raises(OptionError, match="'max_block_ms' must be at least 1, not 0"):
        write_options({"url": URL, "topic": "out", "max_block_ms": "0"}, streaming=False)
    with pytest.raises(OptionError, match="needs the option 'sink_id'"):
        write_options({"url": URL, "topic": "out"}, streaming=True)
    with pytest.raises(OptionError, match="sink_id"):
        write_options({"url": URL, "topic": "out", "sink_id": "a/b"}, streaming=True)
    faults = write_options(
        {
            "url": URL,
            "topic": "out",
            "sink_id": "s",
            "_test_faults": '{"fail": [{"partition": 1, "at": "mid_write", "batch": 3}], '
            '"crash_driver_after_decision": 4}',
        },
        streaming=True,
    ).faults
    assert faults == Faults((TaskFault(1, "mid_write", 3),), 4)
    assert faults.tasks[0].applies("mid_write", 3, 1, attempt=0)
    assert not faults.tasks[0].applies("mid_write", 3, 1, attempt=1)


def test_the_delivery_timeout_follows_the_request_timeout_as_the_sdk_producer_requires():
    """The SDK's producer refuses delivery_timeout_ms below linger_ms + request_timeout_ms (Kafka's
    rule): not given, the data source's default grows with a long request_timeout_ms rather than
    failing every task's producer; given too short, the driver says so before any task runs."""
    slow = {"url": URL, "topic": "out", "request_timeout_ms": "150000"}
    assert write_options(slow, streaming=False).delivery_timeout_ms == 150_005  # + the SDK's linger_ms
    with pytest.raises(OptionError, match="'delivery_timeout_ms': delivery_timeout_ms is 120000: expected at least"):
        write_options({**slow, "delivery_timeout_ms": "120000"}, streaming=False)


def test_a_batch_names_its_transactions_and_what_it_sweeps():
    stream = SinkBatch("orders", "out", 12)
    assert stream.transactional_id(3, 1, 57) == "orders/12/3/1-57"
    assert (stream.group_id, stream.sweep_prefix) == ("txbroker-spark.orders", "orders/")
    assert stream.sweeps("orders/12/0/0-1") and stream.sweeps("orders/3/0/0-1")
    assert not stream.sweeps("orders/13/0/0-1") and not stream.sweeps("orders/job-ab/0/0-1")
    job = SinkBatch("batch", "out", job="job-ab")
    assert (job.prefix, job.sweep_prefix) == ("batch/job-ab/", "batch/job-ab/")
    assert job.group_id == "txbroker-spark.batch.job-ab"
    assert job.sweeps("batch/job-ab/0/0-1") and not job.sweeps("batch/job-cd/0/0-1")

    decision = Decision(12, (PreparedTransaction("orders/12/0/0-1", 7, 0),), "q")
    assert Decision.parse(12, decision.metadata()) == decision
    assert [stream.relation(d) for d in (None, Decision(11, ()), decision, Decision(13, ()))] == [
        Relation.UNDECIDED,
        Relation.UNDECIDED,
        Relation.COMMITTED,
        Relation.SUPERSEDED,
    ]
    # Batch 12 of the query that decided it, or of a query unknown; batch 12 of another query.
    assert [stream.relation(decision, q) for q in ("q", None, "other")] == [
        Relation.COMMITTED,
        Relation.COMMITTED,
        Relation.SUPERSEDED,
    ]
    with pytest.raises(SinkStateError):
        Decision.parse(12, "not json")


def test_offsets_resolve_within_the_log():
    bounds = PartitionBounds(log_start=10, end=50, high_watermark=60)
    assert resolve("earliest", 0, bounds, "earliest") == 10
    assert resolve("latest", 0, bounds, "earliest") == 50
    assert resolve({0: 5, 1: 99}, 0, bounds, "earliest") == 5  # deleted: starting_offset decides
    assert resolve({0: 30}, 0, bounds, "earliest") == 30
    assert resolve({0: 55}, 0, bounds, "earliest") == 55  # past an open transaction: kept
    assert resolve({0: 99}, 0, bounds, "earliest") == 60  # past the log's end: its end
    assert resolve({0: LATEST}, 0, bounds, "earliest") == 50
    assert resolve({1: 30}, 0, bounds, "latest") == 50  # a partition the JSON leaves out: the default


def test_max_records_per_trigger_is_shared_fairly():
    begin = {0: 0, 1: 100, 2: 5}
    assert _capped(begin, {0: 1000, 1: 110, 2: 5}, 300) == {0: 290, 1: 110, 2: 5}
    assert _capped(begin, {0: 1000, 1: 1100, 2: 5}, 300) == {0: 150, 1: 250, 2: 5}
    assert _capped(begin, {0: 1000, 1: 1100, 2: 1005}, 1) == {0: 1, 1: 100, 2: 5}  # the turn: 105 % 3
    assert _capped(begin, {0: 10, 1: 100, 2: 5}, 300) == {0: 10, 1: 100, 2: 5}


def test_a_budget_below_the_partitions_starves_none_while_others_keep_growing():
    """maxRecordsPerTrigger 2 over 3 partitions: partitions 0 and 1 get 10 records more each
    micro-batch, partition 2 has its one record. Every batch takes its 2 offsets, and partition 2's
    record is taken within the first two batches (the shares once went to the partitions furthest
    behind, and partition 2 never was)."""
    begin, latest = {0: 0, 1: 0, 2: 0}, {0: 10, 1: 10, 2: 1}
    for _ in range(2):
        end = _capped(begin, latest, 2)
        assert sum(end.values()) - sum(begin.values()) == 2
        begin, latest = end, {0: latest[0] + 10, 1: latest[1] + 10, 2: 1}
    assert begin[2] == 1
    for _ in range(30):  # partitions 0 and 1 then share the batches evenly
        begin = _capped(begin, {0: begin[0] + 10, 1: begin[1] + 10, 2: 1}, 3)
    assert abs(begin[0] - begin[1]) <= 1
