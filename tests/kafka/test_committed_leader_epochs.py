"""Committed leader epochs, kept with the offset as Kafka's group coordinator keeps them (issue 23):
OffsetCommit v6+ and TxnOffsetCommit v2+ send one, OffsetFetch v5+ returns it; older versions store
-1 and read none. A transactional commit's epoch settles with its offset at COMMIT and goes with it
at ABORT. HTTP's commits store theirs too (-1 without one) and HTTP's fetch shows it: one set.

Regression (found by kafka-python's own `test_transactional_producer_offsets`): every offset read
back with leader epoch -1, whatever was committed."""

from __future__ import annotations

from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.kafka.clients import WAIT_S, bootstrap, create_topic
from tests.kafka.group_clients import ConfluentMember, poll_until
from tests.kafka.raw import RawConnection, nested, request_of
from tests.kafka.raw_groups import commit, fetch_offsets
from tests.kafka.raw_transactions import add_offsets, end_txn, init_producer, txn_offset_commit

# The lowest OffsetFetch with committed_leader_epoch in its answer, and the last one without.
FETCH_WITH_EPOCH = 5
FETCH_WITHOUT_EPOCH = 4


def fetched(connection, group: str, topic: str, version: int = 7):
    """OffsetFetch (v1-v7: one group) of partition 0: its answered partition."""
    response = fetch_offsets(connection, group, [(topic, 0)], version)
    [answered_topic] = response.topics
    [answer] = answered_topic.partitions
    assert answer.error_code == KafkaError.none, answer
    return answer


def committed(connection, group: str, topic: str) -> tuple[int, int]:
    answer = fetched(connection, group, topic)
    return answer.committed_offset, answer.committed_leader_epoch


def http_committed(server, group: str, topic: str) -> tuple[int, int]:
    response = server.client.post(
        f"/v1/groups/{group}/offsets/fetch", json={"partitions": [{"topic": topic, "partition": 0}]}
    )
    assert response.status_code == 200, response.text
    [entry] = response.json()["offsets"]
    return entry["offset"], entry["leader_epoch"]


def http_commit(server, group: str, topic: str, offset: int, **epoch):
    return server.client.post(
        f"/v1/groups/{group}/offsets/commit",
        json={"offsets": [{"topic": topic, "partition": 0, "offset": offset, **epoch}]},
    )


def test_offset_commit_keeps_the_leader_epoch_and_offset_fetch_returns_it_by_version(module_kafka_server):
    server = module_kafka_server
    topic, group = "epochs", "epochs-group"
    create_topic(server, topic, 1)
    with RawConnection(bootstrap(server)) as connection:
        assert committed(connection, group, topic) == (-1, -1)  # nothing committed
        assert commit(connection, group, "", -1, None, topic, 5, version=8, leader_epoch=7) == KafkaError.none
        for version in (FETCH_WITH_EPOCH, 7, 9):
            if version < 8:
                answer = fetched(connection, group, topic, version)
            else:
                answer = fetched_v8(connection, group, topic, version)
            assert (answer.committed_offset, answer.committed_leader_epoch) == (5, 7), version
        older = fetched(connection, group, topic, FETCH_WITHOUT_EPOCH)
        assert older.committed_offset == 5 and not hasattr(older, "committed_leader_epoch")
        assert http_committed(server, group, topic) == (5, 7)

        # OffsetCommit v5 has no epoch: the commit stores none, as Kafka's (the field's default, -1).
        assert commit(connection, group, "", -1, None, topic, 6, version=5, leader_epoch=7) == KafkaError.none
        assert committed(connection, group, topic) == (6, -1)
        assert commit(connection, group, "", -1, None, topic, 7, version=6, leader_epoch=2) == KafkaError.none
        assert committed(connection, group, topic) == (7, 2)

        # HTTP's commits are the same set: with an epoch it is kept, without one it is -1 (as a
        # Kafka commit without one), never the epoch of the commit before.
        assert http_commit(server, group, topic, 8, leader_epoch=3).status_code == 200
        assert committed(connection, group, topic) == (8, 3)
        assert http_commit(server, group, topic, 9).status_code == 200
        assert committed(connection, group, topic) == (9, -1)
    refused = http_commit(server, group, topic, 10, leader_epoch=-2)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "INVALID_REQUEST", refused.text
    assert http_committed(server, group, topic) == (9, -1)


def fetched_v8(connection, group: str, topic: str, version: int):
    """OffsetFetch v8+ (groups) of one group's partition 0."""
    key = api_table.OFFSET_FETCH
    group_request = nested(
        key,
        version,
        "OffsetFetchRequestGroup",
        group_id=group,
        member_id=None,
        member_epoch=-1,
        topics=(nested(key, version, "OffsetFetchRequestTopics", name=topic, partition_indexes=(0,)),),
    )
    response = connection.call(request_of(key, version, groups=(group_request,), require_stable=False))
    [answered_group] = response.groups
    [answered_topic] = answered_group.topics
    [answer] = answered_topic.partitions
    return answer


