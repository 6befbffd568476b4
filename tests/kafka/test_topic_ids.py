"""Topic ids (KIP-516): one per topic, the same over HTTP (`topic_id`) and Kafka (Metadata v10+,
CreateTopics v7, DeleteTopics v6, Fetch v13+), fixed for the topic's life, a new one when the name
is re-created; an id of a topic gone is UNKNOWN_TOPIC_ID, never the re-created topic's records."""

from __future__ import annotations

import base64
import datetime
import uuid

from confluent_kafka import TopicCollection
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.kafka import http_side
from tests.kafka.clients import WAIT_S, bootstrap, create_topic, topic_uuid
from tests.kafka.raw import RawConnection, nested, record_batch, request_of
from tests.kafka.test_produce_raw import records
from tests.kafka.test_security import ADMIN_TOKEN, log_in, new_principal

MAX_BYTES = 1 << 20
FETCH_BY_ID = 16  # what librdkafka 2.x sends
METADATA = 12
DELETE_BY_ID = 6
PRODUCE_BY_ID = 13


def http_topic_id(server, name: str) -> str:
    return server.client.get(f"/v1/topics/{name}").json()["topic_id"]


def fetch_by_id(connection: RawConnection, topic_id: uuid.UUID, version: int = FETCH_BY_ID):
    partition = nested(
        api_table.FETCH, version, "FetchPartition", partition=0, fetch_offset=0, partition_max_bytes=MAX_BYTES
    )
    topic = nested(api_table.FETCH, version, "FetchTopic", topic_id=topic_id, partitions=(partition,))
    response = connection.call(
        request_of(
            api_table.FETCH,
            version,
            max_wait=datetime.timedelta(0),
            min_bytes=1,
            max_bytes=MAX_BYTES,
            isolation_level=1,
            topics=(topic,),
            forgotten_topics_data=(),
            rack_id="",
        )
    )
    [answered] = response.responses
    [partition] = answered.partitions
    return answered.topic_id, partition


