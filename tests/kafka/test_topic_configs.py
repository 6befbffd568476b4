"""Kafka 4.0's topic configs over both doors (storage's topic_configs.py): those a demanding Kafka
user sets are accepted (librdkafka's and confluent-kafka-python's own tests create topics with
compression.type and segment.bytes), validated with Kafka's bounds and messages (INVALID_CONFIG;
over HTTP 400 INVALID_CONFIG), and compression.type is honored as Kafka's log validator honors it:
a batch is stored, and fetched, in the topic's codec, its records, producer fields and timestamps
kept; an HTTP-produced batch is sent in it too."""

from __future__ import annotations

import time

import pytest
from aiokafka.record.default_records import DefaultRecordBase
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)
from kafka.record.memory_records import MemoryRecords
from kio.schema.errors import ErrorCode as KafkaError

from app import record_batch_codecs as codecs
from app.kafka.record_batches import NO_TIMESTAMP, KafkaRecord
from tests.api.test_log_lifecycle import clean, sql
from tests.kafka import http_side
from tests.kafka.clients import CLIENTS, WAIT_S, ConfluentKafka, bootstrap
from tests.kafka.raw import RawConnection, record_batch
from tests.kafka.test_produce_raw import (
    answer_of,
    fetched_records,
    high_watermark,
    init_producer,
    produce_request,
)

GZIP, SNAPPY, LZ4, ZSTD = 1, 2, 3, 4
# Compressible records, so that every codec shrinks them (the codec is what is checked, not the size).
MESSAGES = [
    {
        "key": f"key-{i}".encode(),
        "value": b"compressible value " * 20 + str(i).encode(),
        "timestamp": 1_700_000_000_000 + i,
    }
    for i in range(20)
]


def admin(server) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap(server)})


def create(server, topic: str, **config: str) -> None:
    client = admin(server)  # held until the answer: a client collected before it cancels the call
    client.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(WAIT_S)


def described(server, resource: ConfigResource) -> dict:
    client = admin(server)
    return client.describe_configs([resource])[resource].result(WAIT_S)


def refused_creation(server, topic: str, **config: str):
    """The KafkaError of a CreateTopics refused for its configs."""
    with pytest.raises(KafkaException) as refused:
        create(server, topic, **config)
    return refused.value.args[0]


def fetched_batches(server, topic: str) -> list:
    """The batches (kafka-python's record module reads them) one raw Fetch of partition 0 returns."""
    with RawConnection(bootstrap(server)) as connection:
        records = MemoryRecords(fetched_records(connection, topic, 1 << 24))
    batches = []
    while (batch := records.next_batch()) is not None:
        batches.append(batch)
    return batches


def contents(batch) -> list[tuple]:
    return [(r.offset, r.key, r.value, r.timestamp, list(r.headers)) for r in batch]


def sent_records(base_offset: int = 0) -> list[tuple]:
    return [(base_offset + i, m["key"], m["value"], m["timestamp"], []) for i, m in enumerate(MESSAGES)]


def test_a_topic_created_with_kafkas_configs_is_accepted_and_described(module_kafka_server):
    """The configs librdkafka's and confluent-kafka-python's own tests create topics with; each
    described back as a topic override, the others at Kafka's defaults."""
    server = module_kafka_server
    create(
        server,
        "configs-accepted",
        **{
            "compression.type": "gzip",
            "segment.bytes": str(10 * 1024 * 1024),
            "segment.ms": "3600000",
            "file.delete.delay.ms": "1000",
            "min.insync.replicas": "1",
            "preallocate": "true",
            "unclean.leader.election.enable": "false",
            "min.cleanable.dirty.ratio": "0.1",
            "compression.gzip.level": "9",
        },
    )
    resource = ConfigResource(ConfigResource.Type.TOPIC, "configs-accepted")
    configs = described(server, resource)
    overrides = {
        name: entry.value for name, entry in configs.items() if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    }
    assert overrides == {
        "compression.type": "gzip",
        "segment.bytes": "10485760",
        "segment.ms": "3600000",
        "file.delete.delay.ms": "1000",
        "preallocate": "true",
        "min.cleanable.dirty.ratio": "0.1",
        "compression.gzip.level": "9",
    }  # min.insync.replicas 1 and unclean.leader.election.enable false are Kafka's defaults
    assert (configs["segment.index.bytes"].value, configs["compression.zstd.level"].value) == ("10485760", "3")
    assert configs["message.timestamp.type"].value == "CreateTime"
    # HTTP shows what was set, under its keys, typed.
    config = server.client.get("/v1/topics/configs-accepted").json()["config"]
    assert (config["compression_type"], config["segment_bytes"], config["preallocate"]) == ("gzip", 10485760, True)
    assert config["min_cleanable_dirty_ratio"] == 0.1


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (
            {"segment.bytes": "1048575"},
            "Invalid value 1048575 for configuration segment.bytes: Value must be at least 1048576",
        ),
        ({"segment.bytes": "1 MiB"}, "Not a number of type INT"),
        ({"compression.type": "brotli"}, "String must be one of: uncompressed, zstd, lz4, snappy, gzip, producer"),
        ({"compression.gzip.level": "0"}, "Value must be between 1 and 9 or equal to -1"),
        ({"compression.zstd.level": "23"}, "Value must be no more than 22"),
        ({"min.insync.replicas": "0"}, "Value must be at least 1"),
        ({"min.cleanable.dirty.ratio": "1.5"}, "Value must be no more than 1"),
        ({"preallocate": "yes"}, "Expected value to be either true or false"),
        ({"leader.replication.throttled.replicas": "all"}, "[partitionId]:[brokerId]"),
        ({"remote.storage.enable": "true"}, "Tiered Storage functionality is disabled in the broker"),
        ({"message.timestamp.type": "logappendtime"}, "String must be one of: CreateTime, LogAppendTime"),
        (
            {"message.timestamp.after.max.ms": "-1"},
            "Invalid value -1 for configuration message.timestamp.after.max.ms: Value must be at least 0",
        ),
        ({"message.timestamp.before.max.ms": "an hour"}, "Not a number of type LONG"),
        (
            {"min.compaction.lag.ms": "-1"},
            "Invalid value -1 for configuration min.compaction.lag.ms: Value must be at least 0",
        ),
        (
            {"max.compaction.lag.ms": "3600000", "min.compaction.lag.ms": "7200000"},
            "conflict topic config setting min.compaction.lag.ms (7200000) > max.compaction.lag.ms (3600000)",
        ),
        ({"message.format.version": "3.0-IV1"}, "Unknown topic config name: message.format.version"),
        ({"message.downconversion.enable": "true"}, "removed in Kafka 4.0"),
    ],
)
def test_a_bad_value_is_invalid_config_with_kafkas_reason(module_kafka_server, config, reason):
    server = module_kafka_server
    topic = "configs-refused-" + next(iter(config)).replace(".", "-")
    error = refused_creation(server, topic, **config)
    assert error.name() == "INVALID_CONFIG"
    assert reason in error.str()
    assert server.client.get(f"/v1/topics/{topic}").status_code == 404  # nothing created


