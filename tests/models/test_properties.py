"""Hypothesis-driven tests of the produce/sequence rules and of the transaction lifecycle against
simple models, over real HTTP on a real server: random interleavings of valid and invalid requests,
after each of which the server must agree with the model."""

from __future__ import annotations

import itertools

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

_names = itertools.count()


@pytest.fixture(scope="module")
def property_server(module_server):
    return module_server


def _read(client: httpx.Client, topic: str, isolation: str) -> list[str]:
    entry = client.post(
        "/v1/fetch",
        json={
            "isolation_level": isolation,
            "max_records": 10_000,
            "partitions": [{"topic": topic, "partition": 0, "offset": 0}],
        },
    ).json()["partitions"][0]
    return [record["value"] for record in entry["records"]]


class IdempotentProducerModel(RuleBasedStateMachine):
    """Model: the log is exactly the batches appended in sequence order; the last five batches of the
    current epoch are duplicates when resent; anything else out of order is refused."""

    client: httpx.Client

    @initialize()
    def start(self):
        self.topic = f"idem-{next(_names)}"
        self.client.post("/v1/topics", json={"name": self.topic, "partitions": 1}).raise_for_status()
        ids = self.client.post("/v1/producers/init", json={}).json()
        self.producer_id, self.epoch = ids["producer_id"], ids["producer_epoch"]
        self.next_sequence = 0
        self.recent: list[tuple[int, int, dict]] = []  # (base sequence, count, answer)
        self.log: list[str] = []

    def _send(self, epoch: int, sequence: int, values: list[str]) -> dict:
        response = self.client.post(
            "/v1/produce",
            json={
                "producer_id": self.producer_id,
                "producer_epoch": epoch,
                "partitions": [
                    {
                        "topic": self.topic,
                        "partition": 0,
                        "base_sequence": sequence,
                        "records": [{"value": v} for v in values],
                    }
                ],
            },
        )
        assert response.status_code == 200, response.text
        return response.json()["partitions"][0]

    @rule(count=st.integers(1, 4))
    def send_next(self, count):
        values = [f"e{self.epoch}s{self.next_sequence + i}" for i in range(count)]
        entry = self._send(self.epoch, self.next_sequence, values)
        assert entry["error"] is None and entry["duplicate"] is False
        assert entry["base_offset"] == len(self.log)
        self.recent = (self.recent + [(self.next_sequence, count, entry)])[-5:]
        self.next_sequence += count
        self.log += values

    @precondition(lambda self: self.recent)
    @rule(data=st.data())
    def resend_a_recent_batch(self, data):
        sequence, count, original = data.draw(st.sampled_from(self.recent))
        entry = self._send(self.epoch, sequence, ["ignored"] * count)
        assert entry["duplicate"] is True
        assert (entry["base_offset"], entry["last_offset"]) == (original["base_offset"], original["last_offset"])

    @rule(gap=st.integers(1, 3))
    def send_with_a_gap(self, gap):
        entry = self._send(self.epoch, self.next_sequence + gap, ["gap"])
        assert entry["error"]["code"] == "OUT_OF_ORDER_SEQUENCE_NUMBER"

    @rule()
    def bump_epoch(self):
        ids = self.client.post(
            "/v1/producers/init", json={"producer_id": self.producer_id, "producer_epoch": self.epoch}
        ).json()
        assert ids == {"producer_id": self.producer_id, "producer_epoch": self.epoch + 1}
        self.epoch += 1
        self.next_sequence = 0
        self.recent = []

    @precondition(lambda self: self.epoch > 0 and self.log)
    @rule()
    def send_with_a_stale_epoch(self):
        entry = self._send(self.epoch - 1, 0, ["stale"])
        assert entry["error"]["code"] == "INVALID_PRODUCER_EPOCH", "a bumped-away epoch is fenced on every partition"

    @invariant()
    def log_matches_the_model(self):
        if hasattr(self, "topic"):
            assert _read(self.client, self.topic, "read_uncommitted") == self.log


