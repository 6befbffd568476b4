"""Regression tests for the correctness holes of issue 11, each over real HTTP against a real
PostgreSQL: producer-state expiry by the server's append time, a committed offset that went
backwards, transactional offset commits that belong to their transaction in __consumer_offsets,
requests that refused everything but still began a transaction, audit entries written apart from
the change they record, and a fetch racing a topic delete."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from app.coordinator.group_coordinator import GroupCoordinator
from app.coordinator.transaction_coordinator import TransactionCoordinator
from app.coordinator.workers import BackgroundWorkers
from app.storage.database import create_pool
from app.storage.log import fetching
from app.storage.log.append_notifier import AppendNotifier
from app.storage.log.fetching import FetchPosition
from app.storage.replication_barrier import ReplicationBarrier


def run_producer_expiry(running) -> None:
    """One run of the server's producer-state expiry worker, with the server's settings, on a pool
    of its own (the same code the background worker runs, without waiting for its interval)."""

    async def expire():
        pool = await create_pool(running.database_url, 2)
        try:
            coordinator = TransactionCoordinator(pool, running.settings)
            workers = BackgroundWorkers(coordinator, GroupCoordinator(pool, coordinator), running.settings)
            await workers.expire_producers()
        finally:
            await pool.close()

    asyncio.run(expire())


def create_topic(client, name: str, partitions: int = 1) -> None:
    response = client.post("/v1/topics", json={"name": name, "partitions": partitions})
    assert response.status_code == 201, response.text


def produce(
    client,
    producer: dict,
    topic: str,
    partition: int,
    sequence: int,
    values: list[str],
    timestamp_ms: int | None = None,
) -> dict:
    records = [{"value": v} if timestamp_ms is None else {"value": v, "timestamp_ms": timestamp_ms} for v in values]
    response = client.post(
        "/v1/produce",
        json={
            **producer,
            "partitions": [{"topic": topic, "partition": partition, "base_sequence": sequence, "records": records}],
        },
    )
    assert response.status_code == 200, response.text
    return response.json()["partitions"][0]


def read_values(client, topic: str, partition: int = 0, isolation: str = "read_committed") -> list:
    response = client.post(
        "/v1/fetch",
        json={
            "isolation_level": isolation,
            "max_records": 10_000,
            "partitions": [{"topic": topic, "partition": partition, "offset": 0}],
        },
    )
    assert response.status_code == 200, response.text
    return [record["value"] for record in response.json()["partitions"][0]["records"]]


def init_transactional(client, transactional_id: str) -> dict:
    response = client.post(
        "/v1/producers/init", json={"transactional_id": transactional_id, "transaction_timeout_ms": 60_000}
    )
    assert response.status_code == 200, response.text
    return {"transactional_id": transactional_id, **response.json()}


def txn_state(client, transactional_id: str) -> str:
    return client.get(f"/v1/transactions/{transactional_id}").json()["state"]


def fetch_offset(client, group: str, topic: str, partition: int = 0) -> int:
    response = client.post(
        f"/v1/groups/{group}/offsets/fetch", json={"partitions": [{"topic": topic, "partition": partition}]}
    )
    assert response.status_code == 200, response.text
    return response.json()["offsets"][0]["offset"]


# ---- item 1: producer-state expiry


def test_a_backfilled_timestamp_does_not_expire_the_producer_state(make_server):
    """The client's record timestamp is not when the server last heard from the producer: state
    written just now, with records stamped in 1970, must survive an expiry run, so the retry of
    that batch is still recognised as a duplicate."""
    running = make_server(producer_id_expiration_ms=3_600_000)
    client = running.client
    create_topic(client, "backfill")
    producer = client.post("/v1/producers/init", json={}).json()
    first = produce(client, producer, "backfill", 0, 0, ["old-1", "old-2"], timestamp_ms=1_000)
    assert first["error"] is None and first["duplicate"] is False
    run_producer_expiry(running)
    retry = produce(client, producer, "backfill", 0, 0, ["old-1", "old-2"], timestamp_ms=1_000)
    assert retry["error"] is None
    assert retry["duplicate"] is True and retry["base_offset"] == first["base_offset"]
    assert read_values(client, "backfill", isolation="read_uncommitted") == ["old-1", "old-2"]


def test_a_live_producer_keeps_its_state_on_a_partition_it_left_idle(make_server):
    """A producer writing partition 1 while partition 0 idles past producer_id_expiration_ms is
    alive: its next batch on partition 0 continues its sequence (no fatal OUT_OF_ORDER)."""
    running = make_server(producer_id_expiration_ms=1_000)
    client = running.client
    create_topic(client, "idle-partition", partitions=2)
    producer = client.post("/v1/producers/init", json={}).json()
    assert produce(client, producer, "idle-partition", 0, 0, ["a"])["error"] is None
    time.sleep(1.3)  # partition 0 idles past the expiration time...
    assert produce(client, producer, "idle-partition", 1, 0, ["b"])["error"] is None  # ...the producer does not
    run_producer_expiry(running)
    entry = produce(client, producer, "idle-partition", 0, 1, ["c"])
    assert entry["error"] is None and entry["duplicate"] is False
    assert read_values(client, "idle-partition", 0, "read_uncommitted") == ["a", "c"]


def test_a_producer_idle_everywhere_expires_whole_and_is_told_so(make_server):
    """Idle everywhere past the expiration: its state and its id go together, and its next batch
    gets UNKNOWN_PRODUCER_ID (the SDK then takes a new id), never OUT_OF_ORDER_SEQUENCE_NUMBER."""
    running = make_server(producer_id_expiration_ms=1_000)
    client = running.client
    create_topic(client, "idle-producer")
    producer = client.post("/v1/producers/init", json={}).json()
    assert produce(client, producer, "idle-producer", 0, 0, ["a"])["error"] is None
    time.sleep(1.3)
    run_producer_expiry(running)
    response = client.post(
        "/v1/produce",
        json={
            **producer,
            "partitions": [{"topic": "idle-producer", "partition": 0, "base_sequence": 1, "records": [{"value": "b"}]}],
        },
    )
    assert response.status_code == 409 and response.json()["error"]["code"] == "UNKNOWN_PRODUCER_ID"


def test_the_sdk_producer_recovers_after_its_id_expired(make_server):
    from txbroker import Producer

    running = make_server(producer_id_expiration_ms=1_000)
    create_topic(running.client, "sdk-expired")
    producer = Producer(url=running.url, enable_idempotence=True)
    try:
        producer.send("sdk-expired", value=b"one", partition=0).result(timeout=30)
        time.sleep(1.3)
        run_producer_expiry(running)
        producer.send("sdk-expired", value=b"two", partition=0).result(timeout=30)
        producer.flush()
    finally:
        producer.close()
    assert read_values(running.client, "sdk-expired", isolation="read_uncommitted") == ["one", "two"]


# ---- item 3: the commit appended last wins


def test_a_plain_commit_after_a_pending_transactional_one_is_not_overwritten(server):
    client = server.client
    create_topic(client, "backwards")
    producer = init_transactional(client, "backwards-app")
    response = client.post(
        "/v1/txn/offset-commit",
        json={
            "transactional_id": "backwards-app",
            "group_id": "backwards-group",
            "producer_id": producer["producer_id"],
            "producer_epoch": producer["producer_epoch"],
            "offsets": [{"topic": "backwards", "partition": 0, "offset": 5}],
        },
    )
    assert response.status_code == 200 and response.json()["offsets"][0]["error"] is None, response.text
    response = client.post(
        "/v1/groups/backwards-group/offsets/commit",
        json={"offsets": [{"topic": "backwards", "partition": 0, "offset": 10}]},
    )
    assert response.status_code == 200, response.text
    response = client.post(
        "/v1/txn/end",
        json={
            "transactional_id": "backwards-app",
            "producer_id": producer["producer_id"],
            "producer_epoch": producer["producer_epoch"],
            "committed": True,
        },
    )
    assert response.status_code == 200, response.text
    assert fetch_offset(client, "backwards-group", "backwards") == 10


def test_a_transactional_commit_appended_after_a_plain_one_wins_at_its_commit(server):
    client = server.client
    create_topic(client, "forwards")
    client.post(
        "/v1/groups/forwards-group/offsets/commit",
        json={"offsets": [{"topic": "forwards", "partition": 0, "offset": 10}]},
    ).raise_for_status()
    producer = init_transactional(client, "forwards-app")
    client.post(
        "/v1/txn/offset-commit",
        json={
            "transactional_id": "forwards-app",
            "group_id": "forwards-group",
            "producer_id": producer["producer_id"],
            "producer_epoch": producer["producer_epoch"],
            "offsets": [{"topic": "forwards", "partition": 0, "offset": 7}],
        },
    ).raise_for_status()
    assert fetch_offset(client, "forwards-group", "forwards") == 10
    client.post(
        "/v1/txn/end",
        json={
            "transactional_id": "forwards-app",
            "committed": True,
            "producer_id": producer["producer_id"],
            "producer_epoch": producer["producer_epoch"],
        },
    ).raise_for_status()
    assert fetch_offset(client, "forwards-group", "forwards") == 7


# ---- item 5: offsets records belong to their transaction


def _offsets_partition_of(client, transactional_id: str) -> int:
    partitions = client.get(f"/v1/transactions/{transactional_id}").json()["partitions"]
    return next(p["partition"] for p in partitions if p["topic"] == "__consumer_offsets")


def test_a_read_committed_reader_of_consumer_offsets_never_sees_an_aborted_commit(server):
    client = server.client
    create_topic(client, "eos-src")
    producer = init_transactional(client, "aborter")
    ids = {
        "transactional_id": "aborter",
        "producer_id": producer["producer_id"],
        "producer_epoch": producer["producer_epoch"],
    }
    client.post(
        "/v1/txn/offset-commit",
        json={**ids, "group_id": "aborted-group", "offsets": [{"topic": "eos-src", "partition": 0, "offset": 42}]},
    ).raise_for_status()
    partition = _offsets_partition_of(client, "aborter")
    # Open: its commit record pins the partition's LSO, like any transactional write.
    assert read_values(client, "__consumer_offsets", partition) == []
    assert len(read_values(client, "__consumer_offsets", partition, "read_uncommitted")) == 1
    client.post("/v1/txn/end", json={**ids, "committed": False}).raise_for_status()
    assert read_values(client, "__consumer_offsets", partition) == []
    assert fetch_offset(client, "aborted-group", "eos-src") == -1
    # A committed one is read back.
    producer = init_transactional(client, "aborter")
    ids = {
        "transactional_id": "aborter",
        "producer_id": producer["producer_id"],
        "producer_epoch": producer["producer_epoch"],
    }
    client.post(
        "/v1/txn/offset-commit",
        json={**ids, "group_id": "aborted-group", "offsets": [{"topic": "eos-src", "partition": 0, "offset": 43}]},
    ).raise_for_status()
    client.post("/v1/txn/end", json={**ids, "committed": True}).raise_for_status()
    visible = read_values(client, "__consumer_offsets", partition)
    assert len(visible) == 1 and '"offset":43' in visible[0]
    assert fetch_offset(client, "aborted-group", "eos-src") == 43


# ---- item 5: refused requests do not begin a transaction


def test_add_partitions_with_only_invalid_partitions_begins_no_transaction(server):
    client = server.client
    create_topic(client, "only-one")
    producer = init_transactional(client, "refused-adds")
    response = client.post(
        "/v1/txn/add-partitions",
        json={
            **producer,
            "partitions": [{"topic": "no-such-topic", "partition": 0}, {"topic": "only-one", "partition": 7}],
        },
    )
    assert response.status_code == 200, response.text
    assert [p["error"]["code"] for p in response.json()["partitions"]] == ["UNKNOWN_TOPIC_OR_PARTITION"] * 2
    described = client.get("/v1/transactions/refused-adds").json()
    assert described["state"] == "Empty" and described["start_time_ms"] == -1


def test_a_txn_offset_commit_refused_for_its_generation_begins_no_transaction(server):
    client = server.client
    create_topic(client, "gen-src")
    member = client.post("/v1/groups/gen-group/heartbeat", json={"topics": ["gen-src"]}).json()
    producer = init_transactional(client, "zombie-copier")
    response = client.post(
        "/v1/txn/offset-commit",
        json={
            **producer,
            "group_id": "gen-group",
            "member_id": member["member_id"],
            "generation_id": member["generation_id"] + 1,
            "offsets": [{"topic": "gen-src", "partition": 0, "offset": 3}],
        },
    )
    assert response.status_code == 200, response.text
    assert response.json()["offsets"][0]["error"]["code"] == "ILLEGAL_GENERATION"
    described = client.get("/v1/transactions/zombie-copier").json()
    assert described["state"] == "Empty" and described["groups"] == [] and described["partitions"] == []


# ---- item 5: the audit entry is part of the change it records


async def _make_audit_fail(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("""
            CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS
            $$ BEGIN RAISE EXCEPTION 'audit log unavailable (test)'; END $$;
            CREATE TRIGGER refuse_audit BEFORE INSERT ON audit_log FOR EACH ROW EXECUTE FUNCTION refuse_audit();
        """)
    finally:
        await conn.close()


def test_a_change_whose_audit_entry_fails_is_not_made(server):
    """Topic create and delete and admin abort write their audit entry in the PostgreSQL transaction
    of the change: if the entry cannot be written, nothing was changed (and a failure answer is true)."""
    client = server.client
    create_topic(client, "kept")
    producer = init_transactional(client, "kept-open")
    client.post(
        "/v1/txn/add-partitions", json={**producer, "partitions": [{"topic": "kept", "partition": 0}]}
    ).raise_for_status()
    asyncio.run(_make_audit_fail(server.database_url))

    assert client.post("/v1/topics", json={"name": "unaudited", "partitions": 1}).status_code >= 500
    assert client.get("/v1/topics/unaudited").status_code == 404
    assert client.delete("/v1/topics/kept").status_code >= 500
    assert client.get("/v1/topics/kept").status_code == 200
    assert client.post("/v1/transactions/kept-open/abort").status_code >= 500
    assert txn_state(client, "kept-open") == "Ongoing"


def test_the_console_abort_is_audited_in_the_same_transaction(server):
    client = server.client
    create_topic(client, "console-kept")
    producer = init_transactional(client, "console-open")
    client.post(
        "/v1/txn/add-partitions", json={**producer, "partitions": [{"topic": "console-kept", "partition": 0}]}
    ).raise_for_status()
    page = client.get("/console/transactions/console-open")
    assert page.status_code == 200
    asyncio.run(_make_audit_fail(server.database_url))
    form = {
        "producer_id": str(producer["producer_id"]),
        "producer_epoch": str(producer["producer_epoch"]),
        "start_time_ms": str(client.get("/v1/transactions/console-open").json()["start_time_ms"]),
    }
    response = client.post("/console/transactions/console-open/abort", data=form, follow_redirects=False)
    assert response.status_code >= 500, response.text
    assert txn_state(client, "console-open") == "Ongoing"


# ---- item 5: a fetch racing a topic delete


class _DeleteBeforePayloads:
    """A connection that deletes the topic (from another connection, committed) just before the
    fetch reads the payloads of the batch headers it has already read: the interleaving that made
    a fetch fail with a KeyError (500)."""

    def __init__(self, conn: asyncpg.Connection, database_url: str, topic: str) -> None:
        self._conn, self._database_url, self._topic, self.deleted = conn, database_url, topic, False

    def __getattr__(self, name):
        return getattr(self._conn, name)

    async def fetch(self, query: str, *args):
        if not self.deleted and "SELECT last_offset, records" in query:
            other = await asyncpg.connect(self._database_url)
            try:
                await other.execute("DELETE FROM topics WHERE name = $1", self._topic)
                await other.execute("DELETE FROM record_batches WHERE topic_id = $1", args[0])
            finally:
                await other.close()
            self.deleted = True
        return await self._conn.fetch(query, *args)


class _Pool:
    def __init__(self, pool, wrap) -> None:
        self._pool, self._wrap = pool, wrap

    def acquire(self):
        pool, wrap = self._pool, self._wrap

        class _Acquire:
            async def __aenter__(self):
                self._cm = pool.acquire()
                return wrap(await self._cm.__aenter__())

            async def __aexit__(self, *exc):
                return await self._cm.__aexit__(*exc)

        return _Acquire()


def test_a_fetch_racing_a_topic_delete_answers_without_a_server_error(server):
    client = server.client
    create_topic(client, "vanishing")
    client.post("/v1/topics/vanishing/records", json={"partition": 0, "records": [{"value": "v"}]}).raise_for_status()

    async def race() -> list:
        pool = await create_pool(server.database_url, 2)
        notifier = AppendNotifier(server.database_url, 1.0)
        try:
            wrapped = []

            def wrap(conn):
                wrapped.append(_DeleteBeforePayloads(conn, server.database_url, "vanishing"))
                return wrapped[-1]

            return await fetching.fetch(
                _Pool(pool, wrap),
                notifier,
                ReplicationBarrier(pool),
                [FetchPosition("vanishing", 0, 0)],
                "read_uncommitted",
                100,
                0,
                "utf8",
            )
        finally:
            await pool.close()

    [result] = asyncio.run(race())
    # Read in one snapshot: either the records as they were, or the partition's error; never a KeyError.
    assert (result.error is None and [r["value"] for r in result.records] == ["v"]) or (
        result.error is not None and result.error.code.name == "UNKNOWN_TOPIC_OR_PARTITION"
    )


def test_a_produce_racing_the_expiry_of_its_producer_gets_unknown_producer_id(server):
    """The expiry commits between the request's check of the producer id and its lock of the
    partition: the batch finds no state and a sequence past 0. That is the producer's id expiring
    (UNKNOWN_PRODUCER_ID, recoverable), not a gap (OUT_OF_ORDER_SEQUENCE_NUMBER, fatal)."""
    import threading

    client = server.client
    create_topic(client, "raced")
    producer = client.post("/v1/producers/init", json={}).json()
    assert produce(client, producer, "raced", 0, 0, ["a"])["error"] is None
    answers = []

    async def interleave():
        conn = await asyncpg.connect(server.database_url)
        watcher = await asyncpg.connect(server.database_url)
        try:
            async with conn.transaction():
                await conn.execute(
                    "SELECT 1 FROM partitions p JOIN topics t USING (topic_id) "
                    "WHERE t.name = 'raced' AND p.partition = 0 FOR UPDATE OF p"
                )
                sender = threading.Thread(
                    target=lambda: answers.append(
                        client.post(
                            "/v1/produce",
                            json={
                                **producer,
                                "partitions": [
                                    {"topic": "raced", "partition": 0, "base_sequence": 1, "records": [{"value": "b"}]}
                                ],
                            },
                        )
                    )
                )
                sender.start()
                # Wait until the produce waits for the partition's lock (it checked the id already).
                # Asked outside this transaction: pg_stat_activity is a snapshot within one.
                while not await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE%' AND pid <> $1",
                    conn.get_server_pid(),
                ):
                    await asyncio.sleep(0.01)
                # The expiry, as the worker runs it: the id first, then its state.
                await conn.execute("DELETE FROM producer_ids WHERE producer_id = $1", producer["producer_id"])
                await conn.execute("DELETE FROM producer_states WHERE producer_id = $1", producer["producer_id"])
            await asyncio.to_thread(sender.join, 30)
        finally:
            await conn.close()
            await watcher.close()

    asyncio.run(interleave())
    [response] = answers
    assert response.status_code == 200, response.text
    assert response.json()["partitions"][0]["error"]["code"] == "UNKNOWN_PRODUCER_ID"
    assert read_values(client, "raced", isolation="read_uncommitted") == ["a"]