def test_a_bad_value_over_http_is_400_invalid_config_and_nothing_is_created(module_kafka_server):
    server = module_kafka_server
    response = server.client.post(
        "/v1/topics",
        json={"name": "configs-refused-http", "config": {"compression_type": "gzip", "segment_bytes": 100}},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "INVALID_CONFIG"
    assert "Invalid value 100 for configuration segment.bytes: Value must be at least 1048576" in error["message"]
    assert "segment_bytes" in error["message"]
    assert server.client.get("/v1/topics/configs-refused-http").status_code == 404
    accepted = server.client.post(
        "/v1/topics", json={"name": "configs-http", "config": {"compression_type": "zstd", "segment_bytes": 1 << 20}}
    )
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["config"]["compression_type"] == "zstd"


@pytest.mark.parametrize(
    ("topic_codec", "producer_codec", "stored_codec"),
    [
        ("gzip", None, GZIP),
        ("snappy", "gzip", SNAPPY),
        ("lz4", "zstd", LZ4),
        ("zstd", "lz4", ZSTD),
        ("uncompressed", "gzip", 0),
        ("producer", "snappy", SNAPPY),
        ("producer", None, 0),
    ],
)
def test_batches_are_stored_and_fetched_in_the_topics_codec(
    module_kafka_server, topic_codec, producer_codec, stored_codec
):
    """Kafka's log validator recompresses a batch whose codec is not the topic's: the records, their
    offsets and timestamps, and the producer's id, epoch and sequence stay."""
    server = module_kafka_server
    topic = f"codec-{topic_codec}-from-{producer_codec or 'none'}"
    create(server, topic, **{"compression.type": topic_codec})
    ConfluentKafka().produce(server, topic, MESSAGES, compression=producer_codec, **{"linger.ms": 1000})
    [batch] = fetched_batches(server, topic)
    assert batch.compression_type == stored_codec
    assert batch.producer_id >= 0 and (batch.producer_epoch, batch.base_sequence) == (0, 0)
    assert not batch.is_transactional
    assert batch.validate_crc()
    assert contents(batch) == sent_records()
    expected = [(offset, key, value, ts) for offset, key, value, ts, _ in sent_records()]
    for client in CLIENTS:
        received = client.consume(server, topic, 0, len(MESSAGES))
        assert [(r.offset, r.key, r.value, r.timestamp_ms) for r in received] == expected, client.name
    assert [http_side.unb64(r["value"]) for r in http_side.fetch(server, topic, 0)] == [m["value"] for m in MESSAGES]


def test_a_transactional_batch_keeps_its_flags_when_recompressed(module_kafka_server):
    server = module_kafka_server
    topic = "codec-transactional"
    create(server, topic, **{"compression.type": "zstd"})

    producer = Producer({"bootstrap.servers": bootstrap(server), "transactional.id": "codec-txn", "linger.ms": 1000})
    producer.init_transactions(WAIT_S)
    producer.begin_transaction()
    for message in MESSAGES:
        producer.produce(topic, key=message["key"], value=message["value"], timestamp=message["timestamp"])
    producer.commit_transaction(WAIT_S)
    data, marker = fetched_batches(server, topic)
    assert (data.compression_type, data.is_transactional, data.base_sequence) == (ZSTD, True, 0)
    assert contents(data) == sent_records()
    assert (marker.is_control_batch, marker.compression_type) == (True, 0)  # markers as Kafka writes them
    received = ConfluentKafka().consume(server, topic, 0, len(MESSAGES), isolation="read_committed")
    assert [r.value for r in received] == [m["value"] for m in MESSAGES]


def test_records_produced_over_http_are_fetched_over_kafka_in_the_topics_codec(module_kafka_server):
    server = module_kafka_server
    topic = "codec-from-http"
    create(server, topic, **{"compression.type": "gzip"})
    http_side.produce(server, topic, 0, [{"key": "k", "value": "over http " * 30, "timestamp_ms": 42}])
    [batch] = fetched_batches(server, topic)
    assert batch.compression_type == GZIP
    assert contents(batch) == [(0, b"k", b"over http " * 30, 42, [])]
    [received] = ConfluentKafka().consume(server, topic, 0, 1)
    assert (received.key, received.value, received.timestamp_ms) == (b"k", b"over http " * 30, 42)


def test_altering_compression_type_applies_to_the_batches_after_it(module_kafka_server):
    """IncrementalAlterConfigs SET then DELETE: batches already stored keep their codec (as in a Kafka
    log), the next ones take the new one, and DELETE goes back to `producer`."""
    server = module_kafka_server
    topic = "codec-altered"
    create(server, topic)
    producer = ConfluentKafka()
    producer.produce(server, topic, MESSAGES[:5], **{"linger.ms": 1000})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)

    def alter(operation, value=None):
        entry = ConfigEntry("compression.type", value, incremental_operation=operation)
        altered = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
        client = admin(server)
        client.incremental_alter_configs([altered])[altered].result(WAIT_S)

    alter(AlterConfigOpType.SET, "lz4")
    producer.produce(server, topic, MESSAGES[5:10], **{"linger.ms": 1000})
    alter(AlterConfigOpType.DELETE)
    producer.produce(server, topic, MESSAGES[10:15], **{"linger.ms": 1000})
    assert [batch.compression_type for batch in fetched_batches(server, topic)] == [0, LZ4, 0]
    compression = described(server, resource)["compression.type"]
    assert (compression.value, compression.source) == ("producer", ConfigSource.DEFAULT_CONFIG.value)
    assert "compression_type" not in server.client.get(f"/v1/topics/{topic}").json()["config"]