def metadata_by_id(connection: RawConnection, topic_id: uuid.UUID):
    topic = nested(api_table.METADATA, METADATA, "MetadataRequestTopic", name=None, topic_id=topic_id)
    response = connection.call(
        request_of(
            api_table.METADATA,
            METADATA,
            topics=(topic,),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
    )
    [answered] = response.topics
    return answered


def delete_by_id(connection: RawConnection, topic_id: uuid.UUID):
    topic = nested(api_table.DELETE_TOPICS, DELETE_BY_ID, "DeleteTopicState", name=None, topic_id=topic_id)
    response = connection.call(
        request_of(api_table.DELETE_TOPICS, DELETE_BY_ID, topics=(topic,), timeout=datetime.timedelta(seconds=30))
    )
    [answered] = response.responses
    return answered


def produce_by_id(connection: RawConnection, topic_id: uuid.UUID, values: list[bytes]):
    """Produce v13 (topics by id) of `values` to partition 0: (the answer's topic id, its partition)."""
    batch = record_batch([record._replace(value=value) for record, value in zip(records(len(values)), values)])
    data = nested(api_table.PRODUCE, PRODUCE_BY_ID, "PartitionProduceData", index=0, records=batch)
    response = connection.call(
        request_of(
            api_table.PRODUCE,
            PRODUCE_BY_ID,
            transactional_id=None,
            acks=-1,
            timeout=datetime.timedelta(seconds=30),
            topic_data=(
                nested(api_table.PRODUCE, PRODUCE_BY_ID, "TopicProduceData", topic_id=topic_id, partition_data=(data,)),
            ),
        )
    )
    [answered] = response.responses
    [partition] = answered.partition_responses
    return answered.topic_id, partition


def test_produce_by_id_writes_to_the_topic_of_the_id_and_an_unknown_id_is_refused(module_kafka_server):
    server = module_kafka_server
    create_topic(server, "ids-produce", 1)
    topic_id = topic_uuid(http_topic_id(server, "ids-produce"))
    with RawConnection(bootstrap(server)) as connection:
        answered_id, partition = produce_by_id(connection, topic_id, [b"one", b"two"])
        assert (answered_id, partition.error_code, partition.base_offset) == (topic_id, KafkaError.none, 0)
        unknown = uuid.uuid4()
        answered_id, partition = produce_by_id(connection, unknown, [b"lost"])
        assert (answered_id, partition.error_code) == (unknown, KafkaError.unknown_topic_id)
    assert [base64.b64decode(r["value"]) for r in http_side.fetch(server, "ids-produce", 0)] == [b"one", b"two"]


def test_one_id_over_both_doors_and_a_new_one_when_re_created(module_kafka_server):
    server = module_kafka_server
    create_topic(server, "ids-both-doors", 2)
    text = http_topic_id(server, "ids-both-doors")
    listed = {t["name"]: t["topic_id"] for t in server.client.get("/v1/topics").json()["topics"]}
    assert listed["ids-both-doors"] == text and len(text) == 22  # Kafka's text form, as its tools print it
    # librdkafka reads the id from Metadata (v12) and prints it as Kafka does.
    admin = AdminClient({"bootstrap.servers": bootstrap(server)})
    described = admin.describe_topics(TopicCollection(["ids-both-doors"]))["ids-both-doors"].result(WAIT_S)
    # librdkafka prints ids in standard base64 ("+/"), Kafka's own tools and HTTP URL-safe ("-_"): compare bits.
    assert str(described.topic_id).translate(str.maketrans("+/", "-_")) == text
    with RawConnection(bootstrap(server)) as connection:
        answered = metadata_by_id(connection, topic_uuid(text))
        assert (answered.error_code, answered.name, len(answered.partitions)) == (KafkaError.none, "ids-both-doors", 2)
        assert metadata_by_id(connection, uuid.uuid4()).error_code == KafkaError.unknown_topic_id

    server.client.delete("/v1/topics/ids-both-doors")
    create_topic(server, "ids-both-doors", 1)
    assert http_topic_id(server, "ids-both-doors") not in (text, None)


def test_kafka_python_creates_and_deletes_by_id(module_kafka_server):
    """kafka-python 3.0 sends CreateTopics v7 (the new topic's id answered) and deletes by id (DeleteTopics v6)."""
    from kafka.admin import KafkaAdminClient, NewTopic

    server = module_kafka_server
    admin = KafkaAdminClient(bootstrap_servers=bootstrap(server))
    try:
        [created] = admin.create_topics([NewTopic("ids-kafka-python", 1, 1)])["topics"]
        created_id = uuid.UUID(str(created["topic_id"]))
        assert created_id == topic_uuid(http_topic_id(server, "ids-kafka-python"))
        [deleted] = admin.delete_topics([created_id])["topics"]
        assert (deleted["name"], deleted["error_code"]) == ("ids-kafka-python", 0)
    finally:
        admin.close()
    assert server.client.get("/v1/topics/ids-kafka-python").status_code == 404


def test_an_id_of_a_re_created_topic_reads_and_deletes_nothing(module_kafka_server):
    """Fetch v13+ and DeleteTopics v6 by the id of a topic deleted and re-created under its name are
    UNKNOWN_TOPIC_ID: the new topic's records are never returned under the old id, nor is it deleted."""
    server = module_kafka_server
    name = "ids-re-created"
    create_topic(server, name, 1)
    http_side.produce(server, name, 0, [{"value": "old"}])
    old = topic_uuid(http_topic_id(server, name))
    with RawConnection(bootstrap(server)) as connection:
        answered_id, partition = fetch_by_id(connection, old)  # the listener now knows the id's name
        assert (answered_id, partition.error_code, partition.high_watermark) == (old, KafkaError.none, 1)
        assert partition.records

        server.client.delete(f"/v1/topics/{name}")
        create_topic(server, name, 1)
        http_side.produce(server, name, 0, [{"value": "new"}, {"value": "newer"}])
        for version in (13, FETCH_BY_ID, 18):
            answered_id, partition = fetch_by_id(connection, old, version)
            assert (answered_id, partition.error_code) == (old, KafkaError.unknown_topic_id)
            assert not partition.records
        assert fetch_by_id(connection, uuid.uuid4())[1].error_code == KafkaError.unknown_topic_id

        refused = delete_by_id(connection, old)
        assert (refused.error_code, refused.topic_id) == (KafkaError.unknown_topic_id, old)
        assert server.client.get(f"/v1/topics/{name}").status_code == 200

        new = topic_uuid(http_topic_id(server, name))
        assert fetch_by_id(connection, new)[1].high_watermark == 2
        deleted = delete_by_id(connection, new)
        assert (deleted.error_code, deleted.name, deleted.topic_id) == (KafkaError.none, name, new)
    assert server.client.get(f"/v1/topics/{name}").status_code == 404


def test_ids_give_no_name_or_records_away_to_whom_may_not_see_them(make_server):
    """With `--auth required`, a principal without ACLs on a topic asks for it by id: refused
    without its name, as Kafka does, and neither read nor deleted."""
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    server = make_server(kafka_listener="127.0.0.1:0", auth="required", admin_token=ADMIN_TOKEN)
    assert server.client.post("/v1/topics", json={"name": "ids-guarded"}, headers=admin).status_code == 201
    guarded = topic_uuid(server.client.get("/v1/topics/ids-guarded", headers=admin).json()["topic_id"])
    _, api_key = new_principal(server, "stranger")
    with RawConnection(bootstrap(server)) as connection:
        assert log_in(connection, "stranger", api_key).error_code == KafkaError.none
        described = metadata_by_id(connection, guarded)
        assert (described.error_code, described.name, described.topic_id) == (
            KafkaError.topic_authorization_failed,
            None,
            guarded,
        )
        assert fetch_by_id(connection, guarded)[1].error_code == KafkaError.topic_authorization_failed
        refused = delete_by_id(connection, guarded)
        assert (refused.error_code, refused.name) == (KafkaError.topic_authorization_failed, None)
    assert server.client.get("/v1/topics/ids-guarded", headers=admin).status_code == 200


def test_an_id_of_a_re_created_topic_writes_nothing(module_kafka_server):
    """Produce v13 by the id of a topic deleted and re-created under its name is UNKNOWN_TOPIC_ID,
    also on a connection whose listener resolved that id before (it remembers ids' names): the
    records meant for the deleted topic never land in the new one."""
    server = module_kafka_server
    name = "ids-re-created-produce"
    create_topic(server, name, 1)
    old = topic_uuid(http_topic_id(server, name))
    with RawConnection(bootstrap(server)) as connection:
        answered_id, partition = produce_by_id(connection, old, [b"old"])  # the listener now knows the id's name
        assert (answered_id, partition.error_code, partition.base_offset) == (old, KafkaError.none, 0)

        server.client.delete(f"/v1/topics/{name}")
        create_topic(server, name, 1)
        answered_id, partition = produce_by_id(connection, old, [b"meant for the deleted topic"])
        assert (answered_id, partition.error_code) == (old, KafkaError.unknown_topic_id)

        new = topic_uuid(http_topic_id(server, name))
        answered_id, partition = produce_by_id(connection, new, [b"new"])
        assert (answered_id, partition.error_code, partition.base_offset) == (new, KafkaError.none, 0)
    assert [base64.b64decode(r["value"]) for r in http_side.fetch(server, name, 0)] == [b"new"]
