"""Identifiers sent over Kafka's wire protocol hold to the limit HTTP's schemas enforce (1024 bytes in
UTF-8, app/coordinator/identifiers.py): the core's operations check them, so a longer one is refused
with Kafka's error for an id it finds invalid, never a PostgreSQL error ("index row size exceeds
maximum") answered as UNKNOWN_SERVER_ERROR or a closed connection, and nothing is written. A group
id is INVALID_GROUP_ID on every group API (Kafka's GroupCoordinator validates the group id of each,
look-ups included) and on AddOffsetsToTxn; a transactional id INVALID_REQUEST (Kafka's
TransactionCoordinator's answer for an invalid one), DescribeTransactions included. An id of exactly
1024 bytes works through every API. An empty group id is INVALID_GROUP_ID where Kafka's coordinator
refuses it, and a group like any other where it does not. A member id the server makes from a long
client id is cut to fit. The ids over the limit are random (incompressible): PostgreSQL compresses an index row, so a
repetitive long id could slip under its row limit and hide the bug."""

from __future__ import annotations

import asyncio
import secrets

import asyncpg
import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import KafkaError as ConfluentError
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.kafka import raw_groups, raw_transactions
from tests.kafka.clients import WAIT_S, bootstrap, create_topic
from tests.kafka.raw import RawConnection, nested, request_frame, request_of
from tests.kafka.raw_transactions import RawProducer, init_producer

TOPIC = "identifier-limits"
MAX_IDENTIFIER_BYTES = 1024  # docs/api.md: the longest identifier txbroker stores
OVER_LIMIT_BYTES = 3000
# Every identifier column the Kafka door's group and transaction APIs write.
STORED_IDENTIFIERS = (
    ("consumer_groups", "group_id"),
    ("group_members", "group_id"),
    ("group_members", "member_id"),
    ("group_offsets", "group_id"),
    ("pending_txn_offsets", "group_id"),
    ("transactions", "transactional_id"),
    ("producer_ids", "transactional_id"),
)


def identifier(prefix: str, size: int) -> str:
    """A random ASCII identifier of exactly `size` bytes."""
    return (prefix + secrets.token_urlsafe(size))[:size]


def over_limit(prefix: str) -> str:
    return identifier(prefix, OVER_LIMIT_BYTES)


def at_limit(prefix: str) -> str:
    return identifier(prefix, MAX_IDENTIFIER_BYTES)


@pytest.fixture(scope="module")
def server(module_kafka_server):
    create_topic(module_kafka_server, TOPIC, 1)
    return module_kafka_server


@pytest.fixture
def connection(server):
    with RawConnection(bootstrap(server)) as raw:
        yield raw


def longest_stored(server) -> dict[str, int]:
    """The longest identifier (bytes) of each column the group and transaction APIs write."""

    async def query() -> dict[str, int]:
        conn = await asyncpg.connect(server.database_url)
        try:
            return {
                f"{table}.{column}": await conn.fetchval(
                    f"SELECT coalesce(max(octet_length({column})), 0) FROM {table}"
                )
                for table, column in STORED_IDENTIFIERS
            }
        finally:
            await conn.close()

    return asyncio.run(query())


def nothing_over_the_limit_stored(server) -> None:
    longest = longest_stored(server)
    assert all(size <= MAX_IDENTIFIER_BYTES for size in longest.values()), longest


# ---- the group APIs: each request of a group id, its error code


def join(connection, group):
    return raw_groups.join(connection, group).error_code


def sync(connection, group):
    return raw_groups.sync(connection, group, "some-member", 1, {}).error_code


def heartbeat(connection, group):
    return raw_groups.heartbeat(connection, group, "some-member", 1).error_code


def leave(connection, group):
    response = connection.call(
        request_of(
            api_table.LEAVE_GROUP,
            5,
            group_id=group,
            members=(
                nested(
                    api_table.LEAVE_GROUP,
                    5,
                    "MemberIdentity",
                    member_id="some-member",
                    group_instance_id=None,
                    reason=None,
                ),
            ),
        )
    )
    return response.error_code


def offset_commit(connection, group):
    return raw_groups.commit(connection, group, "", -1, None, TOPIC, 7)