def test_the_gzip_level_is_the_topics(module_kafka_server):
    """compression.gzip.level (KIP-390) is the level the broker compresses with: 1 makes a larger batch than 9."""
    server = module_kafka_server
    sizes = {}
    for level in ("1", "9"):
        topic = f"codec-gzip-level-{level}"
        create(server, topic, **{"compression.type": "gzip", "compression.gzip.level": level})
        http_side.produce(server, topic, 0, [{"key": str(i), "value": f"{i} " * 300} for i in range(50)])
        [batch] = fetched_batches(server, topic)
        assert batch.compression_type == GZIP and batch.validate_crc()
        sizes[level] = batch.size_in_bytes
    assert sizes["1"] > sizes["9"]


def test_append_and_subtract_alter_every_list_config(module_kafka_server):
    """As Kafka's ConfigAdminManager: APPEND and SUBTRACT apply to any LIST config, the throttled
    replicas as cleanup.policy (kept without effect: there is no replication to throttle)."""
    server = module_kafka_server
    topic = "configs-lists"
    create(server, topic)
    name = "leader.replication.throttled.replicas"

    def alter(operation, value):
        entry = ConfigEntry(name, value, incremental_operation=operation)
        altered = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
        client = admin(server)
        client.incremental_alter_configs([altered])[altered].result(WAIT_S)

    alter(AlterConfigOpType.APPEND, "0:1")
    alter(AlterConfigOpType.APPEND, "1:2,0:1")
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    assert described(server, resource)[name].value == "0:1,1:2"
    alter(AlterConfigOpType.SUBTRACT, "0:1")
    assert described(server, resource)[name].value == "1:2"
    with pytest.raises(KafkaException) as refused:
        alter(AlterConfigOpType.APPEND, "leader")
    assert refused.value.args[0].name() == "INVALID_CONFIG"
    assert described(server, resource)[name].value == "1:2"


def test_append_adds_a_value_given_twice_once(module_kafka_server):
    """As Kafka's controller appends (each value the list lacks, checked against the list as it
    grows): `compact,compact` appended to `delete` is `delete,compact`."""
    server = module_kafka_server
    topic = "configs-append-twice"
    create(server, topic)
    entry = ConfigEntry("cleanup.policy", "compact,compact", incremental_operation=AlterConfigOpType.APPEND)
    altered = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    client = admin(server)  # kept: librdkafka fails the call of a handle collected meanwhile
    client.incremental_alter_configs([altered])[altered].result(WAIT_S)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    assert described(server, resource)["cleanup.policy"].value == "delete,compact"


