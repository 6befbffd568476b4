"""Transaction scenarios over real HTTP, in the spirit of Kafka's TransactionsTest: visibility under
both isolation levels, the LSO, fencing, the epoch bump per transaction, EndTxn retries, timeouts,
admin abort, two-phase commit, idempotent producers, and every error code of these endpoints."""

from __future__ import annotations

import time

import httpx
import pytest


class TxnProducer:
    """A minimal transactional producer speaking the contract, tracking sequences per partition."""

    def __init__(self, client: httpx.Client, transactional_id: str, timeout_ms: int = 60_000) -> None:
        self.client = client
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.producer_id = -1
        self.producer_epoch = -1
        self.sequences: dict[tuple[str, int], int] = {}

    def init(self, **extra) -> dict:
        response = self.client.post(
            "/v1/producers/init",
            json={"transactional_id": self.transactional_id, "transaction_timeout_ms": self.timeout_ms, **extra},
        )
        assert response.status_code == 200, response.text
        body = response.json()
        self._adopt(body)
        return body

    def _adopt(self, body: dict) -> None:
        if (body["producer_id"], body["producer_epoch"]) != (self.producer_id, self.producer_epoch):
            self.sequences.clear()  # a new epoch starts every partition at sequence 0
        self.producer_id, self.producer_epoch = body["producer_id"], body["producer_epoch"]

    def ids(self) -> dict:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
        }

    def send(self, topic: str, partition: int, *values: str) -> httpx.Response:
        sequence = self.sequences.get((topic, partition), 0)
        response = self.client.post(
            "/v1/produce",
            json={
                **self.ids(),
                "partitions": [
                    {
                        "topic": topic,
                        "partition": partition,
                        "base_sequence": sequence,
                        "records": [{"value": value} for value in values],
                    }
                ],
            },
        )
        if response.status_code == 200 and response.json()["partitions"][0]["error"] is None:
            self.sequences[(topic, partition)] = sequence + len(values)
        return response

    def end(self, commit: bool) -> httpx.Response:
        response = self.client.post("/v1/txn/end", json={**self.ids(), "committed": commit})
        if response.status_code == 200:
            self._adopt(response.json())
        return response

    def commit(self) -> dict:
        response = self.end(True)
        assert response.status_code == 200, response.text
        return response.json()

    def abort(self) -> dict:
        response = self.end(False)
        assert response.status_code == 200, response.text
        return response.json()


def values(client: httpx.Client, topic: str, partition: int, isolation: str) -> list[str]:
    body = client.post(
        "/v1/fetch",
        json={
            "isolation_level": isolation,
            "max_records": 10_000,
            "partitions": [{"topic": topic, "partition": partition, "offset": 0}],
        },
    ).json()["partitions"][0]
    assert body["error"] is None, body
    return [record["value"] for record in body["records"]]


def watermarks(client: httpx.Client, topic: str, partition: int) -> tuple[int, int]:
    info = client.get(f"/v1/topics/{topic}").json()["partitions"][partition]
    return info["last_stable_offset"], info["high_watermark"]


def error_code(response: httpx.Response) -> str:
    body = response.json()
    if "error" in body:
        return body["error"]["code"]
    return body["partitions"][0]["error"]["code"]


@pytest.fixture
def client(server) -> httpx.Client:
    for name in ("in", "out"):
        server.client.post("/v1/topics", json={"name": name, "partitions": 2}).raise_for_status()
    return server.client


def test_committed_records_become_visible_to_read_committed_at_commit(client):
    producer = TxnProducer(client, "commit-visibility")
    producer.init()
    producer.send("out", 0, "a", "b")
    producer.send("out", 1, "c")
    assert values(client, "out", 0, "read_committed") == []
    assert values(client, "out", 0, "read_uncommitted") == ["a", "b"]
    assert watermarks(client, "out", 0) == (0, 2), "the open transaction pins the LSO at its first offset"
    result = producer.commit()
    assert result["state"] == "CompleteCommit"
    assert values(client, "out", 0, "read_committed") == ["a", "b"]
    assert values(client, "out", 1, "read_committed") == ["c"]
    assert watermarks(client, "out", 0) == (3, 3), "the COMMIT marker takes one offset; LSO reaches HW"
    markers = client.get("/v1/topics/out/partitions/0/markers").json()["markers"]
    assert [(m["offset"], m["type"], m["producer_epoch"]) for m in markers] == [(2, "COMMIT", 0)]


def test_aborted_records_are_never_visible_to_read_committed(client):
    producer = TxnProducer(client, "abort-visibility")
    producer.init()
    producer.send("out", 0, "doomed-1", "doomed-2")
    producer.abort()
    producer.send("out", 0, "kept")
    producer.commit()
    assert values(client, "out", 0, "read_committed") == ["kept"]
    assert values(client, "out", 0, "read_uncommitted") == ["doomed-1", "doomed-2", "kept"]
    entry = client.post(
        "/v1/fetch", json={"partitions": [{"topic": "out", "partition": 0, "offset": 0}], "max_records": 1}
    ).json()["partitions"][0]
    assert [r["value"] for r in entry["records"]] == ["kept"]
    assert entry["next_offset"] == 4, "next_offset continues past the aborted records and the marker"
    latest = client.post(
        "/v1/offsets/list",
        json={"isolation_level": "read_committed", "partitions": [{"topic": "out", "partition": 0, "timestamp": -1}]},
    ).json()["partitions"][0]
    assert latest["offset"] == 5


