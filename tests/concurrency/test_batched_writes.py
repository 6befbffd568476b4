"""Write batching (app/coordinator/write_batching.py, batched_writes.py): requests that queue while
a write batch is being written are written together in the next write batch, one PostgreSQL
transaction, and each still gets exactly the answer it would get alone, as if the write batch's
requests ran one after the other.

The first batch is held on a partition's row lock taken by a connection of the test, so that the
requests sent meanwhile queue in the server (the test waits until all have) and form the next batch;
the record batches a write batch wrote share their PostgreSQL transaction id (xmin), which shows the batching
happened."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from app.storage.database import connect


def _post(url: str, path: str, body: dict) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=60) as client:
        return client.post(path, json=body)


def _init(server, transactional_id: str | None = None) -> dict:
    body = {"transactional_id": transactional_id, "transaction_timeout_ms": 60_000}
    response = server.client.post("/v1/producers/init", json=body)
    assert response.status_code == 200, response.text
    return {"transactional_id": transactional_id, **response.json()}


def _records(prefix: str, count: int) -> list[dict]:
    return [{"value": f"{prefix}-{i}"} for i in range(count)]


class _HeldPartition:
    """A connection of the test that holds a partition's row lock until released."""

    def __init__(self, database_url: str, topic: str, partition: int) -> None:
        self.locked = threading.Event()
        self.release = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._hold(database_url, topic, partition)))
        self.thread.start()
        assert self.locked.wait(30), "the test could not lock the partition"

    async def _hold(self, database_url: str, topic: str, partition: int) -> None:
        conn = await connect(database_url)
        try:
            async with conn.transaction():
                await conn.execute(
                    "SELECT 1 FROM partitions p JOIN topics t USING (topic_id) "
                    "WHERE t.name = $1 AND p.partition = $2 FOR UPDATE OF p",
                    topic,
                    partition,
                )
                self.locked.set()
                while not self.release.is_set():
                    await asyncio.sleep(0.01)
        finally:
            await conn.close()

    def let_go(self) -> None:
        self.release.set()
        self.thread.join(30)


def _waiting_for_a_lock(database_url: str) -> int:
    """Sessions of this test's database waiting for a lock: the test session's PostgreSQL also serves
    other tests' databases, whose servers (module-scoped ones, still running) may wait for locks of
    their own at any moment."""

    async def count() -> int:
        conn = await connect(database_url)
        try:
            return await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        finally:
            await conn.close()

    return asyncio.run(count())


def _batches(database_url: str, topic: str) -> list[dict]:
    async def fetch() -> list[dict]:
        conn = await connect(database_url)
        try:
            rows = await conn.fetch(
                "SELECT b.partition, b.base_offset, b.last_offset, b.producer_id, b.xmin::text AS xmin, "
                "b.control_type IS NOT NULL AS control "
                "FROM record_batches b JOIN topics t USING (topic_id) WHERE t.name = $1 "
                "ORDER BY b.partition, b.base_offset",
                topic,
            )
            return [dict(row) for row in rows]
        finally:
            await conn.close()

    return asyncio.run(fetch())


def _queue_behind_a_held_group(
    server,
    topic: str,
    requests: list[tuple[str, dict]],
    blocker: tuple[str, dict] | None = None,
    in_order: bool = False,
) -> list[httpx.Response]:
    """Holds partition 0 of `topic`, sends `blocker` (by default a plain write there), whose batch
    waits on the lock, then `requests` (which queue and form the next batch; with `in_order`, each
    queued before the next is sent), lets go, and returns their answers."""
    blocker = blocker or ("/v1/produce", {"partitions": [{"topic": topic, "partition": 0, "records": [{}]}]})
    state = server.extra["uvicorn"].config.app.state  # the in-process server's app
    batcher = state.batched_writes.batcher
    held = _HeldPartition(server.database_url, topic, 0)
    with ThreadPoolExecutor(len(requests) + 1) as pool:
        try:
            blocked = pool.submit(_post, server.url, *blocker)
            deadline = time.monotonic() + 30
            while _waiting_for_a_lock(server.database_url) == 0:
                assert time.monotonic() < deadline, "the first batch never waited for the held partition"
                time.sleep(0.02)
            answers = []
            for path, body in requests:
                answers.append(pool.submit(_post, server.url, path, body))
                while in_order and batcher.waiting < len(answers):
                    assert time.monotonic() < deadline, f"request {len(answers)} never queued"
                    time.sleep(0.01)
            while batcher.waiting < len(requests):  # every request queues behind the held batch
                assert time.monotonic() < deadline, f"{batcher.waiting} of {len(requests)} requests queued"
                time.sleep(0.02)
        finally:
            held.let_go()
        assert blocked.result().status_code == 200
        return [answer.result() for answer in answers]