class TransactionModel(RuleBasedStateMachine):
    """Model: read_committed shows exactly the records of committed transactions, in order; a
    producer fenced by a re-init or an admin abort can never write or commit again."""

    client: httpx.Client

    @initialize()
    def start(self):
        self.topic = f"txn-{next(_names)}"
        self.transactional_id = f"model-{next(_names)}"
        self.client.post("/v1/topics", json={"name": self.topic, "partitions": 1}).raise_for_status()
        self.committed: list[str] = []
        self.open: list[str] = []
        self.prepared = False
        self.stale: list[dict] = []
        self.counter = itertools.count()
        self._init()

    def _init(self):
        if self.__dict__.get("ids"):
            self.stale.append(self.ids)
        body = self.client.post(
            "/v1/producers/init", json={"transactional_id": self.transactional_id, "transaction_timeout_ms": 600_000}
        ).json()
        self.ids = {
            "transactional_id": self.transactional_id,
            "producer_id": body["producer_id"],
            "producer_epoch": body["producer_epoch"],
        }
        self.sequence = 0
        self.open, self.prepared = [], False  # a re-init aborts whatever was open

    def _produce(self, ids: dict, sequence: int, value: str) -> httpx.Response:
        return self.client.post(
            "/v1/produce",
            json={
                **ids,
                "partitions": [
                    {"topic": self.topic, "partition": 0, "base_sequence": sequence, "records": [{"value": value}]}
                ],
            },
        )

    @precondition(lambda self: not self.prepared)
    @rule()
    def produce(self):
        value = f"v{next(self.counter)}"
        response = self._produce(self.ids, self.sequence, value)
        assert response.status_code == 200 and response.json()["partitions"][0]["error"] is None, response.text
        self.sequence += 1
        self.open.append(value)

    @rule(commit=st.booleans())
    def end(self, commit):
        response = self.client.post("/v1/txn/end", json={**self.ids, "committed": commit})
        if not self.open:
            assert response.status_code == 409 and response.json()["error"]["code"] == "INVALID_TXN_STATE"
            return
        assert response.status_code == 200, response.text
        self.stale.append(dict(self.ids))
        self.ids.update(producer_id=response.json()["producer_id"], producer_epoch=response.json()["producer_epoch"])
        if commit:
            self.committed += self.open
        self.open, self.prepared, self.sequence = [], False, 0

    @precondition(lambda self: self.open and not self.prepared)
    @rule()
    def prepare(self):
        assert self.client.post("/v1/txn/prepare", json=self.ids).json()["state"] == "Prepared"
        self.prepared = True

    @rule()
    def reinit(self):
        self._init()

    @rule()
    def admin_abort(self):
        response = self.client.post(f"/v1/transactions/{self.transactional_id}/abort")
        if not self.open:
            assert response.status_code == 409
            return
        assert response.json()["state"] == "CompleteAbort"
        self.stale.append(dict(self.ids))
        self.ids.update(producer_id=response.json()["producer_id"], producer_epoch=response.json()["producer_epoch"])
        self.open, self.prepared, self.sequence = [], False, 0

    @precondition(lambda self: self.stale)
    @rule(data=st.data())
    def stale_producer_is_fenced(self, data):
        ids = data.draw(st.sampled_from(self.stale))
        if ids == self.ids:
            return
        response = self._produce(ids, 0, "zombie")
        assert response.status_code == 409, response.text
        assert response.json()["error"]["code"] in ("PRODUCER_FENCED", "INVALID_PRODUCER_ID_MAPPING")

    @invariant()
    def read_committed_shows_exactly_the_committed_records(self):
        if hasattr(self, "topic"):
            assert _read(self.client, self.topic, "read_committed") == self.committed


@pytest.mark.parametrize("model", [IdempotentProducerModel, TransactionModel])
def test_server_agrees_with_model(model, property_server):
    model.client = property_server.client
    model.TestCase.settings = settings(
        max_examples=10, stateful_step_count=12, deadline=None, suppress_health_check=list(HealthCheck)
    )
    model.TestCase().runTest()
