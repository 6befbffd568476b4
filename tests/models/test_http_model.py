"""A stateful property test over the HTTP API (issue 11): hypothesis interleaves idempotent and
transactional produce, the retry of every such request with the same body, InitProducerId (new
instance and KIP-360 bump, retried), EndTxn (retried), offset commits of both kinds (retried),
producer-state expiry runs with a tiny expiration time, and topic deletion; after every step the
server must agree with a model:

- no duplicate and no loss: read_committed shows exactly the committed records, in order;
- a retry answers the original outcome (a produce: the same offsets, flagged duplicate), or a clean
  error that appended nothing (UNKNOWN_PRODUCER_ID once the producer expired);
- committed offsets follow commit order: the commit appended last to __consumer_offsets wins.

Bounded to a few tens of seconds (max_examples × stateful_step_count below).
"""

from __future__ import annotations

import itertools
import time

import httpx
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.api.test_review_fixes import run_producer_expiry

PARTITIONS = 2
_names = itertools.count()


class HttpModel(RuleBasedStateMachine):
    client: httpx.Client
    running = None  # the module's server (its settings and database, for expiry runs)

    @initialize()
    def start(self):
        n = next(_names)
        self.topic, self.group, self.transactional_id = f"model-{n}", f"model-group-{n}", f"model-app-{n}"
        self._create_topic()
        self.values = itertools.count()
        self.offsets = itertools.count(1)
        # Idempotent producer.
        self.idem: dict = {}
        self.idem_sequences = [0] * PARTITIONS
        self.idem_last: tuple[dict, dict] | None = None  # (request body, answer) of its last batch
        self.idem_expired = False
        self._init_idempotent()
        # Transactional producer.
        self.ids: dict = {}
        self.txn_sequences = [0] * PARTITIONS
        self.txn_last: tuple[dict, dict] | None = None
        self.open = False
        # Each partition's log as [value, kind] in append order, kind "plain" (idempotent),
        # "open", "committed" or "aborted" (transactional); the group's committed offset of
        # (topic, 0) with the order of the commit record that set it, and the open transaction's
        # pending offset likewise.
        self.log: list[list[list]] = [[] for _ in range(PARTITIONS)]
        self._init_transactional({})
        self.commit_order = itertools.count()
        self.offset: tuple[int, int] | None = None
        self.pending_offset: tuple[int, int] | None = None

    # ---- helpers

    def _create_topic(self):
        response = self.client.post("/v1/topics", json={"name": self.topic, "partitions": PARTITIONS})
        assert response.status_code == 201, response.text

    def _init_idempotent(self):
        response = self.client.post("/v1/producers/init", json={})
        assert response.status_code == 200, response.text
        self.idem = response.json()
        self.idem_sequences = [0] * PARTITIONS
        self.idem_last, self.idem_expired = None, False

    def _init_transactional(self, given: dict):
        body = {"transactional_id": self.transactional_id, "transaction_timeout_ms": 600_000, **given}
        first = self.client.post("/v1/producers/init", json=body)
        assert first.status_code == 200, first.text
        retry = self.client.post("/v1/producers/init", json=body)  # as if the first answer was lost
        if given:  # a KIP-360 bump: its retry answers the same ids
            assert retry.status_code == 200 and retry.json() == first.json(), retry.text
            answer = first.json()
        else:  # a new instance announces itself: its retry is another new instance (by nature)
            assert retry.status_code == 200, retry.text
            answer = retry.json()
        self.ids = {
            "transactional_id": self.transactional_id,
            "producer_id": answer["producer_id"],
            "producer_epoch": answer["producer_epoch"],
        }
        self._end_transaction("aborted")  # a new instance or a bump aborts what was open

    def _end_transaction(self, kind: str):
        """The open transaction ended: its records are now `kind` ("committed" or "aborted"), and
        the next transaction starts every partition at sequence 0 (a new epoch)."""
        for entries in self.log:
            for entry in entries:
                if entry[1] == "open":
                    entry[1] = kind
        self.open, self.pending_offset = False, None
        self.txn_sequences = [0] * PARTITIONS
        self.txn_last = None

    def _produce(self, body: dict) -> httpx.Response:
        return self.client.post("/v1/produce", json=body)

    def _commit_offset_record(self) -> int:
        return next(self.commit_order)

    # ---- idempotent producer

    @rule(
        partition=st.integers(0, PARTITIONS - 1), count=st.integers(1, 3), timestamp_ms=st.sampled_from([None, 1_000])
    )
    def idempotent_send(self, partition, count, timestamp_ms):
        """`timestamp_ms` 1000: a backfill, its records stamped long before the server's clock."""
        values = [f"i{next(self.values)}" for _ in range(count)]
        records = [{"value": v} if timestamp_ms is None else {"value": v, "timestamp_ms": timestamp_ms} for v in values]
        body = {
            **self.idem,
            "partitions": [
                {
                    "topic": self.topic,
                    "partition": partition,
                    "base_sequence": self.idem_sequences[partition],
                    "records": records,
                }
            ],
        }
        response = self._produce(body)
        if self.idem_expired:
            assert response.status_code == 409 and response.json()["error"]["code"] == "UNKNOWN_PRODUCER_ID", (
                response.text
            )
            self._init_idempotent()  # what the SDK does: a new producer id, then resend
            body = {**self.idem, "partitions": [{**body["partitions"][0], "base_sequence": 0}]}
            response = self._produce(body)
        assert response.status_code == 200, response.text
        entry = response.json()["partitions"][0]
        assert entry["error"] is None and entry["duplicate"] is False, entry
        self.idem_sequences[partition] = body["partitions"][0]["base_sequence"] + count
        self.idem_last = (body, entry)
        self.log[partition] += [[v, "plain"] for v in values]

    @precondition(lambda self: self.idem_last is not None)
    @rule()
    def idempotent_retry(self):
        body, original = self.idem_last
        response = self._produce(body)
        if self.idem_expired:
            assert response.status_code == 409 and response.json()["error"]["code"] == "UNKNOWN_PRODUCER_ID", (
                response.text
            )
            return
        assert response.status_code == 200, response.text
        entry = response.json()["partitions"][0]
        assert entry["duplicate"] is True, entry
        assert (entry["base_offset"], entry["last_offset"]) == (original["base_offset"], original["last_offset"])

    @rule()
    def idempotent_bump_retried(self):
        if self.idem_expired:
            return
        first = self.client.post("/v1/producers/init", json=self.idem)
        retry = self.client.post("/v1/producers/init", json=self.idem)
        assert first.status_code == retry.status_code == 200 and first.json() == retry.json(), retry.text
        self.idem = first.json()
        self.idem_sequences = [0] * PARTITIONS
        self.idem_last = None

    # ---- transactional producer

    @rule(partition=st.integers(0, PARTITIONS - 1), count=st.integers(1, 3))
    def transactional_send(self, partition, count):
        values = [f"t{next(self.values)}" for _ in range(count)]
        body = {
            **self.ids,
            "partitions": [
                {
                    "topic": self.topic,
                    "partition": partition,
                    "base_sequence": self.txn_sequences[partition],
                    "records": [{"value": v} for v in values],
                }
            ],
        }
        response = self._produce(body)
        assert response.status_code == 200, response.text
        entry = response.json()["partitions"][0]
        assert entry["error"] is None and entry["duplicate"] is False, entry
        self.txn_sequences[partition] += count
        self.txn_last = (body, entry)
        self.log[partition] += [[v, "open"] for v in values]
        self.open = True

    @precondition(lambda self: self.txn_last is not None)
    @rule()
    def transactional_retry(self):
        body, original = self.txn_last
        response = self._produce(body)
        assert response.status_code == 200, response.text
        entry = response.json()["partitions"][0]
        assert entry["duplicate"] is True and entry["base_offset"] == original["base_offset"], entry

    @rule()
    def transactional_offset_commit_retried(self):
        offset = next(self.offsets)
        body = {
            **self.ids,
            "group_id": self.group,
            "offsets": [{"topic": self.topic, "partition": 0, "offset": offset}],
        }
        for _ in range(2):  # the second as if the first answer was lost
            response = self.client.post("/v1/txn/offset-commit", json=body)
            assert response.status_code == 200 and response.json()["offsets"][0]["error"] is None, response.text
            self.pending_offset = (offset, self._commit_offset_record())
        self.open = True

    @rule()
    def plain_offset_commit_retried(self):
        offset = next(self.offsets)
        body = {"offsets": [{"topic": self.topic, "partition": 0, "offset": offset}]}
        for _ in range(2):
            response = self.client.post(f"/v1/groups/{self.group}/offsets/commit", json=body)
            assert response.status_code == 200 and response.json()["offsets"][0]["error"] is None, response.text
            self.offset = (offset, self._commit_offset_record())

    @rule(commit=st.booleans())
    def end_retried(self, commit):
        body = {**self.ids, "committed": commit}
        first = self.client.post("/v1/txn/end", json=body)
        retry = self.client.post("/v1/txn/end", json=body)
        if not self.open:
            assert first.status_code == 409 and first.json()["error"]["code"] == "INVALID_TXN_STATE", first.text
            return
        assert first.status_code == 200, first.text
        assert retry.status_code == 200 and retry.json() == first.json(), retry.text
        if commit:
            if self.pending_offset is not None and (self.offset is None or self.pending_offset[1] > self.offset[1]):
                self.offset = self.pending_offset
        self.ids.update(producer_id=first.json()["producer_id"], producer_epoch=first.json()["producer_epoch"])
        self._end_transaction("committed" if commit else "aborted")

    @rule()
    def new_instance(self):
        self._init_transactional({})  # aborts whatever was open

    @rule()
    def bump_retried(self):
        self._init_transactional({"producer_id": self.ids["producer_id"], "producer_epoch": self.ids["producer_epoch"]})

    # ---- the server's housekeeping and administration

    @rule()
    def expire_idle_producers(self):
        time.sleep(0.005)  # everything is idle past the 1 ms expiration...
        run_producer_expiry(self.running_with_tiny_expiration)
        # ...so the idempotent producer is forgotten (its state and id); the transactional one keeps
        # the state of its open transaction, and starts every transaction at sequence 0 anyway.
        self.idem_expired = True  # and a retry of its last batch must now be refused, never appended again

    @rule()
    def expire_with_the_default_expiration(self):
        """Nothing has been idle for a day: an expiry run changes nothing (whatever the records'
        timestamps say)."""
        run_producer_expiry(self.running)

    @rule()
    def delete_and_recreate_the_topic(self):
        assert self.client.delete(f"/v1/topics/{self.topic}").status_code == 204
        self._create_topic()
        self.log = [[] for _ in range(PARTITIONS)]  # an open transaction's records went with it too
        self.txn_sequences = [0] * PARTITIONS
        self.txn_last = None
        # Its offsets went with it, pending transactional ones too (Kafka's DeleteTopics).
        self.offset = self.pending_offset = None
        # The partitions are new: an idempotent producer starts them afresh (a new id, sequence 0).
        if not self.idem_expired:
            self._init_idempotent()
        self.idem_last = None

    # ---- the model

    @invariant()
    def read_committed_shows_exactly_the_committed_records(self):
        if not hasattr(self, "topic"):
            return
        response = self.client.post(
            "/v1/fetch",
            json={
                "max_records": 10_000,
                "partitions": [{"topic": self.topic, "partition": p, "offset": 0} for p in range(PARTITIONS)],
            },
        )
        assert response.status_code == 200, response.text
        seen = [[r["value"] for r in entry["records"]] for entry in response.json()["partitions"]]
        expected = []
        for entries in self.log:  # up to the first open record (the LSO), none of an aborted transaction
            stable = list(itertools.takewhile(lambda entry: entry[1] != "open", entries))
            expected.append([value for value, kind in stable if kind != "aborted"])
        assert seen == expected

    @invariant()
    def the_commit_appended_last_wins(self):
        if not hasattr(self, "topic"):
            return
        response = self.client.post(
            f"/v1/groups/{self.group}/offsets/fetch", json={"partitions": [{"topic": self.topic, "partition": 0}]}
        )
        assert response.status_code == 200, response.text
        assert response.json()["offsets"][0]["offset"] == (-1 if self.offset is None else self.offset[0])


def test_the_http_api_agrees_with_the_model(module_server):
    HttpModel.client = module_server.client
    HttpModel.running = module_server
    tiny = module_server.settings.model_copy(update={"producer_id_expiration_ms": 1})
    HttpModel.running_with_tiny_expiration = type(
        "Running", (), {"database_url": module_server.database_url, "settings": tiny}
    )()
    HttpModel.TestCase.settings = settings(
        max_examples=30, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
    )
    HttpModel.TestCase().runTest()