def offset_fetch(connection, group):
    topics = (nested(api_table.OFFSET_FETCH, 7, "OffsetFetchRequestTopic", name=TOPIC, partition_indexes=(0,)),)
    response = connection.call(
        request_of(api_table.OFFSET_FETCH, 7, group_id=group, topics=topics, require_stable=False)
    )
    return response.error_code


def offset_delete(connection, group):
    partition = nested(api_table.OFFSET_DELETE, 0, "OffsetDeleteRequestPartition", partition_index=0)
    topic = nested(api_table.OFFSET_DELETE, 0, "OffsetDeleteRequestTopic", name=TOPIC, partitions=(partition,))
    return connection.call(request_of(api_table.OFFSET_DELETE, 0, group_id=group, topics=(topic,))).error_code


def describe_groups(connection, group):
    return raw_groups.describe(connection, group).error_code


def delete_groups(connection, group):
    [result] = connection.call(request_of(api_table.DELETE_GROUPS, 2, groups_names=(group,))).results
    return result.error_code


def add_offsets_to_txn(connection, group):
    producer = init_producer(connection, f"tid-add-offsets-{secrets.token_hex(4)}")
    return raw_transactions.add_offsets(connection, producer, group)


def txn_offset_commit_of(connection, group):
    producer = init_producer(connection, f"tid-txn-commit-{secrets.token_hex(4)}")
    [error] = raw_transactions.txn_offset_commit(connection, producer, group, TOPIC, 7)
    return error


GROUP_APIS = [
    join,
    sync,
    heartbeat,
    leave,
    offset_commit,
    offset_fetch,
    offset_delete,
    describe_groups,
    delete_groups,
    add_offsets_to_txn,
    txn_offset_commit_of,
]


@pytest.mark.parametrize("api", GROUP_APIS, ids=lambda api: api.__name__)
def test_a_group_id_over_the_limit_is_invalid_group_id_and_writes_nothing(server, connection, api):
    assert api(connection, over_limit(f"group-{api.__name__}-")) == KafkaError.invalid_group_id
    nothing_over_the_limit_stored(server)


# Kafka's group coordinator (GroupCoordinatorService) refuses an empty group id on the APIs of a
# member and on TxnOffsetCommit and OffsetDelete; OffsetCommit, OffsetFetch, DescribeGroups and
# DeleteGroups refuse only a null one (the empty id is a group like any other there), and
# AddOffsetsToTxn checks no group id at all.
EMPTY_GROUP_ID_REFUSED = [join, sync, heartbeat, leave, offset_delete, txn_offset_commit_of]


@pytest.mark.parametrize("api", EMPTY_GROUP_ID_REFUSED, ids=lambda api: api.__name__)
def test_an_empty_group_id_is_invalid_group_id_where_kafka_refuses_it(server, connection, api):
    assert api(connection, "") == KafkaError.invalid_group_id


def test_an_empty_group_id_is_a_group_for_offsets_describe_and_delete_as_in_kafka(server, connection):
    """As Kafka's coordinator: the group "" takes a simple consumer's commit, fetches it back, is
    described (Empty, no members) and deleted; AddOffsetsToTxn with it is answered NONE."""
    assert raw_groups.commit(connection, "", "", -1, None, TOPIC, 5) == KafkaError.none
    topics = (nested(api_table.OFFSET_FETCH, 7, "OffsetFetchRequestTopic", name=TOPIC, partition_indexes=(0,)),)
    fetched = connection.call(request_of(api_table.OFFSET_FETCH, 7, group_id="", topics=topics, require_stable=False))
    assert fetched.error_code == KafkaError.none
    assert [p.committed_offset for t in fetched.topics for p in t.partitions] == [5]
    described = raw_groups.describe(connection, "")
    assert (described.error_code, described.group_state, described.members) == (KafkaError.none, "Empty", ())
    assert delete_groups(connection, "") == KafkaError.none
    assert delete_groups(connection, "") == KafkaError.group_id_not_found
    assert add_offsets_to_txn(connection, "") == KafkaError.none