def test_a_fetch_smaller_than_an_aborted_run_reads_past_it_and_uncommitted_reads_it(client):
    # 60 aborted records and their marker before the first visible one: a fetch of 2 records looks
    # further page by page instead of answering empty at the start of the run.
    producer = TxnProducer(client, "long-abort")
    producer.init()
    for batch in range(3):
        producer.send("out", 1, *(f"doomed-{batch}-{i}" for i in range(20)))
    producer.abort()  # marker at 60
    producer.send("out", 1, "kept-0", "kept-1", "kept-2")  # 61..63
    producer.commit()  # marker at 64

    def read(offset: int, isolation: str) -> dict:
        return client.post(
            "/v1/fetch",
            json={
                "isolation_level": isolation,
                "max_records": 2,
                "partitions": [{"topic": "out", "partition": 1, "offset": offset}],
            },
        ).json()["partitions"][0]

    first = read(0, "read_committed")
    assert [(r["offset"], r["value"]) for r in first["records"]] == [(61, "kept-0"), (62, "kept-1")]
    assert first["next_offset"] == 63
    second = read(63, "read_committed")
    assert [r["value"] for r in second["records"]] == ["kept-2"] and second["next_offset"] == 65
    uncommitted = read(19, "read_uncommitted")
    assert [(r["offset"], r["value"]) for r in uncommitted["records"]] == [(19, "doomed-0-19"), (20, "doomed-1-0")]


def test_read_committed_stops_at_the_first_open_transaction(client):
    first, second = TxnProducer(client, "lso-first"), TxnProducer(client, "lso-second")
    first.init()
    second.init()
    client.post("/v1/topics/out/records", json={"partition": 0, "records": [{"value": "plain-0"}]})
    first.send("out", 0, "first")
    second.send("out", 0, "second")
    client.post("/v1/topics/out/records", json={"partition": 0, "records": [{"value": "plain-1"}]})
    second.commit()
    assert values(client, "out", 0, "read_committed") == ["plain-0"], "the LSO is held by the earlier open txn"
    latest = client.post(
        "/v1/offsets/list",
        json={"isolation_level": "read_committed", "partitions": [{"topic": "out", "partition": 0, "timestamp": -1}]},
    ).json()["partitions"][0]
    assert latest["offset"] == 1
    first.commit()
    assert values(client, "out", 0, "read_committed") == ["plain-0", "first", "second", "plain-1"]


def test_long_poll_under_read_committed_wakes_at_commit(client):
    import threading

    producer = TxnProducer(client, "long-poll")
    producer.init()
    producer.send("out", 0, "soon")
    result: dict = {}

    def poll():
        with httpx.Client(base_url=str(client.base_url), timeout=30) as reader:
            started = time.monotonic()
            result["body"] = reader.post(
                "/v1/fetch", json={"max_wait_ms": 10_000, "partitions": [{"topic": "out", "partition": 0, "offset": 0}]}
            ).json()
            result["elapsed"] = time.monotonic() - started

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.3)
    producer.commit()
    thread.join()
    assert [r["value"] for r in result["body"]["partitions"][0]["records"]] == ["soon"]
    assert result["elapsed"] < 10, "the commit, not the timeout, ended the long poll"


def test_every_end_txn_bumps_the_epoch_and_fences_late_requests(client):
    producer = TxnProducer(client, "epoch-bump")
    init = producer.init()
    producer.send("out", 0, "t1")
    old_ids = producer.ids()
    result = producer.commit()
    assert (result["producer_id"], result["producer_epoch"]) == (init["producer_id"], init["producer_epoch"] + 1)
    late = client.post(
        "/v1/produce",
        json={
            **old_ids,
            "partitions": [{"topic": "out", "partition": 0, "base_sequence": 1, "records": [{"value": "late"}]}],
        },
    )
    assert late.status_code == 409 and error_code(late) == "PRODUCER_FENCED"
    late_add = client.post("/v1/txn/add-partitions", json={**old_ids, "partitions": [{"topic": "out", "partition": 1}]})
    assert error_code(late_add) == "PRODUCER_FENCED"
    producer.send("out", 0, "t2")
    producer.commit()
    assert values(client, "out", 0, "read_committed") == ["t1", "t2"]


def test_end_txn_retry_answers_the_outcome_and_the_opposite_is_refused(client):
    producer = TxnProducer(client, "end-retry")
    producer.init()
    producer.send("out", 0, "x")
    ended_with = producer.ids()
    first = client.post("/v1/txn/end", json={**ended_with, "committed": True})
    retry = client.post("/v1/txn/end", json={**ended_with, "committed": True})
    assert first.status_code == retry.status_code == 200
    assert retry.json() == first.json()
    opposite = client.post("/v1/txn/end", json={**ended_with, "committed": False})
    assert opposite.status_code == 409 and error_code(opposite) == "INVALID_TXN_STATE"
    producer._adopt(first.json())
    nothing_open = producer.end(True)
    assert nothing_open.status_code == 409 and error_code(nothing_open) == "INVALID_TXN_STATE"
    producer.send("out", 0, "next")  # the next transaction starts: the old EndTxn is now just stale
    stale = client.post("/v1/txn/end", json={**ended_with, "committed": True})
    assert error_code(stale) == "PRODUCER_FENCED"