def test_log_append_time_gives_records_the_time_the_broker_appends_them(module_kafka_server):
    """message.timestamp.type=LogAppendTime, as Kafka's validator applies it: the batch is marked
    LogAppendTime with the append time as its max timestamp, which clients give every record; the
    produce answer carries it; an HTTP record takes it too; ListOffsets by time finds it."""
    server = module_kafka_server
    topic = "log-append-time"
    create(server, topic, **{"message.timestamp.type": "LogAppendTime", "compression.type": "lz4"})
    before_ms = int(time.time() * 1000)
    delivered = []
    producer = Producer({"bootstrap.servers": bootstrap(server), "linger.ms": 1000})
    for message in MESSAGES[:3]:  # their own timestamps, from 2023: replaced
        producer.produce(
            topic,
            key=message["key"],
            value=message["value"],
            timestamp=message["timestamp"],
            on_delivery=lambda error, m: delivered.append((error, m.timestamp())),
        )
    assert producer.flush(WAIT_S) == 0
    http_side.produce(server, topic, 0, [{"key": "h", "value": "over http", "timestamp_ms": 42}])
    after_ms = int(time.time() * 1000)

    kafka_batch, http_batch = fetched_batches(server, topic)
    assert (kafka_batch.timestamp_type, kafka_batch.compression_type) == (1, LZ4)
    appended = kafka_batch.max_timestamp
    assert before_ms <= appended <= after_ms
    assert [r.timestamp for r in kafka_batch] == [appended] * 3
    assert [error for error, _ in delivered] == [None] * 3
    assert {stamp for _, stamp in delivered} == {(TIMESTAMP_LOG_APPEND_TIME, appended)}
    [http_record] = list(http_batch)
    assert before_ms <= http_record.timestamp <= after_ms and http_record.timestamp >= appended
    expected = [appended] * 3 + [http_record.timestamp]
    for client in CLIENTS:
        assert [r.timestamp_ms for r in client.consume(server, topic, 0, 4)] == expected, client.name
    assert [r["timestamp_ms"] for r in http_side.fetch(server, topic, 0)] == expected
    listed = server.client.post(
        "/v1/offsets/list", json={"partitions": [{"topic": topic, "partition": 0, "timestamp": before_ms}]}
    ).json()["partitions"][0]
    assert (listed["offset"], listed["timestamp_ms"]) == (0, appended)


def test_a_retried_batch_is_answered_with_its_original_log_append_time(module_kafka_server):
    """As Kafka answers a duplicate with its original batch's metadata (UnifiedLog.append: offsets and
    BatchMetadata's timestamp, the append time under LogAppendTime), a retry of an idempotent batch
    gets the log_append_time its first attempt got, not -1; under CreateTime it is -1 either way, as
    the protocol defines it. Producer states remembered before the timestamp was kept (four fields a
    batch) still recognize a retry, answered without it."""
    server = module_kafka_server
    create(server, "retried-log-append-time", **{"message.timestamp.type": "LogAppendTime"})
    create(server, "retried-create-time")
    with RawConnection(bootstrap(server)) as connection:
        producer_id, epoch = init_producer(connection)

        def send(topic: str, base_sequence: int):
            batch = record_batch([KafkaRecord(1_700_000_000_000, b"k", b"v", [])], producer_id, epoch, base_sequence)
            [answer] = connection.call(produce_request(topic, 0, batch)).responses[0].partition_responses
            assert answer.error_code == KafkaError.none
            return answer.base_offset, answer.log_append_time

        first = send("retried-log-append-time", 0)
        assert first[1] is not None
        time.sleep(0.01)  # a retry stamped anew would differ
        assert send("retried-log-append-time", 0) == first
        assert send("retried-create-time", 0) == (0, None)
        assert send("retried-create-time", 0) == (0, None)

        sql(
            server.database_url,
            "UPDATE producer_states SET recent_batches = '[[0, 0, 0, 0]]' WHERE producer_id = $1",
            producer_id,
        )
        assert send("retried-log-append-time", 0) == (0, None)
    assert high_watermark(server, "retried-log-append-time") == 1


# ---- message.timestamp.before.max.ms and after.max.ms (KIP-937), as Kafka's LogValidator applies them

HOUR_MS = 3_600_000
BOUND_MS = 60_000
KAFKAS_MESSAGE = "One or more records have been rejected due to invalid timestamp"


def now_ms() -> int:
    return int(time.time() * 1000)