def test_a_group_id_at_the_limit_goes_through_every_group_api(server, connection):
    group = at_limit("group-at-limit-")
    required = raw_groups.join(connection, group)
    assert required.error_code == KafkaError.member_id_required
    joined = raw_groups.join(connection, group, member=required.member_id)
    assert (joined.error_code, joined.leader) == (KafkaError.none, required.member_id)
    member, generation = joined.member_id, joined.generation_id
    assert raw_groups.sync(connection, group, member, generation, {member: b"assigned"}).assignment == b"assigned"
    assert raw_groups.heartbeat(connection, group, member, generation).error_code == KafkaError.none
    assert raw_groups.commit(connection, group, member, generation, None, TOPIC, 7) == KafkaError.none
    assert offset_fetch(connection, group) == KafkaError.none
    assert raw_groups.describe(connection, group).group_state == "Stable"
    assert raw_groups.leave(connection, group, [(member, None)]) == [KafkaError.none]
    assert offset_delete(connection, group) == KafkaError.none
    raw_groups.commit(connection, group, "", -1, None, TOPIC, 8)
    assert delete_groups(connection, group) == KafkaError.none
    assert delete_groups(connection, group) == KafkaError.group_id_not_found


def test_a_group_id_at_the_limit_takes_transactional_offsets(server, connection):
    group = at_limit("group-txn-at-limit-")
    producer = init_producer(connection, f"tid-group-at-limit-{secrets.token_hex(4)}")
    assert raw_transactions.add_offsets(connection, producer, group) == KafkaError.none
    assert raw_transactions.txn_offset_commit(connection, producer, group, TOPIC, 11) == [KafkaError.none]
    assert raw_transactions.end_txn(connection, producer, True, version=3).error_code == KafkaError.none
    topics = (nested(api_table.OFFSET_FETCH, 7, "OffsetFetchRequestTopic", name=TOPIC, partition_indexes=(0,)),)
    fetched = connection.call(request_of(api_table.OFFSET_FETCH, 7, group_id=group, topics=topics, require_stable=True))
    assert [p.committed_offset for t in fetched.topics for p in t.partitions] == [11]


def test_a_member_id_made_from_a_long_client_id_fits_the_limit(server, connection):
    """Kafka's member ids are the client id and a UUID; a client id of any length (the request
    header's, up to 32767 bytes) still makes a member id the group can store."""
    group = "group-long-client-id"
    client_id = over_limit("client-")
    request = request_of(
        api_table.JOIN_GROUP,
        9,
        group_id=group,
        session_timeout=raw_groups.LONG,
        rebalance_timeout=raw_groups.SHORT,
        member_id="",
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(nested(api_table.JOIN_GROUP, 9, "JoinGroupRequestProtocol", name="range", metadata=b""),),
        reason=None,
    )
    connection.send_bytes(request_frame(request, 1, client_id=client_id))
    required = connection.receive(api_table.JOIN_GROUP, 9, 1)
    assert required.error_code == KafkaError.member_id_required
    member = required.member_id
    assert len(member.encode()) <= MAX_IDENTIFIER_BYTES and client_id.startswith(member.rsplit("-", 5)[0])
    joined = raw_groups.join(connection, group, member=member)
    assert (joined.error_code, joined.member_id) == (KafkaError.none, member)
    assert [m.member_id for m in raw_groups.describe(connection, group).members] == [member]
    assert raw_groups.leave(connection, group, [(member, None)]) == [KafkaError.none]
    nothing_over_the_limit_stored(server)


def test_a_group_instance_id_over_the_limit_is_invalid_request(server, connection):
    group = "group-long-instance-id"
    joined = raw_groups.join(connection, group, instance=over_limit("instance-"))
    assert (joined.error_code, joined.member_id) == (KafkaError.invalid_request, "")
    assert raw_groups.describe(connection, group).group_state == "Dead"  # no group was made
    instance = at_limit("instance-")
    joined = raw_groups.join(connection, group, instance=instance)
    assert joined.error_code == KafkaError.none
    assert [m.group_instance_id for m in raw_groups.describe(connection, group).members] == [instance]


# ---- the transaction APIs


def test_init_producer_id_of_a_transactional_id_over_the_limit_is_invalid_request(server, connection):
    response = connection.call(
        request_of(
            api_table.INIT_PRODUCER_ID,
            4,
            transactional_id=over_limit("tid-init-"),
            transaction_timeout=raw_groups.LONG,
            producer_id=-1,
            producer_epoch=-1,
        )
    )
    assert (response.error_code, response.producer_id) == (KafkaError.invalid_request, -1)
    nothing_over_the_limit_stored(server)