def test_reinit_fences_the_old_instance_and_aborts_its_open_transaction(client):
    zombie = TxnProducer(client, "zombie")
    zombie.init()
    zombie.send("out", 0, "from-zombie")
    fresh = TxnProducer(client, "zombie")
    body = fresh.init()
    assert body["producer_epoch"] > zombie.producer_epoch
    assert watermarks(client, "out", 0)[0] == watermarks(client, "out", 0)[1], "the zombie's txn was aborted"
    for response in (
        zombie.send("out", 0, "again"),
        zombie.end(True),
        client.post("/v1/txn/add-offsets", json={**zombie.ids(), "group_id": "g"}),
        client.post("/v1/txn/add-partitions", json={**zombie.ids(), "partitions": [{"topic": "out", "partition": 1}]}),
    ):
        assert response.status_code == 409 and error_code(response) == "PRODUCER_FENCED", response.text
    fresh.send("out", 0, "from-fresh")
    fresh.commit()
    assert values(client, "out", 0, "read_committed") == ["from-fresh"]


def test_kip360_producer_may_bump_its_own_epoch_and_other_ids_are_fenced(client):
    producer = TxnProducer(client, "kip360")
    producer.init()
    current = producer.ids()
    bumped = producer.init(producer_id=current["producer_id"], producer_epoch=current["producer_epoch"])
    assert bumped["producer_epoch"] == current["producer_epoch"] + 1
    old_ids = {
        "transactional_id": "kip360",
        "transaction_timeout_ms": 1000,
        "producer_id": current["producer_id"],
        "producer_epoch": current["producer_epoch"],
    }
    # The identical retry of that bump (its answer lost) answers the same ids (issue 11)...
    retried = client.post("/v1/producers/init", json=old_ids)
    assert retried.status_code == 200 and retried.json() == bumped
    # ...but once the producer moved on (another bump), the old ids are fenced.
    producer.init(producer_id=bumped["producer_id"], producer_epoch=bumped["producer_epoch"])
    stale = client.post("/v1/producers/init", json=old_ids)
    assert stale.status_code == 409 and error_code(stale) == "PRODUCER_FENCED"


def test_timed_out_transaction_is_aborted_and_its_producer_fenced(make_server):
    server = make_server(abort_timed_out_transaction_interval_ms=100)
    client = server.client
    client.post("/v1/topics", json={"name": "out", "partitions": 1}).raise_for_status()
    producer = TxnProducer(client, "slow", timeout_ms=300)
    producer.init()
    producer.send("out", 0, "too-late")
    deadline = time.monotonic() + 10
    while client.get("/v1/transactions/slow").json()["state"] != "CompleteAbort":
        assert time.monotonic() < deadline, "the timeout worker did not abort the transaction"
        time.sleep(0.05)
    assert values(client, "out", 0, "read_committed") == []
    assert watermarks(client, "out", 0) == (2, 2)
    response = producer.end(True)
    assert response.status_code == 409 and error_code(response) == "PRODUCER_FENCED"
    assert error_code(producer.send("out", 0, "more")) == "PRODUCER_FENCED"


def test_admin_abort_unblocks_the_lso_of_a_hanging_transaction(client):
    hanging = TxnProducer(client, "hanging")
    hanging.init()
    hanging.send("out", 0, "stuck")
    client.post("/v1/topics/out/records", json={"partition": 0, "records": [{"value": "behind"}]})
    assert values(client, "out", 0, "read_committed") == []
    listed = client.get("/v1/transactions", params={"state": "Ongoing"}).json()["transactions"]
    assert [t["transactional_id"] for t in listed] == ["hanging"]
    result = client.post("/v1/transactions/hanging/abort")
    assert result.status_code == 200 and result.json()["state"] == "CompleteAbort"
    assert result.json()["producer_epoch"] > hanging.producer_epoch
    assert values(client, "out", 0, "read_committed") == ["behind"]
    again = client.post("/v1/transactions/hanging/abort")
    assert again.status_code == 409 and error_code(again) == "INVALID_TXN_STATE"
    assert error_code(client.post("/v1/transactions/nobody/abort")) == "TRANSACTIONAL_ID_NOT_FOUND"
    assert error_code(hanging.send("out", 0, "zombie")) == "PRODUCER_FENCED"


def test_two_phase_commit_prepared_transaction_is_committed_by_another_client(make_server):
    server = make_server(abort_timed_out_transaction_interval_ms=50)
    client = server.client
    client.post("/v1/topics", json={"name": "out", "partitions": 1}).raise_for_status()
    writer = TxnProducer(client, "spark/batch-7/0/0", timeout_ms=200)
    writer.init()
    writer.send("out", 0, "prepared-record")
    prepared = client.post("/v1/txn/prepare", json=writer.ids())
    assert prepared.status_code == 200 and prepared.json()["state"] == "Prepared"
    assert client.post("/v1/txn/prepare", json=writer.ids()).json()["state"] == "Prepared", "prepare is retriable"
    refused = writer.send("out", 0, "after-prepare")
    assert refused.status_code == 409 and error_code(refused) == "INVALID_TXN_STATE"
    time.sleep(0.6)
    assert client.get("/v1/transactions/spark/batch-7/0/0").json()["state"] == "Prepared", "no timeout applies"
    listed = client.get(
        "/v1/transactions", params={"transactional_id_prefix": "spark/batch-7/", "state": "Prepared,Ongoing"}
    ).json()["transactions"]
    assert [t["transactional_id"] for t in listed] == ["spark/batch-7/0/0"]
    with httpx.Client(base_url=server.url) as driver:  # another process's client, same ids
        done = driver.post("/v1/txn/end", json={**writer.ids(), "committed": True})
    assert done.status_code == 200 and done.json()["state"] == "CompleteCommit"
    assert values(client, "out", 0, "read_committed") == ["prepared-record"]


