"""Deleting consumer groups, one core operation behind both doors: HTTP's `DELETE /v1/groups/{id}`
and Kafka's DeleteGroups (confluent-kafka's `delete_consumer_groups`, kafka-python's `delete_groups`,
raw requests). A group without members goes with all its offsets, committed and pending
transactional ones, leaving tombstones in `__consumer_offsets`; one with members is NON_EMPTY_GROUP,
an unknown one GROUP_ID_NOT_FOUND; a group of either kind is deletable from either door, and the id
then starts a fresh group. Then deleting some of a group's offsets: HTTP's
`POST /v1/groups/{id}/offsets/delete` and Kafka's OffsetDelete (kafka-python's
`delete_group_offsets`, raw requests), GROUP_SUBSCRIBED_TO_TOPIC for a topic a member subscribes
to. The ACL rules (Delete on the group, Read on the topics) are tested in test_security.py."""

from __future__ import annotations

import threading

import httpx
import orjson
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.error import KafkaException
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.api.test_transactions import _wait_for
from tests.concurrency.test_batched_writes import _HeldPartition, _waiting_for_a_lock
from tests.kafka import raw_groups
from tests.kafka.clients import WAIT_S, bootstrap, create_topic
from tests.kafka.raw import RawConnection, nested, request_of
from txbroker.errors import GroupIdNotFoundError, GroupSubscribedToTopicError, NonEmptyGroupError
from txbroker.records import TopicPartition
from txbroker.sync import Admin
from txbroker.wire import partition_for_key

TOPIC = "deleted-groups"
OTHER_TOPIC = "deleted-groups-other"
OFFSETS_TOPIC = "__consumer_offsets"


@pytest.fixture(scope="module")
def server(module_kafka_server):
    create_topic(module_kafka_server, TOPIC, 2)
    create_topic(module_kafka_server, OTHER_TOPIC, 1)
    return module_kafka_server


def commit(client: httpx.Client, group: str, offsets: dict[int, int], topic: str = TOPIC) -> None:
    response = client.post(
        f"/v1/groups/{group}/offsets/commit",
        json={"offsets": [{"topic": topic, "partition": p, "offset": o} for p, o in offsets.items()]},
    )
    assert response.status_code == 200, response.text
    assert [e["error"] for e in response.json()["offsets"]] == [None] * len(offsets)


def committed(server, group: str, topic: str = TOPIC) -> dict[int, int]:
    response = server.client.post(f"/v1/groups/{group}/offsets/fetch", json={"partitions": None})
    assert response.status_code == 200, response.text
    return {e["partition"]: e["offset"] for e in response.json()["offsets"] if e["offset"] >= 0 and e["topic"] == topic}


def delete(server, group: str):
    return server.client.delete(f"/v1/groups/{group}")


def error_code(response) -> str:
    return response.json()["error"]["code"]


def join_over_http(server, group: str, topic: str = TOPIC) -> dict:
    response = server.client.post(
        f"/v1/groups/{group}/heartbeat", json={"member_id": "", "generation_id": -1, "topics": [topic]}
    )
    assert response.status_code == 200, response.text
    return response.json()


def console_lists(server, group: str) -> bool:
    """Whether the console's groups page links to the group."""
    return f'href="/console/groups/{group}"' in server.client.get(f"/console/groups?prefix={group}").text


def offsets_partition(server, group: str) -> int:
    partitions = len(server.client.get(f"/v1/topics/{OFFSETS_TOPIC}").json()["partitions"])
    return partition_for_key(group.encode(), partitions)


def offsets_records(server, group: str) -> dict[int, str | None]:
    """partition -> the value of the group's last record for TOPIC's partition in `__consumer_offsets`."""
    partition = offsets_partition(server, group)
    response = server.client.post(
        "/v1/fetch",
        json={
            "isolation_level": "read_committed",
            "max_records": 10000,
            "partitions": [{"topic": OFFSETS_TOPIC, "partition": partition, "offset": 0}],
        },
    )
    assert response.status_code == 200, response.text
    last = {}
    for record in response.json()["partitions"][0]["records"]:
        key = orjson.loads(record["key"])
        if key[:2] == [group, TOPIC]:
            last[key[2]] = record["value"]
    return last


# ---- HTTP