def test_queued_produce_requests_are_written_together_each_with_its_own_answer(server):
    topic = "grouped-produce"
    server.client.post("/v1/topics", json={"name": topic, "partitions": 2}).raise_for_status()
    first, second, stale = _init(server), _init(server), _init(server)
    server.client.post(
        "/v1/produce",
        json={**stale, "partitions": [{"topic": topic, "partition": 1, "base_sequence": 0, "records": [{}]}]},
    ).raise_for_status()
    bumped = server.client.post(
        "/v1/producers/init", json={"producer_id": stale["producer_id"], "producer_epoch": stale["producer_epoch"]}
    ).json()
    assert bumped["producer_epoch"] == stale["producer_epoch"] + 1

    def produce(producer: dict, partition: int, sequence: int, prefix: str, count: int) -> tuple[str, dict]:
        entry = {"topic": topic, "partition": partition, "base_sequence": sequence, "records": _records(prefix, count)}
        return "/v1/produce", {**producer, "partitions": [entry]}

    answers = _queue_behind_a_held_group(
        server,
        topic,
        [
            produce(first, 0, 0, "first", 3),
            produce(first, 0, 0, "first", 3),  # the same batch again: one of the two is a duplicate
            produce(second, 0, 0, "second", 2),
            produce(second, 1, 0, "second", 4),
            produce(stale, 0, 1, "stale", 1),  # fenced by the bump: appends nothing
            produce({"producer_id": -1}, 1, -1, "plain", 5),
            produce(second | {"producer_id": 999_999}, 0, 0, "unknown", 1),  # never issued: a request-level error
        ],
    )
    assert [answer.status_code for answer in answers[:6]] == [200] * 6
    assert answers[6].json()["error"]["code"] == "UNKNOWN_PRODUCER_ID"
    entries = [answer.json()["partitions"][0] for answer in answers[:6]]
    original, retried = sorted(entries[:2], key=lambda entry: entry["duplicate"])
    assert not original["duplicate"] and retried["duplicate"]
    assert (retried["base_offset"], retried["last_offset"]) == (original["base_offset"], original["last_offset"])
    assert entries[4]["error"]["code"] == "INVALID_PRODUCER_EPOCH"
    for entry in (original, entries[2], entries[3], entries[5]):
        assert entry["error"] is None and not entry["duplicate"]

    batches = _batches(server.database_url, topic)
    for partition in (0, 1):
        offsets = [(b["base_offset"], b["last_offset"]) for b in batches if b["partition"] == partition]
        assert [base for base, _ in offsets] == [0] + [last + 1 for _, last in offsets[:-1]], "offsets not dense"
    # The stale producer's batch before, the held write batch's plain batch at 0-0, then the queued one:
    # first's batch, second's two and the plain one, all in one PostgreSQL transaction.
    assert len(batches) == 1 + 1 + 4
    queued = [
        b for b in batches if b["producer_id"] != stale["producer_id"] and (b["partition"], b["base_offset"]) != (0, 0)
    ]
    assert len(queued) == 4
    assert len({b["xmin"] for b in queued}) == 1, f"the queued requests were not written together: {batches}"
    fetched = server.client.get(f"/v1/topics/{topic}/partitions/0/records", params={"offset": 0}).json()
    assert [r["value"] for r in fetched["records"]][1:] in (
        ["first-0", "first-1", "first-2", "second-0", "second-1"],
        ["second-0", "second-1", "first-0", "first-1", "first-2"],
    )