def test_a_transactional_commit_carries_its_leader_epoch_to_commit_and_drops_it_at_abort(module_kafka_server):
    server = module_kafka_server
    topic, group = "txn-epochs", "txn-epochs-group"
    create_topic(server, topic, 1)
    with RawConnection(bootstrap(server)) as connection:
        assert commit(connection, group, "", -1, None, topic, 1, leader_epoch=2) == KafkaError.none
        producer = init_producer(connection, "tid-txn-epochs")

        assert add_offsets(connection, producer, group) == KafkaError.none
        assert txn_offset_commit(connection, producer, group, topic, 7, leader_epoch=5) == [KafkaError.none]
        assert committed(connection, group, topic) == (1, 2)  # pending: the earlier commit shows
        assert end_txn(connection, producer, True, version=3).error_code == KafkaError.none
        assert committed(connection, group, topic) == (7, 5)

        assert add_offsets(connection, producer, group) == KafkaError.none
        assert txn_offset_commit(connection, producer, group, topic, 9, leader_epoch=6) == [KafkaError.none]
        assert end_txn(connection, producer, False, version=3).error_code == KafkaError.none
        assert committed(connection, group, topic) == (7, 5)  # aborted: offset and epoch both gone

        # TxnOffsetCommit v1 has no epoch: its offset settles with none.
        assert add_offsets(connection, producer, group) == KafkaError.none
        assert txn_offset_commit(connection, producer, group, topic, 10, version=1, leader_epoch=6) == [KafkaError.none]
        assert end_txn(connection, producer, True, version=3).error_code == KafkaError.none
        assert committed(connection, group, topic) == (10, -1)
    assert http_committed(server, group, topic) == (10, -1)


def test_http_transactional_commit_keeps_its_leader_epoch(module_kafka_server):
    server = module_kafka_server
    topic, group, transactional_id = "http-txn-epochs", "http-txn-epochs-group", "tid-http-txn-epochs"
    create_topic(server, topic, 1)
    response = server.client.post(
        "/v1/producers/init", json={"transactional_id": transactional_id, "transaction_timeout_ms": 60_000}
    )
    assert response.status_code == 200, response.text
    ids = {"transactional_id": transactional_id, **response.json()}
    response = server.client.post(
        "/v1/txn/offset-commit",
        json={**ids, "group_id": group, "offsets": [{"topic": topic, "partition": 0, "offset": 4, "leader_epoch": 8}]},
    )
    assert response.status_code == 200, response.text
    assert http_committed(server, group, topic) == (-1, -1)
    response = server.client.post("/v1/txn/end", json={**ids, "committed": True})
    assert response.status_code == 200, response.text
    with RawConnection(bootstrap(server)) as connection:
        assert committed(connection, group, topic) == (4, 8)


def test_kafka_python_reads_back_the_leader_epoch_it_committed(module_kafka_server):
    """kafka-python's own test_transactional_producer_offsets (offsets sent to a transaction with
    leader epoch 0, read back by its admin client), and a consumer's commit read back by committed()."""
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KafkaPythonPartition
    from kafka.admin import KafkaAdminClient
    from kafka.structs import OffsetAndMetadata

    server = module_kafka_server
    topic = "kafka-python-epochs"
    create_topic(server, topic, 1)
    partition = KafkaPythonPartition(topic, 0)
    producer = KafkaProducer(bootstrap_servers=bootstrap(server), transactional_id="kafka-python-epochs")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap(server))
    consumer = KafkaConsumer(bootstrap_servers=bootstrap(server), group_id="kp-consumer", enable_auto_commit=False)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_offsets_to_transaction({partition: OffsetAndMetadata(0, "metadata", 0)}, "kp-txn")
        producer.commit_transaction()
        assert admin.list_group_offsets({"kp-txn": None}) == {
            "kp-txn": {partition: OffsetAndMetadata(0, "metadata", 0)}
        }

        consumer.commit({partition: OffsetAndMetadata(5, "meta", 3)})
        assert consumer.committed(partition, metadata=True) == OffsetAndMetadata(5, "meta", 3)
        assert admin.list_group_offsets({"kp-consumer": None})["kp-consumer"][partition].leader_epoch == 3
    finally:
        consumer.close()
        admin.close()
        producer.close(WAIT_S)


def test_confluent_kafka_reads_back_the_leader_epoch_it_committed_and_resumes_there(module_kafka_server):
    server = module_kafka_server
    topic, group = "confluent-epochs", "confluent-epochs-group"
    create_topic(server, topic, 1)
    producer = Producer({"bootstrap.servers": bootstrap(server)})
    for i in range(8):
        producer.produce(topic, value=f"v{i}".encode(), partition=0)
    assert producer.flush(WAIT_S) == 0
    committer = Consumer({"bootstrap.servers": bootstrap(server), "group.id": group, "enable.auto.commit": False})
    try:
        committer.commit(offsets=[TopicPartition(topic, 0, 5, leader_epoch=3)], asynchronous=False)
        [read_back] = committer.committed([TopicPartition(topic, 0)], timeout=WAIT_S)
        assert (read_back.error, read_back.offset, read_back.leader_epoch) == (None, 5, 3)
    finally:
        committer.close()
    # A member of the group resumes at the committed offset: an epoch it got back changes nothing
    # there (txbroker's partitions have leader epoch -1, so the client has nothing to check it against).
    member = ConfluentMember(server, group, topic)
    try:
        consumed = poll_until([member], lambda c: len(c[0]) >= 3, "the records after the commit")[0]
        assert [c.offset for c in consumed] == [5, 6, 7]
    finally:
        member.close()