def test_an_empty_group_is_deleted_with_its_offsets_and_starts_afresh(server):
    group = "deleted-empty"
    commit(server.client, group, {0: 5, 1: 7})
    member = join_over_http(server, group)
    assert server.client.post(f"/v1/groups/{group}/leave", json={"member_id": member["member_id"]}).status_code == 200
    assert console_lists(server, group)

    assert delete(server, group).status_code == 204
    missing = server.client.get(f"/v1/groups/{group}")
    assert (missing.status_code, error_code(missing)) == (404, "GROUP_ID_NOT_FOUND")
    assert committed(server, group) == {}
    assert group not in [g["group_id"] for g in server.client.get("/v1/groups").json()["groups"]]
    assert not console_lists(server, group)
    # Kafka's tombstones: compaction drops the deleted group's offset records.
    assert offsets_records(server, group) == {0: None, 1: None}
    again = delete(server, group)
    assert (again.status_code, error_code(again)) == (404, "GROUP_ID_NOT_FOUND")

    # The id starts a fresh group: generation 1 for its first member, no offsets.
    fresh = join_over_http(server, group)
    assert fresh["generation_id"] == 1
    described = server.client.get(f"/v1/groups/{group}").json()
    assert (described["generation_id"], described["offsets"]) == (1, [])


def test_a_group_with_a_member_is_not_deleted(server):
    group = "deleted-non-empty"
    commit(server.client, group, {0: 3})
    member = join_over_http(server, group)
    refused = delete(server, group)
    assert (refused.status_code, error_code(refused)) == (409, "NON_EMPTY_GROUP")
    assert member["member_id"] in refused.json()["error"]["message"]
    assert committed(server, group) == {0: 3}
    assert server.client.post(f"/v1/groups/{group}/leave", json={"member_id": member["member_id"]}).status_code == 200
    assert delete(server, group).status_code == 204


def test_an_unknown_group_is_not_found(server):
    response = delete(server, "deleted-never-existed")
    assert (response.status_code, error_code(response)) == (404, "GROUP_ID_NOT_FOUND")


def test_a_pending_transactional_offset_goes_with_its_group(server):
    """The transaction's COMMIT after the deletion writes no offset: the group it was for is gone."""
    group = "deleted-pending"
    init = server.client.post("/v1/producers/init", json={"transactional_id": "deleted-pending-txn"}).json()
    producer = {
        "transactional_id": "deleted-pending-txn",
        "producer_id": init["producer_id"],
        "producer_epoch": init["producer_epoch"],
    }
    response = server.client.post(
        "/v1/txn/offset-commit",
        json={**producer, "group_id": group, "offsets": [{"topic": TOPIC, "partition": 1, "offset": 9}]},
    )
    assert response.status_code == 200, response.text
    assert server.client.get(f"/v1/groups/{group}").json()["offsets"] == []  # pending only
    assert delete(server, group).status_code == 204
    assert server.client.post("/v1/txn/end", json={**producer, "committed": True}).status_code == 200
    assert committed(server, group) == {}
    assert server.client.get(f"/v1/groups/{group}").status_code == 404
    assert offsets_records(server, group) == {1: None}


def test_a_kafka_group_is_deleted_over_http_and_rejoins_afresh(server):
    group = "deleted-classic"
    with RawConnection(bootstrap(server)) as connection:
        joined = raw_groups.join(connection, group)
        assert joined.error_code == KafkaError.member_id_required
        joined = raw_groups.join(connection, group, joined.member_id)
        assert (joined.error_code, joined.generation_id) == (KafkaError.none, 1)
        member = joined.member_id
        assert raw_groups.sync(connection, group, member, 1, {member: b""}).error_code == KafkaError.none
        assert raw_groups.commit(connection, group, member, 1, None, TOPIC, 11) == KafkaError.none
        refused = delete(server, group)
        assert (refused.status_code, error_code(refused)) == (409, "NON_EMPTY_GROUP")
        assert raw_groups.leave(connection, group, [(member, None)]) == [KafkaError.none]
        pending = raw_groups.join(connection, group)  # a pending member (KIP-394) is no member yet
        assert pending.error_code == KafkaError.member_id_required
        assert delete(server, group).status_code == 204
        assert committed(server, group) == {}
        assert raw_groups.describe(connection, group).group_state == "Dead"
        # The old member ids mean nothing to the new group; a new member starts at generation 1.
        assert raw_groups.heartbeat(connection, group, member, 1).error_code == KafkaError.unknown_member_id
        assert raw_groups.join(connection, group, pending.member_id).error_code == KafkaError.unknown_member_id
        rejoined = raw_groups.join(connection, group)
        rejoined = raw_groups.join(connection, group, rejoined.member_id)
        assert (rejoined.error_code, rejoined.generation_id) == (KafkaError.none, 1)


