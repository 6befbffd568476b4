"""The HTTP door's side of the Kafka tests: writes and reads over the contract (API.md)."""

from __future__ import annotations

import base64


def b64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode()


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def produce(server, topic: str, partition: int, records: list[dict], encoding: str = "utf8", **producer) -> dict:
    body = {"encoding": encoding, "partitions": [{"topic": topic, "partition": partition, "records": records}]}
    if producer:
        body.update(producer)
        body["partitions"][0]["base_sequence"] = producer.pop("base_sequence", 0)
    response = server.client.post("/v1/produce", json=body)
    assert response.status_code == 200, response.text
    [entry] = response.json()["partitions"]
    assert entry["error"] is None, entry
    return entry


def fetch(server, topic: str, partition: int, isolation_level: str = "read_uncommitted") -> list[dict]:
    """Every record of the partition, in base64."""
    response = server.client.post(
        "/v1/fetch",
        json={
            "isolation_level": isolation_level,
            "max_records": 10_000,
            "encoding": "base64",
            "partitions": [{"topic": topic, "partition": partition, "offset": 0}],
        },
    )
    assert response.status_code == 200, response.text
    [entry] = response.json()["partitions"]
    assert entry["error"] is None, entry
    return entry["records"]


class HttpTransaction:
    """One transaction of a transactional id over HTTP, writing to one partition."""

    def __init__(self, server, transactional_id: str) -> None:
        self.server = server
        response = server.client.post(
            "/v1/producers/init", json={"transactional_id": transactional_id, "transaction_timeout_ms": 60_000}
        )
        assert response.status_code == 200, response.text
        self.ids = {"transactional_id": transactional_id, **response.json()}
        self.sequence = 0

    def produce(self, topic: str, partition: int, values: list[str]) -> dict:
        entry = produce(
            self.server,
            topic,
            partition,
            [{"key": None, "value": value} for value in values],
            base_sequence=self.sequence,
            **self.ids,
        )
        self.sequence += len(values)
        return entry

    def end(self, committed: bool) -> None:
        response = self.server.client.post("/v1/txn/end", json={**self.ids, "committed": committed})
        assert response.status_code == 200, response.text