def _an_id_of_another(connection) -> RawProducer:
    """A producer id and epoch a valid transactional id holds, sent with an id over the limit."""
    valid = init_producer(connection, f"tid-valid-{secrets.token_hex(4)}")
    return RawProducer(over_limit("tid-"), valid.producer_id, valid.epoch)


def test_the_transaction_apis_answer_invalid_request_for_a_transactional_id_over_the_limit(server, connection):
    """AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn (and a transactional Produce)
    name an id no transaction can have: INVALID_REQUEST, not INVALID_PRODUCER_ID_MAPPING."""
    producer = _an_id_of_another(connection)
    assert raw_transactions.add_partitions(connection, producer, TOPIC, [0]) == [KafkaError.invalid_request]
    assert raw_transactions.add_offsets(connection, producer, "group-of-long-tid") == KafkaError.invalid_request
    assert raw_transactions.txn_offset_commit(connection, producer, "group-of-long-tid", TOPIC, 3) == [
        KafkaError.invalid_request
    ]
    assert raw_transactions.end_txn(connection, producer, True, version=3).error_code == KafkaError.invalid_request
    assert (
        raw_transactions.produce(connection, producer, TOPIC, 0, [b"never"], sequence=0) == KafkaError.invalid_request
    )
    nothing_over_the_limit_stored(server)


def describe_transaction(connection, transactional_id: str):
    [state] = connection.call(
        request_of(api_table.DESCRIBE_TRANSACTIONS, 0, transactional_ids=(transactional_id,))
    ).transaction_states
    return state


def test_describe_transactions_of_an_id_over_the_limit_is_invalid_request(server, connection):
    assert describe_transaction(connection, over_limit("tid-described-")).error_code == KafkaError.invalid_request


def test_a_transactional_id_at_the_limit_goes_through_every_transaction_api(server, connection):
    producer = init_producer(connection, at_limit("tid-at-limit-"))
    assert raw_transactions.add_partitions(connection, producer, TOPIC, [0]) == [KafkaError.none]
    assert raw_transactions.produce(connection, producer, TOPIC, 0, [b"at-limit"], sequence=0) == KafkaError.none
    assert raw_transactions.add_offsets(connection, producer, "group-of-tid-at-limit") == KafkaError.none
    assert raw_transactions.txn_offset_commit(connection, producer, "group-of-tid-at-limit", TOPIC, 5) == [
        KafkaError.none
    ]
    described = describe_transaction(connection, producer.transactional_id)
    assert (described.error_code, described.transaction_state) == (KafkaError.none, "Ongoing")
    assert raw_transactions.end_txn(connection, producer, True, version=3).error_code == KafkaError.none
    described = server.client.get(f"/v1/transactions/{producer.transactional_id}")
    assert described.status_code == 200, described.text
    assert described.json()["state"] == "CompleteCommit"


# ---- real clients: the error each gets, no hang, no unknown server error


# librdkafka retries an InitProducerId answered INVALID_REQUEST until init_transactions' timeout (as
# with Kafka's answer for an empty id), then raises that error: a short timeout keeps the test short;
# the first answer comes long before it.
INIT_TRANSACTIONS_TIMEOUT_S = 10


def test_confluent_kafka_transactional_id_over_the_limit_fails_init_transactions_with_invalid_request(server):
    producer = Producer({"bootstrap.servers": bootstrap(server), "transactional.id": over_limit("tid-confluent-")})
    with pytest.raises(KafkaException) as raised:
        producer.init_transactions(INIT_TRANSACTIONS_TIMEOUT_S)
    del producer  # destroyed now, not after the module's server stopped
    assert raised.value.args[0].code() == ConfluentError.INVALID_REQUEST
    nothing_over_the_limit_stored(server)


def test_confluent_kafka_group_id_over_the_limit_gets_invalid_group_id(server):
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap(server),
            "group.id": over_limit("group-confluent-"),
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([TOPIC])
        errors = []
        for _ in range(WAIT_S):
            message = consumer.poll(1)
            if message is not None and message.error() is not None:
                errors.append(message.error().code())
                break
        assert errors == [ConfluentError.INVALID_GROUP_ID]
    finally:
        consumer.close()
    nothing_over_the_limit_stored(server)