def test_keep_prepared_txn_lets_a_new_instance_finish_the_prepared_transaction(client):
    first = TxnProducer(client, "kip939")
    first.init()
    first.send("out", 0, "kept-prepared")
    client.post("/v1/txn/prepare", json=first.ids()).raise_for_status()
    second = TxnProducer(client, "kip939")
    body = second.init(keep_prepared_txn=True)
    assert body["prepared"] == {"producer_id": first.producer_id, "producer_epoch": first.producer_epoch}
    assert client.get("/v1/transactions/kip939").json()["state"] == "Prepared"
    assert error_code(first.end(True)) == "PRODUCER_FENCED"
    assert second.end(True).json()["state"] == "CompleteCommit"
    assert values(client, "out", 0, "read_committed") == ["kept-prepared"]
    third = TxnProducer(client, "kip939")
    assert third.init(keep_prepared_txn=True)["prepared"] is None


def test_init_without_keep_prepared_aborts_a_prepared_transaction(client):
    first = TxnProducer(client, "prepared-then-reinit")
    first.init()
    first.send("out", 0, "will-be-aborted")
    client.post("/v1/txn/prepare", json=first.ids()).raise_for_status()
    TxnProducer(client, "prepared-then-reinit").init()
    assert values(client, "out", 0, "read_committed") == []
    assert watermarks(client, "out", 0) == (2, 2)


def _version(client: httpx.Client, transactional_id: str) -> int | None:
    return client.get(f"/v1/transactions/{transactional_id}").json()["transaction_version"]


def test_transaction_version_is_null_until_an_end_txn_ends_a_transaction(client):
    """The version is what the id's last EndTxn used, null before its first (a new id's producer may
    be a Kafka client, whose EndTxn is of version 1): an abort by a fence (an operator's, a new
    instance's, of an Ongoing or a Prepared transaction) is no EndTxn and sets none, then or after."""
    producer = TxnProducer(client, "versionless")
    producer.init()
    assert _version(client, "versionless") is None
    producer.send("out", 0, "aborted-by-an-operator")
    assert _version(client, "versionless") is None
    assert client.post("/v1/transactions/versionless/abort").json()["state"] == "CompleteAbort"
    assert _version(client, "versionless") is None
    producer.init()
    producer.send("out", 0, "aborted-by-a-new-instance")
    producer.init()
    producer.send("out", 0, "prepared-then-aborted-by-a-new-instance")
    client.post("/v1/txn/prepare", json=producer.ids()).raise_for_status()
    producer.init()
    described = client.get("/v1/transactions/versionless").json()
    assert (described["state"], described["transaction_version"]) == ("Empty", None)

    producer.send("out", 0, "committed")
    producer.commit()
    assert _version(client, "versionless") == 2  # HTTP's EndTxn
    producer.send("out", 0, "fenced-after-an-end")
    producer.init()
    assert _version(client, "versionless") == 2, "a fence keeps the last EndTxn's version"
    assert values(client, "out", 0, "read_committed") == ["committed"]


def test_add_partitions_and_add_offsets_appear_in_describe(client):
    producer = TxnProducer(client, "describe-me")
    producer.init()
    added = client.post(
        "/v1/txn/add-partitions",
        json={
            **producer.ids(),
            "partitions": [
                {"topic": "out", "partition": 1},
                {"topic": "nope", "partition": 0},
                {"topic": "out", "partition": 9},
            ],
        },
    )
    assert [p["error"] and p["error"]["code"] for p in added.json()["partitions"]] == [
        None,
        "UNKNOWN_TOPIC_OR_PARTITION",
        "UNKNOWN_TOPIC_OR_PARTITION",
    ]
    client.post("/v1/txn/add-offsets", json={**producer.ids(), "group_id": "readers"}).raise_for_status()
    described = client.get("/v1/transactions/describe-me").json()
    assert described["state"] == "Ongoing" and described["groups"] == ["readers"]
    assert described["start_time_ms"] > 0
    topics = {(p["topic"], p["partition"]) for p in described["partitions"]}
    assert ("out", 1) in topics and any(topic == "__consumer_offsets" for topic, _ in topics)
    assert producer.commit()["state"] == "CompleteCommit"
    assert client.get("/v1/transactions/describe-me").json()["start_time_ms"] == -1