def test_queued_end_txns_are_written_together_each_with_its_own_answer(server):
    topic = "grouped-ends"
    server.client.post("/v1/topics", json={"name": topic, "partitions": 2}).raise_for_status()
    producers = [_init(server, f"grouped-end-{i}") for i in range(4)]
    for producer in producers:
        for partition in (0, 1):
            response = server.client.post(
                "/v1/produce",
                json={
                    **producer,
                    "partitions": [
                        {"topic": topic, "partition": partition, "base_sequence": 0, "records": _records("t", 1)}
                    ],
                },
            )
            assert response.status_code == 200 and response.json()["partitions"][0]["error"] is None
    commit, abort, twice, first = producers
    answers = _queue_behind_a_held_group(
        server,
        topic,
        [
            ("/v1/txn/end", {**commit, "committed": True}),
            ("/v1/txn/end", {**abort, "committed": False}),
            ("/v1/txn/end", {**twice, "committed": True}),
            ("/v1/txn/end", {**twice, "committed": True}),  # a retry: the same answer, no second marker
            ("/v1/txn/end", {**commit, "producer_epoch": commit["producer_epoch"] + 5, "committed": True}),
        ],
        blocker=("/v1/txn/end", {**first, "committed": True}),
    )
    assert [answer.status_code for answer in answers[:4]] == [200] * 4, [a.text for a in answers]
    assert answers[4].status_code != 200
    assert answers[0].json()["producer_epoch"] == commit["producer_epoch"] + 1
    assert answers[2].json() == answers[3].json()
    markers = server.client.get(f"/v1/topics/{topic}/partitions/0/markers").json()["markers"]
    assert sorted((m["producer_id"], m["type"]) for m in markers) == sorted(
        [
            (first["producer_id"], "COMMIT"),
            (commit["producer_id"], "COMMIT"),
            (abort["producer_id"], "ABORT"),
            (twice["producer_id"], "COMMIT"),
        ]
    )
    control = [
        b for b in _batches(server.database_url, topic) if b["control"] and b["producer_id"] != first["producer_id"]
    ]
    assert len(control) == 6 and len({b["xmin"] for b in control}) == 1, f"not written together: {control}"
    offsets = sorted(m["offset"] for m in markers)
    assert offsets == list(range(offsets[0], offsets[0] + 4)), f"the markers' offsets are not consecutive: {markers}"
    committed = server.client.post(
        "/v1/fetch",
        json={"isolation_level": "read_committed", "partitions": [{"topic": topic, "partition": 1, "offset": 0}]},
    ).json()["partitions"][0]
    assert len(committed["records"]) == 3  # the committed transactions' records, not the aborted one's