def test_timestamp_bounds_are_set_described_and_refused_below_zero(module_kafka_server):
    """Any LONG >= 0 is kept and described as a topic override, set by CreateTopics or
    IncrementalAlterConfigs; txbroker's default is no bound (2^63-1), for both."""
    server = module_kafka_server
    topic = "timestamp-bounds-configs"
    create(server, topic, **{"message.timestamp.after.max.ms": str(BOUND_MS)})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = described(server, resource)
    after, before = configs["message.timestamp.after.max.ms"], configs["message.timestamp.before.max.ms"]
    assert (after.value, after.source) == (str(BOUND_MS), ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert (before.value, before.source) == (str(2**63 - 1), ConfigSource.DEFAULT_CONFIG.value)

    def alter(value: str) -> None:
        entry = ConfigEntry("message.timestamp.before.max.ms", value, incremental_operation=AlterConfigOpType.SET)
        altered = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
        client = admin(server)
        client.incremental_alter_configs([altered])[altered].result(WAIT_S)

    alter("0")
    assert described(server, resource)["message.timestamp.before.max.ms"].value == "0"
    with pytest.raises(KafkaException) as refused:
        alter("-5")
    assert refused.value.args[0].name() == "INVALID_CONFIG"
    assert (
        "Invalid value -5 for configuration message.timestamp.before.max.ms: Value must be at least 0"
        in refused.value.args[0].str()
    )
    config = server.client.get(f"/v1/topics/{topic}").json()["config"]
    assert (config["message_timestamp_after_max_ms"], config["message_timestamp_before_max_ms"]) == (BOUND_MS, 0)


def produce_answer(server, topic: str, batch: bytes):
    with RawConnection(bootstrap(server)) as connection:
        [answer] = connection.call(produce_request(topic, 0, batch)).responses[0].partition_responses
    return answer


@pytest.mark.parametrize(
    ("config", "off_by_ms", "how_far"),
    [
        ("message.timestamp.after.max.ms", HOUR_MS, "ms after the server's clock"),
        ("message.timestamp.before.max.ms", -HOUR_MS, "ms before the server's clock"),
    ],
)
def test_a_record_out_of_the_bounds_is_invalid_timestamp_and_nothing_of_its_batch_is_written(
    module_kafka_server, config, off_by_ms, how_far
):
    """Kafka's INVALID_TIMESTAMP for the partition, its message, and each refused record in
    record_errors with Kafka's reason; the batch's records within the bound are not written either.
    A record within it, and one of Kafka's NO_TIMESTAMP (-1), are written."""
    server = module_kafka_server
    topic = "timestamp-bounds-" + config.split(".")[2]
    create(server, topic, **{config: str(BOUND_MS)})
    now = now_ms()
    out = now + off_by_ms
    batch = record_batch(
        [KafkaRecord(now, b"k", b"in", []), KafkaRecord(out, b"k", b"out", []), KafkaRecord(now, b"k", b"in", [])]
    )
    answer = produce_answer(server, topic, batch)
    assert answer.error_code == KafkaError.invalid_timestamp
    assert answer.error_message.startswith(KAFKAS_MESSAGE)
    assert f"record 1 of the batch to {topic}-0 has timestamp {out}" in answer.error_message
    assert how_far in answer.error_message and config.replace(".", "_") in answer.error_message
    [record_error] = answer.record_errors
    assert record_error.batch_index == 1
    assert record_error.batch_index_error_message.startswith(
        f"Timestamp {out} of message with offset 1 is out of range"
    )
    assert high_watermark(server, topic) == 0

    fits = record_batch([KafkaRecord(now_ms() + off_by_ms // 1000, None, b"v", []), KafkaRecord(-1, None, b"v", [])])
    answer = produce_answer(server, topic, fits)
    assert (answer.error_code, answer.base_offset) == (KafkaError.none, 0)
    assert high_watermark(server, topic) == 2


def test_a_refused_batch_takes_no_sequence_number(module_kafka_server):
    """An idempotent producer's refused batch is not in its sequence: the same sequence is appended next."""
    server = module_kafka_server
    topic = "timestamp-bounds-idempotent"
    create(server, topic, **{"message.timestamp.after.max.ms": str(BOUND_MS)})
    with RawConnection(bootstrap(server)) as connection:
        producer_id, epoch = init_producer(connection)
        ahead = record_batch([KafkaRecord(now_ms() + HOUR_MS, None, b"v", [])], producer_id, epoch, 0)
        refused = connection.call(produce_request(topic, 0, ahead))
        assert answer_of(refused)[0] == KafkaError.invalid_timestamp
        fits = record_batch([KafkaRecord(now_ms(), None, b"v", [])] * 2, producer_id, epoch, 0)
        assert answer_of(connection.call(produce_request(topic, 0, fits))) == (KafkaError.none, 0)
        follows = record_batch([KafkaRecord(now_ms(), None, b"v", [])], producer_id, epoch, 2)
        assert answer_of(connection.call(produce_request(topic, 0, follows))) == (KafkaError.none, 2)
    assert high_watermark(server, topic) == 3


@pytest.mark.parametrize("idempotence", [False, True], ids=["plain", "idempotent"])
def test_confluent_kafka_gets_invalid_timestamp_for_a_record_an_hour_ahead(module_kafka_server, idempotence):
    """An idempotent librdkafka producer then starts a new epoch itself (its sequence has a gap), as
    Kafka's broker lets an idempotent producer do: its next records are written."""
    server = module_kafka_server
    topic = f"timestamp-bounds-confluent-{'idempotent' if idempotence else 'plain'}"
    create(server, topic, **{"message.timestamp.after.max.ms": str(BOUND_MS)})
    config = {"bootstrap.servers": bootstrap(server), "linger.ms": 0, "enable.idempotence": idempotence}
    producer = Producer(config)
    reports = {}

    def delivered(error, message):
        reports[message.value()] = None if error is None else error.name()

    producer.produce(topic, value=b"ahead", partition=0, timestamp=now_ms() + HOUR_MS, on_delivery=delivered)
    producer.flush(WAIT_S)
    for value in (b"now", b"next"):  # the client's clock
        producer.produce(topic, value=value, partition=0, on_delivery=delivered)
        producer.flush(WAIT_S)
    assert reports == {b"ahead": "INVALID_TIMESTAMP", b"now": None, b"next": None}
    assert high_watermark(server, topic) == 2


def test_log_append_time_is_not_bounded(module_kafka_server):
    """With LogAppendTime the records take the append time: the bounds do not apply, over either door."""
    server = module_kafka_server
    topic = "timestamp-bounds-log-append-time"
    bounds = {"message.timestamp.before.max.ms": "0", "message.timestamp.after.max.ms": "0"}
    create(server, topic, **{"message.timestamp.type": "LogAppendTime", **bounds})
    batch = record_batch([KafkaRecord(now_ms() + HOUR_MS, None, b"ahead", []), KafkaRecord(42, None, b"old", [])])
    assert produce_answer(server, topic, batch).error_code == KafkaError.none
    http_side.produce(server, topic, 0, [{"value": "ahead", "timestamp_ms": now_ms() + HOUR_MS}])
    assert high_watermark(server, topic) == 3


def marked_log_append_time(timestamp_ms: int) -> bytes:
    """A producer's batch of two records whose attributes say LogAppendTime, a type only a broker sets."""
    batch = bytearray(record_batch([KafkaRecord(timestamp_ms, b"k", b"v", [])] * 2))
    codecs.add_attributes(batch, DefaultRecordBase.TIMESTAMP_TYPE_MASK)
    return codecs.with_crc(batch)


@pytest.mark.parametrize(
    ("topic", "timestamp_type", "timestamp_ms"),
    [
        ("marked-log-append-time-timestamped", "LogAppendTime", 1_700_000_000_000),
        ("marked-log-append-time-untimestamped", "LogAppendTime", -1),
        ("marked-log-append-time-create-time", "CreateTime", -1),
    ],
)
def test_a_batch_its_producer_marked_log_append_time_is_invalid_timestamp(
    module_kafka_server, topic, timestamp_type, timestamp_ms
):
    """As Kafka's LogValidator: a batch marked LogAppendTime is refused, each record named with Kafka's
    reason, when the topic gives its records the append time, or when its records have no timestamp
    (-1) to keep; not even a partition without bounds takes it."""
    server = module_kafka_server
    create(server, topic, **{"message.timestamp.type": timestamp_type})
    answer = produce_answer(server, topic, marked_log_append_time(timestamp_ms))
    assert answer.error_code == KafkaError.invalid_timestamp
    assert answer.error_message.startswith(KAFKAS_MESSAGE)
    assert f"the batch to {topic}-0 is marked LogAppendTime" in answer.error_message
    reason = "Invalid timestamp type in message at offset {}. Producer should not set timestamp type to LogAppendTime."
    assert [(e.batch_index, e.batch_index_error_message) for e in answer.record_errors] == [
        (index, reason.format(index)) for index in (0, 1)
    ]
    assert high_watermark(server, topic) == 0


def test_a_batch_marked_log_append_time_with_timestamps_is_bounded_in_a_create_time_topic(module_kafka_server):
    """As Kafka's LogValidator: in a CreateTime topic such a batch's records have a timestamp (its max
    timestamp, which readers give every record of it), bounded as any other."""
    server = module_kafka_server
    topic = "marked-log-append-time-bounded"
    create(server, topic, **{"message.timestamp.before.max.ms": str(HOUR_MS)})
    assert produce_answer(server, topic, marked_log_append_time(now_ms())).error_code == KafkaError.none
    old = produce_answer(server, topic, marked_log_append_time(now_ms() - 2 * HOUR_MS))
    assert old.error_code == KafkaError.invalid_timestamp
    assert [e.batch_index for e in old.record_errors] == [0, 1]
    assert high_watermark(server, topic) == 2


def test_a_create_time_topic_stores_a_batch_marked_log_append_time_as_create_time(module_kafka_server):
    """As Kafka's LogValidator, which rewrites a batch's timestamp type to its topic's
    (setMaxTimestamp): the batch is stored marked CreateTime, its max timestamp kept, so every
    reader gets each record's own timestamp, not the max timestamp the mark gave them all."""
    server = module_kafka_server
    topic = "marked-log-append-time-stored"
    create(server, topic)
    sent = [1_700_000_000_000 + 10 * i for i in range(3)]
    batch = bytearray(record_batch([KafkaRecord(t, f"k{i}".encode(), b"v", []) for i, t in enumerate(sent)]))
    codecs.add_attributes(batch, DefaultRecordBase.TIMESTAMP_TYPE_MASK)
    assert produce_answer(server, topic, codecs.with_crc(batch)).error_code == KafkaError.none

    [stored] = fetched_batches(server, topic)
    assert (stored.timestamp_type, stored.max_timestamp) == (0, sent[-1])
    assert [r.timestamp for r in stored] == sent
    for client in CLIENTS:
        assert [r.timestamp_ms for r in client.consume(server, topic, 0, 3)] == sent, client.name
    assert [r["timestamp_ms"] for r in http_side.fetch(server, topic, 0)] == sent


# ---- min.compaction.lag.ms


def incremental_alter(server, topic: str, name: str, operation, value: str | None = None) -> None:
    entry = ConfigEntry(name, value, incremental_operation=operation)
    altered = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    client = admin(server)
    client.incremental_alter_configs([altered])[altered].result(WAIT_S)


def test_min_compaction_lag_is_kept_described_and_altered_over_both_doors(module_kafka_server):
    """min.compaction.lag.ms takes any value Kafka takes (LONG >= 0) over CreateTopics,
    IncrementalAlterConfigs, AlterConfigs and HTTP's topic config, and is described back; one above
    max.compaction.lag.ms is refused with Kafka's message, as Kafka's LogConfig.validateValues does."""
    server = module_kafka_server
    topic = "min-lag-configs"
    create(server, topic, **{"cleanup.policy": "compact", "min.compaction.lag.ms": "60000"})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)

    def kafka_value() -> tuple[str, int]:
        entry = described(server, resource)["min.compaction.lag.ms"]
        return entry.value, entry.source

    def http_value():
        return server.client.get(f"/v1/topics/{topic}").json()["config"].get("min_compaction_lag_ms")

    assert (kafka_value(), http_value()) == (("60000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value), 60000)
    incremental_alter(server, topic, "min.compaction.lag.ms", AlterConfigOpType.SET, str(2**63 - 1))
    assert http_value() == 2**63 - 1
    incremental_alter(server, topic, "min.compaction.lag.ms", AlterConfigOpType.SET, "7200000")
    with pytest.raises(KafkaException) as refused:  # the maximum lag below the minimum the topic has
        incremental_alter(server, topic, "max.compaction.lag.ms", AlterConfigOpType.SET, "3600000")
    assert refused.value.args[0].name() == "INVALID_CONFIG"
    assert "conflict topic config setting min.compaction.lag.ms (7200000) > max.compaction.lag.ms (3600000)" in (
        refused.value.args[0].str()
    )
    assert (kafka_value(), http_value()) == (("7200000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value), 7200000)
    with pytest.raises(KafkaException) as refused:
        incremental_alter(server, topic, "min.compaction.lag.ms", AlterConfigOpType.SET, "-5")
    assert "Value must be at least 0" in refused.value.args[0].str()
    # AlterConfigs (not incremental): the configs given, the others back to their defaults.
    replaced = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"min.compaction.lag.ms": "5000"})
    client = admin(server)  # held until the answer: a client collected before it cancels the call
    client.alter_configs([replaced])[replaced].result(WAIT_S)
    assert (kafka_value(), http_value()) == (("5000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value), 5000)
    incremental_alter(server, topic, "min.compaction.lag.ms", AlterConfigOpType.DELETE)
    assert (kafka_value(), http_value()) == (("0", ConfigSource.DEFAULT_CONFIG.value), None)

    created = server.client.post(
        "/v1/topics",
        json={"name": "min-lag-http", "config": {"cleanup_policy": "compact", "min_compaction_lag_ms": HOUR_MS}},
    )
    assert created.status_code == 201, created.text
    assert created.json()["config"]["min_compaction_lag_ms"] == HOUR_MS
    entry = described(server, ConfigResource(ConfigResource.Type.TOPIC, "min-lag-http"))["min.compaction.lag.ms"]
    assert (entry.value, entry.source) == (str(HOUR_MS), ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    for config, reason in (
        (
            {"min_compaction_lag_ms": -1},
            "Invalid value -1 for configuration min.compaction.lag.ms: Value must be at least 0",
        ),
        (
            {"min_compaction_lag_ms": 10, "max_compaction_lag_ms": 5},
            "conflict topic config setting min.compaction.lag.ms (10) > max.compaction.lag.ms (5)",
        ),
    ):
        response = server.client.post("/v1/topics", json={"name": "min-lag-refused", "config": config})
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "INVALID_CONFIG"
        assert reason in response.json()["error"]["message"]
    assert server.client.get("/v1/topics/min-lag-refused").status_code == 404


def test_min_compaction_lag_goes_by_the_timestamps_kafka_producers_give(module_kafka_server):
    """Batches produced over Kafka count with their records' newest timestamp: superseded records
    timestamped two hours ago are compacted, one timestamped now stays with everything after it."""
    server = module_kafka_server
    topic = "min-lag-kafka"
    create(server, topic, **{"cleanup.policy": "compact", "min.compaction.lag.ms": str(HOUR_MS)})
    now = now_ms()
    old = now - 2 * HOUR_MS
    producer = ConfluentKafka()
    for key, value, timestamp in (
        (b"k", b"old-1", old),  # 0
        (b"k", b"old-2", old),  # 1
        (b"j", b"recent-1", now),  # 2: within the lag
        (b"j", b"recent-2", now),  # 3
        (b"k", b"recent", now),  # 4
    ):  # each its own batch
        producer.produce(server, topic, [{"key": key, "value": value, "timestamp": timestamp}])
    clean(server, now_ms=now)

    def kept(count: int) -> list:
        """The records a Kafka consumer reads, `count` of them expected (it waits for no more)."""
        return [(r.offset, r.value) for r in producer.consume(server, topic, 0, count)]

    assert kept(4) == [(1, b"old-2"), (2, b"recent-1"), (3, b"recent-2"), (4, b"recent")]
    clean(server, now_ms=now + HOUR_MS + 60_000)
    assert kept(2) == [(3, b"recent-2"), (4, b"recent")]


def test_min_compaction_lag_holds_records_without_a_timestamp_by_their_append_time(module_kafka_server):
    """Records timestamped -1 (Kafka's NO_TIMESTAMP) have no age of their own: as Kafka's cleaner
    goes by a segment's last-modified time when none of its records has a timestamp
    (LogSegment.largestTimestamp), a batch of them is held back until its append is
    min.compaction.lag.ms old, not compacted at once."""
    server = module_kafka_server
    topic = "min-lag-no-timestamp"
    create(server, topic, **{"cleanup.policy": "compact", "min.compaction.lag.ms": str(HOUR_MS)})
    for value in (b"first", b"second"):  # each its own batch
        batch = record_batch([KafkaRecord(NO_TIMESTAMP, b"k", value, [])])
        assert produce_answer(server, topic, batch).error_code == KafkaError.none
    appended_ms = now_ms()

    def kept() -> list:
        return [(r["offset"], r["timestamp_ms"]) for r in http_side.fetch(server, topic, 0)]

    clean(server, now_ms=appended_ms)
    assert kept() == [(0, NO_TIMESTAMP), (1, NO_TIMESTAMP)]
    clean(server, now_ms=appended_ms + HOUR_MS + 60_000)
    assert kept() == [(1, NO_TIMESTAMP)]


def test_records_without_a_timestamp_never_force_compaction_by_max_compaction_lag(module_kafka_server):
    """Kafka's cleaner forces a run by max.compaction.lag.ms from the max timestamp of each dirty
    segment's first batch, and leaves out one without a timestamp (LogCleanerManager.maxCompactionDelay
    keeps positive ones only): a batch of records timestamped -1 waits for the dirty ratio however long
    it has been there, where a timestamped one past the lag forces the run."""
    server = module_kafka_server
    topic = "max-lag-no-timestamp"
    create(server, topic, **{"cleanup.policy": "compact", "max.compaction.lag.ms": str(HOUR_MS)})
    now = now_ms()

    def produce(key: bytes, timestamp: int) -> None:  # each its own batch
        batch = record_batch([KafkaRecord(timestamp, key, b"v", [])])
        assert produce_answer(server, topic, batch).error_code == KafkaError.none

    def offsets() -> list[int]:
        return [r["offset"] for r in http_side.fetch(server, topic, 0)]

    for key in range(10):  # 0..9
        produce(f"k{key}".encode(), now)
    clean(server, now_ms=now)  # every batch new: compacted (nothing superseded)
    produce(b"k0", NO_TIMESTAMP)  # 10, superseding 0
    later = now + 2 * HOUR_MS
    clean(server, now_ms=later)  # 1 new batch of 11, below the ratio, and it has no age: not yet
    assert offsets() == list(range(11))
    produce(b"k1", now)  # 11, superseding 1: two hours old at `later`, over the lag
    clean(server, now_ms=later)  # 2 new of 12, below the ratio, but one is overdue: compacted
    assert offsets() == list(range(2, 12))


def test_retention_keeps_records_without_a_timestamp_by_their_append_time(module_kafka_server):
    """As Kafka's time retention, which goes by a segment's last-modified time when none of its
    records has a timestamp (LogSegment.largestTimestamp): a batch of records timestamped -1 stays
    retention.ms after it was appended, instead of going at the cleaner's next run."""
    server = module_kafka_server
    topic = "retention-no-timestamp"
    create(server, topic, **{"retention.ms": str(HOUR_MS)})
    batch = record_batch([KafkaRecord(NO_TIMESTAMP, b"k", b"v", [])])
    assert produce_answer(server, topic, batch).error_code == KafkaError.none
    appended_ms = now_ms()

    def log_start_offset() -> int:
        return server.client.get(f"/v1/topics/{topic}").json()["partitions"][0]["log_start_offset"]

    clean(server, now_ms=appended_ms)
    assert log_start_offset() == 0
    assert [r["offset"] for r in http_side.fetch(server, topic, 0)] == [0]
    clean(server, now_ms=appended_ms + HOUR_MS + 60_000)
    assert log_start_offset() == 1


def test_a_large_produce_slow_to_recompress_is_written(make_server, monkeypatch):
    """A write batch recompressed its record batches into their topic's codec inside its PostgreSQL
    transaction, after its first statement: 100 MiB take 6.5 s at gzip level 9, over 3 minutes at zstd
    level 22, longer than the request pool's idle-in-transaction timeout (9 s by default). PostgreSQL
    ended the transaction, and the producer's retries all met the same end: never written. A write
    batch of 1 MiB of records or more is recompressed before its transaction now. Here the timeout is
    300 ms and each recompression 0.8 s."""
    server = make_server(kafka_listener="127.0.0.1:0", database_idle_in_transaction_timeout_ms=300)
    topic = "slow-recompression"
    create(server, topic, **{"compression.type": "gzip"})
    recompressed = codecs.recompressed

    def slow_recompressed(*args):
        time.sleep(0.8)  # 100 MiB at gzip level 9 takes 6.5 s
        return recompressed(*args)

    monkeypatch.setattr(codecs, "recompressed", slow_recompressed)
    failures: list = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap(server),
            "enable.idempotence": True,  # its writes take a PostgreSQL transaction (a lone plain one may not)
            "linger.ms": 1000,  # every record in one batch of 1.2 MB
            "batch.size": 4_000_000,
            "message.max.bytes": 4_000_000,
            "message.timeout.ms": 20_000,
        }
    )
    for index in range(1200):
        producer.produce(
            topic,
            key=str(index).encode(),
            value=b"v" * 1000,
            on_delivery=lambda error, _message: failures.append(error) if error is not None else None,
        )
    assert producer.flush(30) == 0
    assert failures == []
    assert len(http_side.fetch(server, topic, 0)) == 1200
    assert {batch.compression_type for batch in fetched_batches(server, topic)} == {GZIP}