def test_list_transactions_filters(client):
    for name in ("team-a/1", "team-a/2", "team-b/1"):
        producer = TxnProducer(client, name)
        producer.init()
        if name != "team-a/2":
            producer.send("out", 0, name)
    by_prefix = client.get("/v1/transactions", params={"transactional_id_prefix": "team-a/"}).json()
    assert [t["transactional_id"] for t in by_prefix["transactions"]] == ["team-a/1", "team-a/2"]
    ongoing = client.get("/v1/transactions", params={"state": "Ongoing"}).json()["transactions"]
    assert {t["transactional_id"] for t in ongoing} == {"team-a/1", "team-b/1"}
    assert client.get("/v1/transactions", params={"min_duration_ms": 3_600_000}).json()["transactions"] == []
    one = ongoing[0]
    by_producer = client.get("/v1/transactions", params={"producer_id": one["producer_id"]}).json()
    assert [t["transactional_id"] for t in by_producer["transactions"]] == [one["transactional_id"]]
    bad = client.get("/v1/transactions", params={"state": "Sleeping"})
    assert bad.status_code == 400 and error_code(bad) == "INVALID_REQUEST"


def test_describe_producers_shows_open_transaction_start(client):
    producer = TxnProducer(client, "producers-view")
    producer.init()
    client.post("/v1/topics/out/records", json={"partition": 0, "records": [{"value": "p"}]})
    producer.send("out", 0, "a", "b")
    [entry] = client.get("/v1/topics/out/partitions/0/producers").json()["producers"]
    assert entry == {
        "producer_id": producer.producer_id,
        "producer_epoch": producer.producer_epoch,
        "last_sequence": 1,
        "last_timestamp_ms": entry["last_timestamp_ms"],
        "current_txn_start_offset": 1,
    }
    producer.commit()
    [entry] = client.get("/v1/topics/out/partitions/0/producers").json()["producers"]
    assert entry["current_txn_start_offset"] == -1


def test_transaction_log_records_every_transition(client):
    producer = TxnProducer(client, "logged")
    producer.init()
    producer.send("out", 0, "x")
    producer.commit()
    states = []
    for partition in range(50):
        body = client.post(
            "/v1/fetch",
            json={
                "isolation_level": "read_uncommitted",
                "max_records": 100,
                "partitions": [{"topic": "__transaction_state", "partition": partition, "offset": 0}],
            },
        ).json()["partitions"][0]
        states += [__import__("json").loads(r["value"])["state"] for r in body["records"] if r["key"] == "logged"]
    assert states == ["Empty", "Ongoing", "PrepareCommit", "CompleteCommit"]


# ---- idempotent producers


def init_idempotent(client: httpx.Client) -> tuple[int, int]:
    body = client.post("/v1/producers/init", json={}).json()
    return body["producer_id"], body["producer_epoch"]


def idempotent_send(client, producer_id, epoch, sequence, *values, partition=0):
    return client.post(
        "/v1/produce",
        json={
            "producer_id": producer_id,
            "producer_epoch": epoch,
            "partitions": [
                {
                    "topic": "out",
                    "partition": partition,
                    "base_sequence": sequence,
                    "records": [{"value": v} for v in values],
                }
            ],
        },
    )


def test_idempotent_retries_within_the_last_five_batches_are_duplicates(client):
    producer_id, epoch = init_idempotent(client)
    offsets = []
    for batch in range(7):
        entry = idempotent_send(client, producer_id, epoch, batch * 2, f"{batch}a", f"{batch}b").json()["partitions"][0]
        assert entry["error"] is None and entry["duplicate"] is False
        offsets.append((entry["base_offset"], entry["last_offset"]))
    for batch in range(2, 7):  # the last five
        entry = idempotent_send(client, producer_id, epoch, batch * 2, "x", "y").json()["partitions"][0]
        assert entry["duplicate"] is True and (entry["base_offset"], entry["last_offset"]) == offsets[batch]
    too_old = idempotent_send(client, producer_id, epoch, 2, "x", "y").json()["partitions"][0]
    assert too_old["error"]["code"] == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    assert len(values(client, "out", 0, "read_uncommitted")) == 14, "nothing was appended twice"


def test_idempotent_sequence_errors(client):
    producer_id, epoch = init_idempotent(client)
    gap = idempotent_send(client, producer_id, epoch, 3, "gap").json()["partitions"][0]
    assert gap["error"]["code"] == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    assert "expected sequence 0" in gap["error"]["message"]
    idempotent_send(client, producer_id, epoch, 0, "first").raise_for_status()
    skip = idempotent_send(client, producer_id, epoch, 2, "skip").json()["partitions"][0]
    assert skip["error"]["code"] == "OUT_OF_ORDER_SEQUENCE_NUMBER" and "expected 1" in skip["error"]["message"]
    unknown = idempotent_send(client, 999_999_999, 0, 0, "who")
    assert unknown.status_code == 409 and error_code(unknown) == "UNKNOWN_PRODUCER_ID"
    # A higher epoch is the producer's own bump (as Kafka's leaders take it): it starts at sequence 0
    # and fences the lower ones.
    higher = idempotent_send(client, producer_id, epoch + 5, 1, "future").json()["partitions"][0]
    assert higher["error"]["code"] == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    idempotent_send(client, producer_id, epoch + 5, 0, "future").raise_for_status()
    stale = idempotent_send(client, producer_id, epoch, 1, "stale").json()["partitions"][0]
    assert stale["error"]["code"] == "INVALID_PRODUCER_EPOCH"
    assert values(client, "out", 0, "read_uncommitted") == ["first", "future"]


