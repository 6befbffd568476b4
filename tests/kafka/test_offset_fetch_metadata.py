"""OffsetFetch answers a partition's metadata as Kafka's group coordinator does: never null. Kafka
stores a commit's null metadata as "" (OffsetAndMetadata.NO_METADATA) and answers "" for a
partition without an offset or with an error (OffsetFetchResponse.NO_METADATA); HTTP's offsets
keep their null ([api.md](../../docs/api.md#consumer-groups)).

Regression (found by KafkaJS's own `src/broker/__tests__/offsetFetch.spec.js`, which expects
`metadata: ''` for a partition never committed): txbroker answered null."""

from __future__ import annotations

from kio.schema.errors import ErrorCode as KafkaError

from tests.kafka.clients import bootstrap, create_topic
from tests.kafka.raw import RawConnection
from tests.kafka.raw_groups import commit_partitions, fetch_offsets

NO_GENERATION = -1


def fetched_partitions(connection, group: str, partitions: list[tuple[str, int]], version: int):
    """The answered partitions of an OffsetFetch as (topic, partition, offset, metadata, error code)."""
    response = fetch_offsets(connection, group, partitions, version)
    assert getattr(response, "error_code", KafkaError.none) == KafkaError.none, response  # v2+
    return [
        (topic.name, p.partition_index, p.committed_offset, p.metadata, p.error_code)
        for topic in response.topics
        for p in topic.partitions
    ]


def test_offset_fetch_answers_empty_metadata_never_null(module_kafka_server):
    server = module_kafka_server
    topic, group = "offset-fetch-metadata", "offset-fetch-metadata-group"
    create_topic(server, topic, 2)
    with RawConnection(bootstrap(server)) as connection:
        # KafkaJS sends v4; v1 is the oldest txbroker serves and v7 the newest of one group.
        for version in (1, 4, 7):
            assert fetched_partitions(connection, group, [(topic, 0)], version) == [
                (topic, 0, -1, "", KafkaError.none)
            ], f"a partition never committed, v{version}"
        # A simple consumer's commit of null metadata (generation -1, no member): read back as "".
        assert commit_partitions(connection, group, "", NO_GENERATION, None, [(topic, 1)], 5) == [KafkaError.none]
        for version in (1, 4, 7):
            assert fetched_partitions(connection, group, [(topic, 1), ("offset-fetch-no-such-topic", 0)], version) == [
                (topic, 1, 5, "", KafkaError.none),
                ("offset-fetch-no-such-topic", 0, -1, "", KafkaError.none),
            ], f"null committed metadata, v{version}"
    # HTTP's contract keeps null for metadata committed as null.
    response = server.client.post(
        f"/v1/groups/{group}/offsets/fetch", json={"partitions": [{"topic": topic, "partition": 1}]}
    )
    assert response.status_code == 200, response.text
    assert [(e["offset"], e["metadata"]) for e in response.json()["offsets"]] == [(5, None)]