def test_queued_produce_and_end_txn_requests_are_written_together_in_their_order(server):
    """Produce and EndTxn requests that queue together form one batch (one PostgreSQL transaction),
    applied in their order of arrival: a produce before its transaction's EndTxn is committed with
    it, a produce of the transaction after it is fenced, and another transaction's marker and a plain
    batch in the same partition are written beside them, the batches before the markers."""
    topic = "grouped-mixed"
    server.client.post("/v1/topics", json={"name": topic, "partitions": 2}).raise_for_status()
    committed, aborted = _init(server, "grouped-mixed-commit"), _init(server, "grouped-mixed-abort")

    def produce(producer: dict, sequence: int, value: str) -> tuple[str, dict]:
        entry = {"topic": topic, "partition": 1, "base_sequence": sequence, "records": [{"value": value}]}
        return "/v1/produce", {**producer, "partitions": [entry]}

    for producer, value in ((committed, "before"), (aborted, "aborted")):
        path, body = produce(producer, 0, value)
        response = server.client.post(path, json=body)
        assert response.status_code == 200 and response.json()["partitions"][0]["error"] is None, response.text
    answers = _queue_behind_a_held_group(
        server,
        topic,
        [
            produce(committed, 1, "in-the-batch"),
            ("/v1/txn/end", {**committed, "committed": True}),
            produce(committed, 2, "zombie"),  # the epoch the EndTxn before it ended
            ("/v1/txn/end", {**aborted, "committed": False}),
            produce({"producer_id": -1}, -1, "plain"),
        ],
        in_order=True,
    )
    assert [answer.status_code == 200 for answer in answers] == [True, True, False, True, True], [
        answer.text for answer in answers
    ]
    assert answers[0].json()["partitions"][0]["error"] is None
    assert answers[1].json() == {
        "producer_id": committed["producer_id"],
        "producer_epoch": committed["producer_epoch"] + 1,
        "state": "CompleteCommit",
    }
    assert answers[2].json()["error"]["code"] == "PRODUCER_FENCED"
    assert answers[3].json()["state"] == "CompleteAbort"
    plain_offset = answers[4].json()["partitions"][0]["base_offset"]

    batches = [b for b in _batches(server.database_url, topic) if b["partition"] == 1]
    grouped = [b for b in batches if b["base_offset"] >= 2]
    assert len(grouped) == 4 and len({b["xmin"] for b in grouped}) == 1, f"not written together: {batches}"
    markers = server.client.get(f"/v1/topics/{topic}/partitions/1/markers").json()["markers"]
    assert sorted((m["producer_id"], m["type"]) for m in markers) == sorted(
        [(committed["producer_id"], "COMMIT"), (aborted["producer_id"], "ABORT")]
    )
    assert min(m["offset"] for m in markers) > plain_offset, (
        f"a marker before the write batch's record batches: {batches}"
    )
    fetched = server.client.post(
        "/v1/fetch",
        json={"isolation_level": "read_committed", "partitions": [{"topic": topic, "partition": 1, "offset": 0}]},
    ).json()["partitions"][0]
    assert [record["value"] for record in fetched["records"]] == ["before", "in-the-batch", "plain"]


def test_a_queued_end_txn_and_a_produce_to_other_partitions_are_written_together(server):
    """An EndTxn and a produce of another transaction to other partitions, queued together, are
    written together, by one statement (batches, markers and transaction log fused): each
    partition's head moves by its own write only, and each transaction ends as its requests said."""
    topic, other = "grouped-fused", "grouped-fused-other"
    for name in (topic, other):
        server.client.post("/v1/topics", json={"name": name, "partitions": 2}).raise_for_status()
    ending, starting = _init(server, "grouped-fused-ending"), _init(server, "grouped-fused-starting")

    def produce(producer: dict, name: str, partition: int, value: str) -> tuple[str, dict]:
        entry = {"topic": name, "partition": partition, "base_sequence": 0, "records": [{"value": value}]}
        return "/v1/produce", {**producer, "partitions": [entry]}

    path, body = produce(ending, topic, 1, "ended")
    assert server.client.post(path, json=body).json()["partitions"][0]["error"] is None
    answers = _queue_behind_a_held_group(
        server,
        topic,
        [("/v1/txn/end", {**ending, "committed": True}), produce(starting, other, 1, "open")],
        in_order=True,
    )
    assert [answer.status_code for answer in answers] == [200, 200], [answer.text for answer in answers]
    assert answers[0].json()["state"] == "CompleteCommit"
    assert answers[1].json()["partitions"][0]["base_offset"] == 0

    written = [b for b in _batches(server.database_url, topic) if b["partition"] == 1] + [
        b for b in _batches(server.database_url, other) if b["partition"] == 1
    ]
    assert [(b["base_offset"], b["control"]) for b in written] == [(0, False), (1, True), (0, False)]
    assert written[1]["xmin"] == written[2]["xmin"], f"not written together: {written}"

    def committed_values(name: str) -> list[str]:
        fetched = server.client.post(
            "/v1/fetch",
            json={"isolation_level": "read_committed", "partitions": [{"topic": name, "partition": 1, "offset": 0}]},
        ).json()["partitions"][0]
        return [record["value"] for record in fetched["records"]]

    assert committed_values(topic) == ["ended"]
    assert committed_values(other) == []  # its transaction is still open
    ended = server.client.post("/v1/txn/end", json={**starting, "committed": True})
    assert ended.status_code == 200, ended.text
    assert committed_values(other) == ["open"]