def test_idempotent_epoch_bump_resets_sequences_and_fences_the_old_epoch(client):
    producer_id, epoch = init_idempotent(client)
    idempotent_send(client, producer_id, epoch, 0, "a").raise_for_status()
    bumped = client.post("/v1/producers/init", json={"producer_id": producer_id, "producer_epoch": epoch}).json()
    assert bumped == {"producer_id": producer_id, "producer_epoch": epoch + 1}
    nonzero = idempotent_send(client, producer_id, epoch + 1, 5, "b").json()["partitions"][0]
    assert nonzero["error"]["code"] == "OUT_OF_ORDER_SEQUENCE_NUMBER", "a new epoch starts at sequence 0"
    idempotent_send(client, producer_id, epoch + 1, 0, "b").raise_for_status()
    stale = idempotent_send(client, producer_id, epoch, 1, "c").json()["partitions"][0]
    assert stale["error"]["code"] == "INVALID_PRODUCER_EPOCH"
    assert values(client, "out", 0, "read_uncommitted") == ["a", "b"]


@pytest.mark.parametrize("asked_with", ["issued", "own"])
def test_a_bump_after_the_producer_s_own_higher_epoch_issues_an_epoch_it_never_wrote_with(client, asked_with):
    """Regression: a producer that started a higher epoch itself (taken, as Kafka's leaders take it)
    then asked a KIP-360 bump with the epoch the server issued, as api.md said: the bump answered
    the epoch the producer had already written with, so its next batch, at sequence 0 of that epoch,
    was answered as a duplicate of the earlier one and its records dropped. Asked with its own
    epoch, the bump was refused. Either way the bump now answers an epoch above every one it wrote
    with."""
    producer_id, epoch = init_idempotent(client)
    idempotent_send(client, producer_id, epoch, 0, "a0", "a1").raise_for_status()
    own = epoch + 1  # the producer's own bump, with no request
    started = idempotent_send(client, producer_id, own, 0, "b0", "b1").json()["partitions"][0]
    assert started["error"] is None and started["duplicate"] is False
    response = client.post(
        "/v1/producers/init",
        json={"producer_id": producer_id, "producer_epoch": epoch if asked_with == "issued" else own},
    )
    assert response.status_code == 200, response.text
    bumped = response.json()
    assert bumped["producer_epoch"] > own
    written = idempotent_send(client, producer_id, bumped["producer_epoch"], 0, "c0", "c1").json()["partitions"][0]
    assert written["error"] is None and written["duplicate"] is False
    assert values(client, "out", 0, "read_uncommitted") == ["a0", "a1", "b0", "b1", "c0", "c1"]
    # Every epoch the producer wrote with before the bump is fenced at once.
    stale = idempotent_send(client, producer_id, own, 2, "late").json()["partitions"][0]
    assert stale["error"]["code"] == "INVALID_PRODUCER_EPOCH"


@pytest.mark.parametrize("transactional", [False, True])
@pytest.mark.parametrize("half", [{"producer_epoch": -1}, {"producer_id": -1}])
def test_init_with_only_one_of_producer_id_and_epoch_is_invalid_request(client, transactional, half):
    """Regression: an InitProducerId naming a producer id with epoch -1 (a client that left the epoch
    out) was taken for the retry of a bump from epoch -1 and answered the live producer's own id and
    epoch 0: a second holder of them, whose batches at the first one's sequences were answered as
    duplicates and dropped. Kafka's broker refuses a request with only one of the two as
    INVALID_REQUEST, and so does txbroker now, whatever the id."""
    producer_id, epoch = init_idempotent(client)
    idempotent_send(client, producer_id, epoch, 0, "first-holder").raise_for_status()
    body = {"producer_id": producer_id, "producer_epoch": epoch, **half}
    if transactional:
        body = {**TxnProducer(client, "half-ids").init(), **half, "transactional_id": "half-ids"}
    response = client.post("/v1/producers/init", json=body)
    assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST", response.text
    message = response.json()["error"]["message"]
    assert "producer_id" in message and "producer_epoch" in message
    assert values(client, "out", 0, "read_uncommitted") == ["first-holder"]


def test_producer_ids_are_unique(client):
    ids = {init_idempotent(client)[0] for _ in range(20)}
    ids |= {TxnProducer(client, f"unique-{n}").init()["producer_id"] for n in range(5)}
    assert len(ids) == 25


# ---- error codes of these endpoints


@pytest.mark.parametrize("timeout_ms", [0, -5, 900_001])
def test_invalid_transaction_timeout(client, timeout_ms):
    response = client.post("/v1/producers/init", json={"transactional_id": "t", "transaction_timeout_ms": timeout_ms})
    assert response.status_code == 400 and error_code(response) == "INVALID_TRANSACTION_TIMEOUT"
    assert str(timeout_ms) in response.json()["error"]["message"]