@pytest.mark.parametrize("first", ["commit", "delete"])
def test_a_deletion_and_a_commit_in_flight_never_leave_offsets_without_their_group(server, first):
    """Both wait for the group's `__consumer_offsets` partition, which the test holds, the second
    one started while the first waits. A commit first: the deletion waits for it and removes its
    offset too. A deletion first: the commit waits for it and starts a fresh group. Without the
    commit's hold on the group row, the two interleave and a commit's offset can outlive its
    deleted group (an offset of a group that does not exist)."""
    group = f"raced-{first}-first"
    commit(server.client, group, {0: 1})
    results: dict[str, object] = {}

    def commit_in_flight() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as own:
            commit(own, group, {1: 3})
        results["commit"] = True

    def delete_in_flight() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as own:
            results["delete"] = own.delete(f"/v1/groups/{group}").status_code

    threads = {"commit": commit_in_flight, "delete": delete_in_flight}
    second = "delete" if first == "commit" else "commit"
    held = _HeldPartition(server.database_url, OFFSETS_TOPIC, offsets_partition(server, group))
    started = []
    try:
        for index, name in enumerate((first, second), start=1):
            started.append(threading.Thread(target=threads[name]))
            started[-1].start()
            _wait_for(
                lambda waiting=index: len(results) >= waiting or _waiting_for_a_lock(server.database_url) >= waiting,
                what=f"the {name} to wait",
            )
    finally:
        held.let_go()
        for thread in started:
            thread.join(60)
    assert results == {"commit": True, "delete": 204}
    described = server.client.get(f"/v1/groups/{group}")
    if first == "commit":
        assert described.status_code == 404
        assert committed(server, group) == {}
    else:
        assert described.status_code == 200
        assert (described.json()["generation_id"], committed(server, group)) == (0, {1: 3})


def test_the_sdk_deletes_a_group(server):
    group = "sdk-deleted"
    commit(server.client, group, {0: 2})
    member = join_over_http(server, group)
    with Admin(server.url) as admin:
        with pytest.raises(NonEmptyGroupError):
            admin.delete_group(group)
        server.client.post(f"/v1/groups/{group}/leave", json={"member_id": member["member_id"]}).raise_for_status()
        admin.delete_group(group)
        with pytest.raises(GroupIdNotFoundError):
            admin.delete_group(group)
        assert group not in [g["group_id"] for g in admin.list_groups()]


# ---- Kafka


def delete_groups(connection: RawConnection, version: int, groups: list[str]) -> dict[str, KafkaError]:
    response = connection.call(request_of(api_table.DELETE_GROUPS, version, groups_names=tuple(groups)))
    return {result.group_id: result.error_code for result in response.results}


@pytest.mark.parametrize("version", list(api_table.SUPPORTED_VERSIONS[api_table.DELETE_GROUPS]))
def test_delete_groups_answers_each_group_on_its_own(server, version):
    """One group's error fails that group only; the deletable ones go."""
    empty, busy, unknown = (f"raw-{kind}-v{version}" for kind in ("empty", "busy", "unknown"))
    commit(server.client, empty, {0: 1})
    commit(server.client, busy, {0: 2})
    join_over_http(server, busy)
    with RawConnection(bootstrap(server)) as connection:
        results = delete_groups(connection, version, [unknown, busy, empty, empty])
    assert results == {
        unknown: KafkaError.group_id_not_found,
        busy: KafkaError.non_empty_group,
        empty: KafkaError.none,
    }
    assert committed(server, empty) == {}
    assert committed(server, busy) == {0: 2}


def test_confluent_admin_client_deletes_a_group_committed_over_http(server):
    deleted, busy = "confluent-deleted", "confluent-busy"
    commit(server.client, deleted, {0: 4, 1: 6})
    commit(server.client, busy, {1: 8})
    join_over_http(server, busy)
    admin = AdminClient({"bootstrap.servers": bootstrap(server)})
    futures = admin.delete_consumer_groups([deleted, busy], request_timeout=WAIT_S)
    futures[deleted].result(WAIT_S)
    with pytest.raises(KafkaException) as refused:
        futures[busy].result(WAIT_S)
    assert refused.value.args[0].name() == "NON_EMPTY_GROUP"
    assert server.client.get(f"/v1/groups/{deleted}").status_code == 404
    assert committed(server, busy) == {1: 8}
    with pytest.raises(KafkaException) as unknown:
        admin.delete_consumer_groups([deleted], request_timeout=WAIT_S)[deleted].result(WAIT_S)
    assert unknown.value.args[0].name() == "GROUP_ID_NOT_FOUND"


