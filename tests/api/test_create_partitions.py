"""CreatePartitions over HTTP (`POST /v1/topics/{topic}/partitions`): an increase only, the new
partitions empty at offset 0 and usable at once by produce, fetch and consumer groups; bad input
is a 4xx with nothing written. Concurrency with produces and DeleteTopics: two real sessions."""

from __future__ import annotations

import asyncio
import itertools

import asyncpg
import httpx
import pytest

from tests.api.test_consumer_groups import assigned, heartbeat, settled
from tests.api.test_topics_api import assert_error, create, produce

_names = itertools.count()


def fresh() -> str:
    return f"grow-{next(_names)}"


@pytest.fixture
def client(module_client):
    return module_client


def grow(client, topic: str, partitions) -> object:
    return client.post(f"/v1/topics/{topic}/partitions", json={"partitions": partitions})


def test_growth_adds_empty_partitions_that_take_produce_and_fetch(client):
    name = fresh()
    create(client, name, 2)
    produce(client, name, 1, ["a", "b"])
    response = grow(client, name, 4)
    assert response.status_code == 200, response.text
    assert response.json()["partitions"] == [
        {"partition": 0, "log_start_offset": 0, "high_watermark": 0, "last_stable_offset": 0},
        {"partition": 1, "log_start_offset": 0, "high_watermark": 2, "last_stable_offset": 2},
        {"partition": 2, "log_start_offset": 0, "high_watermark": 0, "last_stable_offset": 0},
        {"partition": 3, "log_start_offset": 0, "high_watermark": 0, "last_stable_offset": 0},
    ]
    assert client.get(f"/v1/topics/{name}").json() == response.json()
    assert produce(client, name, 3, ["x", "y"])["base_offset"] == 0
    fetched = client.post(
        "/v1/fetch", json={"partitions": [{"topic": name, "partition": 3, "offset": 0}], "max_wait_ms": 0}
    ).json()
    assert [r["value"] for r in fetched["partitions"][0]["records"]] == ["x", "y"]


@pytest.mark.parametrize(("partitions", "said"), [(2, "already has 2"), (1, "would not be an increase")])
def test_same_or_fewer_partitions_is_invalid_partitions_and_changes_nothing(client, partitions, said):
    name = fresh()
    create(client, name, 2)
    error = assert_error(grow(client, name, partitions), 400, "INVALID_PARTITIONS")
    assert said in error["message"]
    assert len(client.get(f"/v1/topics/{name}").json()["partitions"]) == 2


@pytest.mark.parametrize("partitions", [0, -1, 10_001, 2**70])
def test_out_of_range_counts_are_refused(client, partitions):
    name = fresh()
    create(client, name, 1)
    assert grow(client, name, partitions).status_code == 400
    assert len(client.get(f"/v1/topics/{name}").json()["partitions"]) == 1


@pytest.mark.parametrize("body", [{}, {"partitions": "3"}, {"partitions": 2.5}, {"partitions": None}, []])
def test_a_malformed_body_is_invalid_request(client, body):
    name = fresh()
    create(client, name, 1)
    assert_error(client.post(f"/v1/topics/{name}/partitions", json=body), 400, "INVALID_REQUEST")
    assert len(client.get(f"/v1/topics/{name}").json()["partitions"]) == 1


def test_unknown_topic_is_404(client):
    assert_error(grow(client, "grow-never-created", 3), 404, "UNKNOWN_TOPIC_OR_PARTITION")


@pytest.mark.parametrize("name", ["__consumer_offsets", "__transaction_state"])
def test_internal_topics_keep_their_partition_count(client, name):
    before = len(client.get(f"/v1/topics/{name}").json()["partitions"])
    assert_error(grow(client, name, before + 1), 400, "INVALID_TOPIC_EXCEPTION")
    assert len(client.get(f"/v1/topics/{name}").json()["partitions"]) == before


def test_a_consumer_group_is_assigned_the_new_partitions_at_its_next_heartbeat(client):
    """The range assignment follows the grown count, with no member joining or leaving."""
    name, group = fresh(), fresh()
    create(client, name, 2)
    members = [heartbeat(client, group, topics=[name])["member_id"] for _member in ("first", "second")]
    # Settled: a partition moved from one member to another reaches it once the first acknowledged
    # the generation that revoked it (the revocation barrier).
    first, second = settled(client, group, members, topics=[name])
    assert sorted(assigned(first)[name] + assigned(second)[name]) == [0, 1]
    assert grow(client, name, 5).status_code == 200
    after = settled(client, group, members, topics=[name])
    assert after[0]["generation_id"] > first["generation_id"]
    assert sorted(assigned(after[0])[name] + assigned(after[1])[name]) == [0, 1, 2, 3, 4]


def _grow_in_thread(server, topic: str, partitions: int):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        return grow(client, topic, partitions)


def test_growth_does_not_wait_for_an_open_produce_and_serializes_with_delete(module_server, client):
    """Two real sessions: a transaction holding a topic as a produce or offset commit does (FOR KEY
    SHARE) and its partition row, then a growth of that topic commits meanwhile; a growth waiting on
    a DeleteTopics in flight answers UNKNOWN_TOPIC_OR_PARTITION once the delete commits."""
    name = fresh()
    create(client, name, 1)

    async def run():
        holder = await asyncpg.connect(module_server.database_url)
        grower = await asyncpg.connect(module_server.database_url)
        try:
            holding = holder.transaction()
            await holding.start()
            await holder.fetch("SELECT 1 FROM topics WHERE name = $1 FOR KEY SHARE", name)
            await holder.execute(
                "UPDATE partitions SET high_watermark = high_watermark FROM topics t "
                "WHERE t.name = $1 AND partitions.topic_id = t.topic_id AND partition = 0",
                name,
            )
            grown = await asyncio.to_thread(_grow_in_thread, module_server, name, 3)
            assert grown.status_code == 200, grown.text
            await holding.rollback()

            deleting = holder.transaction()
            await deleting.start()
            await holder.execute("SELECT 1 FROM topics WHERE name = $1 FOR UPDATE", name)  # as DeleteTopics
            await holder.execute("DELETE FROM topics WHERE name = $1", name)
            growing = asyncio.create_task(asyncio.to_thread(_grow_in_thread, module_server, name, 4))
            while not await grower.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%FOR NO KEY UPDATE%'"
            ):
                await asyncio.sleep(0.01)
            await deleting.commit()
            refused = await growing
            assert refused.status_code == 404, refused.text
        finally:
            await holder.close()
            await grower.close()

    asyncio.run(run())