def test_unknown_transactional_id_is_invalid_producer_id_mapping(client):
    ids = {"transactional_id": "never-initialized", "producer_id": 5, "producer_epoch": 0}
    for path, extra in (
        ("/v1/txn/end", {"committed": True}),
        ("/v1/txn/prepare", {}),
        ("/v1/txn/add-offsets", {"group_id": "g"}),
        ("/v1/txn/add-partitions", {"partitions": [{"topic": "out", "partition": 0}]}),
    ):
        response = client.post(path, json={**ids, **extra})
        assert response.status_code == 409 and error_code(response) == "INVALID_PRODUCER_ID_MAPPING", path
    produce = client.post(
        "/v1/produce",
        json={**ids, "partitions": [{"topic": "out", "partition": 0, "base_sequence": 0, "records": [{"value": "x"}]}]},
    )
    assert error_code(produce) == "INVALID_PRODUCER_ID_MAPPING"
    assert error_code(client.get("/v1/transactions/never-initialized")) == "TRANSACTIONAL_ID_NOT_FOUND"


def test_wrong_producer_id_and_higher_epoch(client):
    producer = TxnProducer(client, "mapping")
    producer.init()
    other = TxnProducer(client, "other")
    other.init()
    wrong = client.post("/v1/txn/end", json={**producer.ids(), "producer_id": other.producer_id, "committed": True})
    assert error_code(wrong) == "INVALID_PRODUCER_ID_MAPPING"
    higher = client.post(
        "/v1/txn/end", json={**producer.ids(), "producer_epoch": producer.producer_epoch + 3, "committed": True}
    )
    assert higher.status_code == 409 and error_code(higher) == "INVALID_PRODUCER_EPOCH"
    idempotent_id, _ = init_idempotent(client)
    borrowed = client.post(
        "/v1/produce",
        json={
            "producer_id": producer.producer_id,
            "producer_epoch": 0,
            "partitions": [{"topic": "out", "partition": 0, "base_sequence": 0, "records": [{"value": "x"}]}],
        },
    )
    assert error_code(borrowed) == "INVALID_PRODUCER_ID_MAPPING", "a transactional id's producer writes transactionally"
    assert idempotent_id != producer.producer_id


def test_prepared_and_ended_transactions_refuse_writes_and_second_phases(client):
    producer = TxnProducer(client, "states")
    producer.init()
    nothing = client.post("/v1/txn/prepare", json=producer.ids())
    assert nothing.status_code == 409 and error_code(nothing) == "INVALID_TXN_STATE"
    assert error_code(producer.end(False)) == "INVALID_TXN_STATE"
    producer.send("out", 0, "x")
    client.post("/v1/txn/prepare", json=producer.ids()).raise_for_status()
    add = client.post(
        "/v1/txn/add-partitions", json={**producer.ids(), "partitions": [{"topic": "out", "partition": 1}]}
    )
    assert error_code(add) == "INVALID_TXN_STATE"
    assert producer.abort()["state"] == "CompleteAbort"


def test_transactional_bad_requests_are_invalid_request(client):
    cases = [
        ("/v1/producers/init", {"transactional_id": "", "transaction_timeout_ms": 1000}),
        ("/v1/producers/init", {"transactional_id": "x", "transaction_timeout_ms": "1000"}),
        ("/v1/producers/init", {"producer_epoch": 40000}),
        ("/v1/txn/end", {"transactional_id": "x", "producer_id": 1, "producer_epoch": 0}),
        ("/v1/txn/end", {"transactional_id": "x", "producer_id": 1, "producer_epoch": 0, "committed": "yes"}),
        ("/v1/txn/add-partitions", {"transactional_id": "x", "producer_id": 1, "producer_epoch": 0, "partitions": []}),
        ("/v1/coordinators/find", {"key_type": "broker", "key": "x"}),
    ]
    for path, body in cases:
        response = client.post(path, json=body)
        assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST", (path, body, response.text)
    found = client.post("/v1/coordinators/find", json={"key_type": "transaction", "key": "x"}).json()
    assert found["key"] == "x" and found["url"].startswith("http://")


# ---- expiration workers