def test_kafka_python_admin_client_deletes_a_group_committed_over_http(server):
    from kafka.admin import KafkaAdminClient

    deleted, unknown = "kafka-python-deleted", "kafka-python-unknown"
    commit(server.client, deleted, {0: 3})
    admin = KafkaAdminClient(bootstrap_servers=bootstrap(server))
    try:
        assert admin.delete_groups([deleted, unknown]) == {deleted: "OK", unknown: "GroupIdNotFoundError"}
    finally:
        admin.close()
    assert server.client.get(f"/v1/groups/{deleted}").status_code == 404
    # A commit afterwards starts a fresh group: generation 0, this offset only.
    commit(server.client, deleted, {1: 1})
    described = server.client.get(f"/v1/groups/{deleted}").json()
    assert (described["generation_id"], [(o["partition"], o["offset"]) for o in described["offsets"]]) == (0, [(1, 1)])


# ---- OffsetDelete


def delete_offsets(server, group: str, partitions: list[tuple[str, int]]):
    return server.client.post(
        f"/v1/groups/{group}/offsets/delete",
        json={"partitions": [{"topic": t, "partition": p} for t, p in partitions]},
    )


def test_some_offsets_are_deleted_but_not_those_of_a_subscribed_topic(server):
    group = "offsets-deleted"
    commit(server.client, group, {0: 2, 1: 4})
    commit(server.client, group, {0: 6}, topic=OTHER_TOPIC)
    member = join_over_http(server, group, topic=OTHER_TOPIC)
    response = delete_offsets(server, group, [(TOPIC, 0), (OTHER_TOPIC, 0), ("no-such-topic", 0), (TOPIC, 7)])
    assert response.status_code == 200, response.text
    assert [e["error"] and e["error"]["code"] for e in response.json()["offsets"]] == [
        None,
        "GROUP_SUBSCRIBED_TO_TOPIC",
        "UNKNOWN_TOPIC_OR_PARTITION",
        "UNKNOWN_TOPIC_OR_PARTITION",
    ]
    assert (committed(server, group), committed(server, group, OTHER_TOPIC)) == ({1: 4}, {0: 6})
    records = offsets_records(server, group)
    assert records[0] is None and orjson.loads(records[1])["offset"] == 4  # a tombstone for the deleted one only
    # Once the member left, the rest goes; a group left without members and offsets goes too.
    assert server.client.post(f"/v1/groups/{group}/leave", json={"member_id": member["member_id"]}).status_code == 200
    assert delete_offsets(server, group, [(TOPIC, 1), (OTHER_TOPIC, 0)]).status_code == 200
    assert server.client.get(f"/v1/groups/{group}").status_code == 404
    missing = delete_offsets(server, group, [(TOPIC, 1)])
    assert (missing.status_code, error_code(missing)) == (404, "GROUP_ID_NOT_FOUND")


def test_offset_delete_takes_a_pending_transactional_offset_and_keeps_the_group_with_offsets_left(server):
    group = "offsets-deleted-pending"
    commit(server.client, group, {0: 1})
    init = server.client.post("/v1/producers/init", json={"transactional_id": "offsets-deleted-txn"}).json()
    producer = {"transactional_id": "offsets-deleted-txn", **{k: init[k] for k in ("producer_id", "producer_epoch")}}
    response = server.client.post(
        "/v1/txn/offset-commit",
        json={**producer, "group_id": group, "offsets": [{"topic": TOPIC, "partition": 1, "offset": 9}]},
    )
    assert response.status_code == 200, response.text
    assert [e["error"] for e in delete_offsets(server, group, [(TOPIC, 1)]).json()["offsets"]] == [None]
    assert server.client.post("/v1/txn/end", json={**producer, "committed": True}).status_code == 200
    assert committed(server, group) == {0: 1}
    assert server.client.get(f"/v1/groups/{group}").status_code == 200