def _transaction_rows(database_url: str, transactional_ids: list[str]) -> dict[str, str]:
    """Each id's `transactions` row's PostgreSQL transaction id (xmin): who wrote it last."""

    async def fetch() -> dict[str, str]:
        conn = await connect(database_url)
        try:
            rows = await conn.fetch(
                "SELECT transactional_id, xmin::text AS xmin FROM transactions "
                "WHERE transactional_id = ANY($1::text[])",
                transactional_ids,
            )
            return {row["transactional_id"]: row["xmin"] for row in rows}
        finally:
            await conn.close()

    return asyncio.run(fetch())


def test_queued_add_partitions_and_add_offsets_are_written_with_the_others_in_their_order(server):
    """AddPartitionsToTxn and AddOffsetsToTxn join the write batches of produce and EndTxn: queued
    together, they are written in one PostgreSQL transaction, in their order of arrival, each
    answered as alone (after the commit: an answered add is durable)."""
    topic = "grouped-adds"
    server.client.post("/v1/topics", json={"name": topic, "partitions": 2}).raise_for_status()
    ending, offsets, added = (_init(server, f"grouped-adds-{name}") for name in ("ending", "offsets", "added"))

    def add(producer: dict, *partitions: tuple[str, int]) -> tuple[str, dict]:
        return "/v1/txn/add-partitions", {
            **producer,
            "partitions": [{"topic": name, "partition": partition} for name, partition in partitions],
        }

    answers = _queue_behind_a_held_group(
        server,
        topic,
        [
            add(ending, (topic, 1)),
            (
                "/v1/produce",
                {**ending, "partitions": [{"topic": topic, "partition": 1, "base_sequence": 0, "records": [{}]}]},
            ),
            ("/v1/txn/end", {**ending, "committed": True}),
            add(ending, (topic, 1)),  # the epoch the EndTxn before it ended
            ("/v1/txn/add-offsets", {**offsets, "group_id": "grouped-adds-group"}),
            add(added, (topic, 1), ("grouped-adds-missing", 0), (topic, 7)),
            add({**added, "transactional_id": "grouped-adds-never-initialized"}, (topic, 1)),
        ],
        in_order=True,
    )
    assert [answer.status_code for answer in answers] == [200, 200, 200, 409, 200, 200, 409], [
        answer.text for answer in answers
    ]
    assert answers[0].json()["partitions"] == [{"topic": topic, "partition": 1, "error": None}]
    assert answers[2].json()["state"] == "CompleteCommit"
    assert answers[3].json()["error"]["code"] == "PRODUCER_FENCED"
    assert [p["error"] and p["error"]["code"] for p in answers[5].json()["partitions"]] == [
        None,
        "UNKNOWN_TOPIC_OR_PARTITION",
        "UNKNOWN_TOPIC_OR_PARTITION",
    ]
    assert answers[6].json()["error"]["code"] == "INVALID_PRODUCER_ID_MAPPING"

    written = _transaction_rows(server.database_url, [p["transactional_id"] for p in (ending, offsets, added)])
    assert len(set(written.values())) == 1, f"the queued requests were not written together: {written}"
    described = {
        p["transactional_id"]: server.client.get(f"/v1/transactions/{p['transactional_id']}").json()
        for p in (ending, offsets, added)
    }
    assert described[ending["transactional_id"]]["state"] == "CompleteCommit"
    assert described[offsets["transactional_id"]]["groups"] == ["grouped-adds-group"]
    assert [p["topic"] for p in described[offsets["transactional_id"]]["partitions"]] == ["__consumer_offsets"]
    assert described[added["transactional_id"]]["state"] == "Ongoing"
    assert [(p["topic"], p["partition"]) for p in described[added["transactional_id"]]["partitions"]] == [(topic, 1)]
    markers = server.client.get(f"/v1/topics/{topic}/partitions/1/markers").json()["markers"]
    assert [(m["producer_id"], m["type"]) for m in markers] == [(ending["producer_id"], "COMMIT")]