def _wait_for(condition, timeout_s: float = 10, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_idle_transactional_ids_expire_and_start_afresh(make_server):
    server = make_server(transactional_id_expiration_ms=300, remove_expired_transaction_interval_ms=50)
    client = server.client
    client.post("/v1/topics", json={"name": "out", "partitions": 1}).raise_for_status()
    producer = TxnProducer(client, "forgetful")
    first = producer.init()
    producer.send("out", 0, "x")
    producer.commit()
    _wait_for(lambda: client.get("/v1/transactions/forgetful").status_code == 404, what="expiration")
    assert error_code(client.get("/v1/transactions/forgetful")) == "TRANSACTIONAL_ID_NOT_FOUND"
    assert error_code(producer.send("out", 0, "y")) == "INVALID_PRODUCER_ID_MAPPING"
    again = TxnProducer(client, "forgetful").init()
    assert again["producer_epoch"] == 0 and again["producer_id"] != first["producer_id"]
    assert _version(client, "forgetful") is None, "the new id has ended no transaction"


def test_open_transactions_never_expire_as_idle(make_server):
    server = make_server(transactional_id_expiration_ms=100, remove_expired_transaction_interval_ms=50)
    client = server.client
    client.post("/v1/topics", json={"name": "out", "partitions": 1}).raise_for_status()
    producer = TxnProducer(client, "busy")
    producer.init()
    producer.send("out", 0, "open")
    time.sleep(0.5)
    assert client.get("/v1/transactions/busy").json()["state"] == "Ongoing"
    assert producer.commit()["state"] == "CompleteCommit"


def test_idle_producer_state_and_ids_expire(make_server):
    server = make_server(producer_id_expiration_ms=300, producer_id_expiration_check_interval_ms=50)
    client = server.client
    client.post("/v1/topics", json={"name": "out", "partitions": 1}).raise_for_status()
    producer_id, epoch = init_idempotent(client)
    idempotent_send(client, producer_id, epoch, 0, "a").raise_for_status()
    _wait_for(
        lambda: client.get("/v1/topics/out/partitions/0/producers").json()["producers"] == [],
        what="producer state expiration",
    )
    _wait_for(
        lambda: idempotent_send(client, producer_id, epoch, 1, "b").status_code == 409, what="producer id expiration"
    )
    assert error_code(idempotent_send(client, producer_id, epoch, 1, "b")) == "UNKNOWN_PRODUCER_ID"


# ---- a transaction caught between EndTxn's two phases (as after a crash there)


def _force_state(database_url: str, transactional_id: str, state: str) -> None:
    import asyncio

    from app.storage.database import connect

    async def update():
        conn = await connect(database_url)
        try:
            await conn.execute(
                "UPDATE transactions SET state = $2 WHERE transactional_id = $1", transactional_id, state
            )
        finally:
            await conn.close()

    asyncio.run(update())


def _caught_in(
    make_server,
    state: str,
    transactional_id: str,
    value: str,
    partitions: int = 1,
    recovery_interval_ms: int = 3_600_000,
) -> tuple[httpx.Client, TxnProducer]:
    """A server whose id's transaction, `value` written to out-0, is caught in `state` (as a crash
    between the steps leaves it); the periodic recovery runs every `recovery_interval_ms` (with the
    timeout worker), by default not during a test."""
    server = make_server(abort_timed_out_transaction_interval_ms=recovery_interval_ms)
    client = server.client
    client.post("/v1/topics", json={"name": "out", "partitions": partitions}).raise_for_status()
    producer = TxnProducer(client, transactional_id)
    producer.init()
    producer.send("out", 0, value)
    _force_state(server.database_url, transactional_id, state)
    return client, producer


def test_requests_during_completion_are_concurrent_transactions_and_end_txn_finishes_it(make_server):
    client, producer = _caught_in(make_server, "PrepareCommit", "between-phases", "decided", partitions=2)
    for response in (
        producer.send("out", 1, "more"),
        client.post(
            "/v1/txn/add-partitions", json={**producer.ids(), "partitions": [{"topic": "out", "partition": 1}]}
        ),
        client.post("/v1/txn/prepare", json=producer.ids()),
    ):
        assert response.status_code == 409 and error_code(response) == "CONCURRENT_TRANSACTIONS", response.text
        assert response.json()["error"]["retriable"] is True
    assert error_code(producer.end(False)) == "INVALID_TXN_STATE", "the outcome is decided: commit"
    assert producer.end(True).json()["state"] == "CompleteCommit", "a retried EndTxn completes it"
    assert values(client, "out", 0, "read_committed") == ["decided"]


def test_init_producer_id_completes_a_decided_transaction_before_answering(make_server):
    client, _ = _caught_in(make_server, "PrepareCommit", "decided-then-reinit", "committed-by-reinit")
    TxnProducer(client, "decided-then-reinit").init()
    assert values(client, "out", 0, "read_committed") == ["committed-by-reinit"]
    assert watermarks(client, "out", 0) == (2, 2)


def test_recovery_completes_a_fenced_abort_of_an_id_with_no_version_as_version_2(make_server):
    """A PrepareAbort a fence left durable (a coordinator that wrote it apart from its markers) on an id
    no EndTxn has ended a transaction of: recovery completes it bumping the epoch, as it did when such
    an id said version 2, and the id still has none."""
    client, producer = _caught_in(
        make_server, "PrepareAbort", "fenced-then-crashed", "aborted-by-recovery", recovery_interval_ms=50
    )
    _wait_for(
        lambda: client.get("/v1/transactions/fenced-then-crashed").json()["state"] == "CompleteAbort", what="recovery"
    )
    described = client.get("/v1/transactions/fenced-then-crashed").json()
    assert (described["producer_epoch"], described["transaction_version"]) == (producer.producer_epoch + 1, None)
    assert values(client, "out", 0, "read_committed") == []
    assert watermarks(client, "out", 0) == (2, 2)


def test_admin_abort_with_expected_ids_spares_a_newer_transaction(client):
    producer = TxnProducer(client, "moved-on")
    producer.init()
    producer.send("out", 0, "old")
    seen = {"producer_id": producer.producer_id, "producer_epoch": producer.producer_epoch}
    producer.commit()
    producer.send("out", 0, "new")
    stale = client.post("/v1/transactions/moved-on/abort", params=seen)
    assert stale.status_code == 409 and error_code(stale) == "INVALID_TXN_STATE"
    assert client.get("/v1/transactions/moved-on").json()["state"] == "Ongoing", "the newer transaction is untouched"
    current = {"producer_id": producer.producer_id, "producer_epoch": producer.producer_epoch}
    assert client.post("/v1/transactions/moved-on/abort", params=current).json()["state"] == "CompleteAbort"