def offset_delete(connection: RawConnection, group: str, partitions: list[tuple[str, int]]):
    topics = {}
    for topic, partition in partitions:
        topics.setdefault(topic, []).append(
            nested(api_table.OFFSET_DELETE, 0, "OffsetDeleteRequestPartition", partition_index=partition)
        )
    request = request_of(
        api_table.OFFSET_DELETE,
        0,
        group_id=group,
        topics=tuple(
            nested(api_table.OFFSET_DELETE, 0, "OffsetDeleteRequestTopic", name=name, partitions=tuple(parts))
            for name, parts in topics.items()
        ),
    )
    return connection.call(request)


def test_raw_offset_delete_answers_group_and_partition_errors(server):
    subscribed = "raw-offsets-subscribed"
    commit(server.client, subscribed, {0: 3, 1: 5})
    join_over_http(server, subscribed)
    with RawConnection(bootstrap(server)) as connection:
        unknown = offset_delete(connection, "raw-offsets-unknown", [(TOPIC, 0)])
        assert (unknown.error_code, unknown.topics) == (KafkaError.group_id_not_found, ())
        answered = offset_delete(connection, subscribed, [(TOPIC, 0), (OTHER_TOPIC, 0)])
        assert answered.error_code == KafkaError.none
        assert {(t.name, p.partition_index): p.error_code for t in answered.topics for p in t.partitions} == {
            (TOPIC, 0): KafkaError.group_subscribed_to_topic,
            (OTHER_TOPIC, 0): KafkaError.none,  # no offset there: nothing to delete, no error (as Kafka)
        }
        # A Kafka group of another protocol than the consumer one: its subscriptions are unknown.
        connect = "raw-offsets-connect"
        commit(server.client, connect, {0: 1})
        member_id = ""
        for _ in range(2):  # MEMBER_ID_REQUIRED first (KIP-394)
            joined = connection.call(_join_request(connect, member_id, "connect"))
            member_id = joined.member_id
        assert joined.error_code == KafkaError.none
        refused = offset_delete(connection, connect, [(TOPIC, 0)])
        assert (refused.error_code, refused.topics) == (KafkaError.non_empty_group, ())
    assert committed(server, subscribed) == {0: 3, 1: 5}
    assert committed(server, connect) == {0: 1}


def test_raw_offset_delete_of_no_partition_still_answers_the_groups_error(server):
    """As Kafka's broker, which asks its coordinator whatever partitions are left: a group that does
    not exist is GROUP_ID_NOT_FOUND with no partition named too; one that exists, no error."""
    kept = "raw-offsets-none-named"
    commit(server.client, kept, {0: 3})
    with RawConnection(bootstrap(server)) as connection:
        unknown = offset_delete(connection, "raw-offsets-none-named-unknown", [])
        assert (unknown.error_code, unknown.topics) == (KafkaError.group_id_not_found, ())
        answered = offset_delete(connection, kept, [])
        assert (answered.error_code, answered.topics) == (KafkaError.none, ())
    assert committed(server, kept) == {0: 3}


def _join_request(group: str, member_id: str, protocol_type: str):
    protocol = nested(api_table.JOIN_GROUP, 9, "JoinGroupRequestProtocol", name="any", metadata=b"")
    return request_of(
        api_table.JOIN_GROUP,
        9,
        group_id=group,
        session_timeout=raw_groups.LONG,
        rebalance_timeout=raw_groups.SHORT,
        member_id=member_id,
        group_instance_id=None,
        protocol_type=protocol_type,
        protocols=(protocol,),
        reason=None,
    )


def test_kafka_python_deletes_offsets_committed_over_http_and_the_sdk_too(server):
    from kafka import TopicPartition as KafkaTopicPartition
    from kafka.admin import KafkaAdminClient
    from kafka.errors import NoError

    group = "kafka-python-offsets"
    commit(server.client, group, {0: 1, 1: 2})
    commit(server.client, group, {0: 3}, topic=OTHER_TOPIC)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap(server))
    try:
        deleted = admin.delete_group_offsets(group, [KafkaTopicPartition(TOPIC, 0)])
    finally:
        admin.close()
    assert deleted == {KafkaTopicPartition(TOPIC, 0): NoError}
    assert committed(server, group) == {1: 2}
    join_over_http(server, group, topic=OTHER_TOPIC)
    with Admin(server.url) as sdk:
        sdk.delete_group_offsets(group, [TopicPartition(TOPIC, 1)])
        with pytest.raises(GroupSubscribedToTopicError):
            sdk.delete_group_offsets(group, [TopicPartition(OTHER_TOPIC, 0)])
    assert (committed(server, group), committed(server, group, OTHER_TOPIC)) == ({}, {0: 3})
