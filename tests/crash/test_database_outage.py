"""PostgreSQL stopped under a running node (not failed over: the same server comes back on the same
socket): every request answers 503 COORDINATOR_NOT_AVAILABLE with `retriable: true` in the
contract's error format, never a 500; /v1/health says `"database": "unreachable"`; no process of
the node exits (its background workers keep retrying); and once PostgreSQL is back the same
processes serve again and their background workers run, without a restart.

The PostgreSQL is the test's own (started with the launcher the server uses), not the session's,
since the test stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import threading
import time
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from app.runtime.embedded_postgres import EmbeddedPostgres
from app.storage.database import PROBE_APPLICATION_NAME, PROBE_TIMEOUT_S
from tests.concurrency.test_transaction_concurrency import (
    _create_topic,
    _end,
    _init,
    _produce,
    _values,
    _wait_for_state,
)
from tests.conftest import ServerProcess, process_alive


def _health(url: str) -> httpx.Response:
    return httpx.get(f"{url}/v1/health", timeout=30)


def _wait_for_health(url: str, database: str, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        body = _health(url).json()
        if body["database"] == database:
            return body
        assert time.monotonic() < deadline, f"/v1/health still says {body}, expected database {database!r}"
        time.sleep(0.1)


def _assert_retriable_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json() == {
        "error": {
            "code": "COORDINATOR_NOT_AVAILABLE",
            "message": response.json()["error"]["message"],
            "retriable": True,
        }
    }


# Two workers: every worker of the node (each with its pool) meets the outage; one worker is that case's subset.
@pytest.mark.parametrize("workers", [2])
def test_a_node_survives_postgresql_stopped_and_serves_again_when_it_returns(own_postgres, server_process, workers):
    server = server_process(
        "--database-url",
        own_postgres.database_url,
        "--workers",
        str(workers),
        env={"TXBROKER_ABORT_TIMED_OUT_TRANSACTION_INTERVAL_MS": "100", "TXBROKER_LOG_CLEANER_INTERVAL_MS": "100"},
    )
    with httpx.Client(base_url=server.url, timeout=30) as client:
        _create_topic(client, "outage", 2)
        producer_id, epoch = _init(client, "outage-txn")
        assert _produce(client, producer_id, epoch, [("outage", 0, 0, ["before"])], "outage-txn").status_code == 200
        assert _end(client, "outage-txn", producer_id, epoch, commit=True).status_code == 200

        own_postgres.stop()
        health = _health(server.url)
        assert health.status_code == 503
        assert health.json() == {"status": "unavailable", "database": "unreachable"}
        # Reads, writes and transactions alike; each several times, so that every worker of the
        # node (each with its own pool) is asked, and the background workers meet the outage too.
        for _ in range(3 * workers):
            _assert_retriable_unavailable(client.get("/v1/cluster"))
            _assert_retriable_unavailable(_produce(client, producer_id, epoch, [("outage", 1, 0, ["lost?"])]))
            _assert_retriable_unavailable(
                client.post(
                    "/v1/producers/init", json={"transactional_id": "outage-txn", "transaction_timeout_ms": 1000}
                )
            )
            _assert_retriable_unavailable(_end(client, "outage-txn", producer_id, epoch, commit=True))
        assert process_alive(server.pid), "the node exited while PostgreSQL was away"
        # The node's counters are still scraped (the 503s just answered among them); the partitions'
        # gauges, read from PostgreSQL, are left out. Before, the scrape itself answered 503.
        scrape = client.get("/metrics")
        assert scrape.status_code == 200, scrape.text
        assert re.search(
            r'^txbroker_http_requests_total\{method="POST",route="/v1/produce",status="503"\} ', scrape.text, re.M
        )
        assert "txbroker_partition_high_watermark{" not in scrape.text

        own_postgres.start()  # the same data dir, so the same socket: the node finds it again
        _wait_for_health(server.url, "ok")
        assert process_alive(server.pid) and server.process.poll() is None
        assert 'txbroker_partition_high_watermark{partition="0",topic="outage"} 2.0' in client.get("/metrics").text
        assert _values(client, "outage", 0, "read_committed") == ["before"]

        # The background workers still run: a transaction left open past its timeout is aborted
        # by the timeout worker, with no request from the client.
        producer_id, epoch = _init(client, "abandoned", timeout_ms=500)
        assert _produce(client, producer_id, epoch, [("outage", 1, 0, ["abandoned"])], "abandoned").status_code == 200
        _wait_for_state(client, "abandoned", {"CompleteAbort"}, timeout_s=30)
    server_log = server.log_path.read_text()
    assert "failed with a bug" not in server_log, server_log[-5000:]  # every 500 is logged so


# Requests that each hold a pooled connection while they wait for a partition's row lock: DeleteRecords
# locks the partition in a transaction of its own per request (a produce would too, but concurrent
# produces share one write batch, so one connection).
def _delete_records(http: httpx.AsyncClient, topic: str):
    return http.post(f"/v1/topics/{topic}/delete-records", json={"partitions": [{"partition": 0, "offset": 0}]})


@contextlib.asynccontextmanager
async def pooled_connections_held(
    database_url: str, http: httpx.AsyncClient, topic: str, requests: int, held: int
) -> AsyncIterator[tuple[list[asyncio.Task], asyncpg.Connection]]:
    """`requests` DeleteRecords of `topic`'s partition 0 sent, waiting on its row lock (taken here, from
    a connection of the test's own) until `held` of them hold a pooled connection each; yields their
    tasks and a connection to observe PostgreSQL with. The lock is let go on leaving: the requests
    then end (their tasks are the caller's to await)."""
    blocker = await asyncpg.connect(database_url)
    observer = await asyncpg.connect(database_url)
    try:
        holder = blocker.transaction()
        await holder.start()
        await blocker.execute(
            "SELECT 1 FROM partitions p JOIN topics t USING (topic_id) "
            "WHERE t.name = $1 AND p.partition = 0 FOR UPDATE OF p",
            topic,
        )
        waiting = [asyncio.create_task(_delete_records(http, topic)) for _ in range(requests)]
        deadline = time.monotonic() + 30
        while (
            await observer.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE%'"
            )
            < held
        ):
            assert time.monotonic() < deadline, "the requests never held every pooled connection"
            await asyncio.sleep(0.02)
        yield waiting, observer
        await holder.rollback()
    finally:
        await blocker.close()
        await observer.close()


def test_health_is_ok_while_every_pooled_connection_is_busy_and_unreachable_only_when_postgresql_stops(
    own_postgres, server_process
):
    """/v1/health asks PostgreSQL on a connection of its own: a node whose every pooled connection
    is busy for longer than the health check's timeout (requests waiting on a row lock, as under
    load) answers 200 with `"database": "ok"`, at once, so a load balancer does not take the busiest
    nodes out. Before, the check waited 2 s for a pooled connection and answered 503 "unreachable".
    A flood of checks shares one question on one connection. PostgreSQL stopped is still 503
    "unreachable" within the check's timeout, and 200 once it is back."""
    pool_size = 2
    server = server_process(
        "--database-url",
        own_postgres.database_url,
        "--workers",
        "1",
        env={"TXBROKER_DATABASE_POOL_SIZE": str(pool_size)},
    )
    with httpx.Client(base_url=server.url, timeout=30) as client:
        _create_topic(client, "busy", 1)

    async def busy_then_stopped() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            # One more than the pool holds: the last waits for a connection.
            async with pooled_connections_held(own_postgres.database_url, http, "busy", pool_size + 1, pool_size) as (
                waiting,
                observer,
            ):
                for _ in range(3):
                    started = time.monotonic()
                    health = await http.get("/v1/health")
                    assert (health.status_code, health.json()) == (200, {"status": "ok", "database": "ok"})
                    assert time.monotonic() - started < PROBE_TIMEOUT_S, "the check waited for a pooled connection"
                flood = await asyncio.gather(*(http.get("/v1/health") for _ in range(50)))
                assert {response.status_code for response in flood} == {200}
                probes = await observer.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", PROBE_APPLICATION_NAME
                )
                assert probes == 1, f"{probes} connections of the health probe, expected the one of the node's worker"
                assert not any(request.done() for request in waiting), "the pool was not busy all along"
            for answer in await asyncio.gather(*waiting):
                assert answer.status_code == 200, answer.text

            own_postgres.stop()
            started = time.monotonic()
            health = await http.get("/v1/health")
            assert (health.status_code, health.json()) == (503, {"status": "unavailable", "database": "unreachable"})
            assert time.monotonic() - started < PROBE_TIMEOUT_S + 1
        own_postgres.start()

    asyncio.run(busy_then_stopped())
    _wait_for_health(server.url, "ok")
    assert _health(server.url).status_code == 200
    server_log = server.log_path.read_text()
    assert "PostgreSQL does not answer the health probe" in server_log, server_log[-5000:]
    assert "failed with a bug" not in server_log, server_log[-5000:]


def _as_superuser(postgres: EmbeddedPostgres, *statements: str) -> None:
    async def run():
        connection = await asyncpg.connect(postgres.database_url)
        try:
            for statement in statements:
                await connection.execute(statement)
        finally:
            await connection.close()

    asyncio.run(run())


def test_a_database_turned_read_only_answers_503_retriable_until_it_takes_writes_again(own_postgres, server_process):
    """SQLSTATE 25006 ("cannot execute ... in a read-only transaction") is what a request meets on
    a server that became a standby or was set read-only (a managed service's full disk, a demoted
    primary behind a DNS name): it is retriable, and the node writes again once the server does,
    on fresh connections (a read-only one is not kept in the pool). /v1/health answers 503
    "unreachable" meanwhile, as it does while no host of the URL is the primary."""
    server = server_process("--database-url", own_postgres.database_url, "--workers", "1")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        _create_topic(client, "read-only", 1)
        producer_id, epoch = _init(client, None)
        assert _produce(client, producer_id, epoch, [("read-only", 0, 0, ["before"])]).status_code == 200
        written, sequence = ["before"], 1

        # Applies to the sessions already open too (a reload), as a demotion would.
        _as_superuser(own_postgres, "ALTER SYSTEM SET default_transaction_read_only = on", "SELECT pg_reload_conf()")
        try:
            # Until the pooled connections have seen the reload (asynchronously), a write may still
            # pass: it is acknowledged, so it is in the log, and the next write takes the next
            # sequence (the same one would be answered as its duplicate, writing nothing).
            deadline = time.monotonic() + 30
            while (
                response := _produce(client, producer_id, epoch, [("read-only", 0, sequence, [f"during-{sequence}"])])
            ).status_code == 200:
                written.append(f"during-{sequence}")
                sequence += 1
                assert time.monotonic() < deadline, "the server still takes writes"
                time.sleep(0.05)
            _assert_retriable_unavailable(response)
            refused = _produce(client, producer_id, epoch, [("read-only", 0, sequence, [f"during-{sequence}"])])
            _assert_retriable_unavailable(refused)
            # /v1/health agrees with the pool: a read-only server is not the primary the node needs.
            for _ in range(3):
                health = _health(server.url)
                assert (health.status_code, health.json()) == (
                    503,
                    {"status": "unavailable", "database": "unreachable"},
                )
        finally:
            _as_superuser(
                own_postgres,
                "SET default_transaction_read_only = off",
                "ALTER SYSTEM RESET default_transaction_read_only",
                "SELECT pg_reload_conf()",
            )
        deadline = time.monotonic() + 30
        while (
            response := _produce(client, producer_id, epoch, [("read-only", 0, sequence, ["after"])])
        ).status_code != 200:
            _assert_retriable_unavailable(response)
            assert time.monotonic() < deadline, response.text
            time.sleep(0.05)
        # Nothing refused was written: the acknowledged writes, in order, and no other.
        assert _values(client, "read-only", 0, "read_committed") == [*written, "after"]
        _wait_for_health(server.url, "ok")
        assert process_alive(server.pid)
    server_log = server.log_path.read_text()
    assert "failed with a bug" not in server_log, server_log[-5000:]


def test_a_node_started_while_postgresql_is_down_starts_once_it_is_back(own_postgres):
    """A node (re)started during an outage waits for PostgreSQL instead of exiting (a service
    manager would otherwise restart it in a loop, or give up)."""
    own_postgres.stop()
    server = ServerProcess("--database-url", own_postgres.database_url, "--workers", "1")
    starting = threading.Thread(target=server.start)
    try:
        starting.start()
        deadline = time.monotonic() + 60
        while "PostgreSQL is unreachable" not in server.log_path.read_text():
            assert server.process is None or server.process.poll() is None, server.log_path.read_text()
            assert time.monotonic() < deadline, server.log_path.read_text()
            time.sleep(0.05)
        # Started here (not in a helper thread): the launcher ties PostgreSQL to its thread.
        own_postgres.start()
        starting.join(timeout=90)
        assert not starting.is_alive() and server.process.poll() is None, server.log_path.read_text()
        with httpx.Client(base_url=server.url, timeout=30) as client:
            _create_topic(client, "late", 1)
            producer_id, epoch = _init(client, None)
            assert _produce(client, producer_id, epoch, [("late", 0, 0, ["served"])]).status_code == 200
            assert _values(client, "late", 0, "read_committed") == ["served"]
    finally:
        starting.join(timeout=90)
        server.close()


def _create_scraper_principal(admin: httpx.Client) -> None:
    """The principal "prometheus", allowed what a scrape needs (Describe on the Cluster)."""
    admin.post("/v1/principals", json={"name": "prometheus"}).raise_for_status()
    admin.post(
        "/v1/acls",
        json={
            "principal": "prometheus",
            "resource_type": "Cluster",
            "resource_name": "txbroker-cluster",
            "operation": "Describe",
            "permission": "allow",
            "pattern_type": "literal",
        },
    ).raise_for_status()


def test_a_scrape_with_auth_required_is_answered_while_postgresql_is_away(own_postgres, server_process):
    """With `auth` required, a scrape's key is checked in PostgreSQL; while it is away, a key this
    worker found valid lately is believed, so the counters (the 503s) are still scraped. A key never
    checked, or found revoked, is not: 503 while PostgreSQL cannot tell, 401 once it can."""
    admin_token = "scrape-outage-admin"
    server = server_process(
        "--database-url",
        own_postgres.database_url,
        env={"TXBROKER_AUTH": "required", "TXBROKER_ADMIN_TOKEN": admin_token},
    )

    def scrape(token: str) -> httpx.Response:
        return httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30)

    admin = {"Authorization": f"Bearer {admin_token}"}
    with httpx.Client(base_url=server.url, headers=admin, timeout=30) as client:
        _create_scraper_principal(client)
        scraper = client.post("/v1/principals/prometheus/keys").json()["token"]
        unscraped = client.post("/v1/principals/prometheus/keys").json()["token"]
        revoked = client.post("/v1/principals/prometheus/keys").json()
        assert scrape(scraper).status_code == 200
        assert scrape(revoked["token"]).status_code == 200
        client.delete(f"/v1/principals/prometheus/keys/{revoked['key_id']}").raise_for_status()
        assert scrape(revoked["token"]).status_code == 401  # checked again at each scrape PostgreSQL answers

        own_postgres.stop()
        _assert_retriable_unavailable(client.get("/v1/cluster"))
        answered = scrape(scraper)
        assert answered.status_code == 200, answered.text
        assert re.search(
            r'^txbroker_http_requests_total\{method="GET",route="/v1/cluster",status="503"\} ', answered.text, re.M
        )
        _assert_retriable_unavailable(scrape(unscraped))  # never found valid: not believed
        _assert_retriable_unavailable(scrape(revoked["token"]))
        _assert_retriable_unavailable(scrape("never-a-key"))

        own_postgres.start()
        _wait_for_health(server.url, "ok")
        assert scrape(unscraped).status_code == 200
        assert scrape(revoked["token"]).status_code == 401
        assert scrape("never-a-key").status_code == 401


def test_a_key_found_revoked_is_not_believed_on_the_word_of_a_check_that_began_before(database_url, server_process):
    """A scrape's check of its key that began before the key was revoked, and ended after another
    scrape of this worker found it revoked, must not make the worker believe the key again: with
    every pooled connection busy (PostgreSQL cannot check the key within the scrape's wait), the
    revoked key was answered 200. Here the first check is held between its two statements (the key's
    row, then its ACL rules) by a lock on the ACL table, and the pool (2 connections) is then filled
    by scrapes held the same way."""
    admin_token = "scrape-race-admin"
    server = server_process(
        "--database-url",
        database_url,
        env={"TXBROKER_AUTH": "required", "TXBROKER_ADMIN_TOKEN": admin_token, "TXBROKER_DATABASE_POOL_SIZE": "2"},
    )

    def scrape(token: str) -> httpx.Response:
        return httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=60)

    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=30) as admin:
        _create_scraper_principal(admin)
        revoked = admin.post("/v1/principals/prometheus/keys").json()
        filler = admin.post("/v1/principals/prometheus/keys").json()["token"]

    answers: dict[str, list[int]] = {"held": [], "fillers": []}

    def scrape_into(name: str, token: str) -> threading.Thread:
        thread = threading.Thread(target=lambda: answers[name].append(scrape(token).status_code))
        thread.start()
        return thread

    async def scenario() -> None:
        locker = await asyncpg.connect(database_url)
        observer = await asyncpg.connect(database_url)

        async def held_on_acls(count: int) -> None:
            waiting = (
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%FROM acls%'"
            )
            deadline = time.monotonic() + 30
            while await observer.fetchval(waiting) < count:
                assert time.monotonic() < deadline, "the scrapes' checks did not reach the ACL table's lock"
                await asyncio.sleep(0.05)

        try:
            locker_txn = locker.transaction()
            await locker_txn.start()
            await locker.execute("LOCK TABLE acls IN ACCESS EXCLUSIVE MODE")
            held = scrape_into("held", revoked["token"])  # finds the key's row, then waits for the ACLs
            await held_on_acls(1)
            # Revoked now (as DELETE .../keys/{id} does; the API's own check of the admin would wait on the lock too).
            await observer.execute(
                "UPDATE api_keys SET revoked_ms = $1 WHERE token_sha256 = $2",
                int(time.time() * 1000),
                hashlib.sha256(revoked["token"].encode()).digest(),
            )
            # The pool's other connection: PostgreSQL says the key is revoked (no ACL read for it).
            assert (await asyncio.to_thread(scrape, revoked["token"])).status_code == 401
            await locker_txn.commit()  # the first check goes on, with the key's row it read before
            await asyncio.to_thread(held.join, 60)
            assert answers["held"] == [200]  # its check began while the key was valid

            locker_txn = locker.transaction()
            await locker_txn.start()
            await locker.execute("LOCK TABLE acls IN ACCESS EXCLUSIVE MODE")
            fillers = [scrape_into("fillers", filler) for _ in range(2)]
            await held_on_acls(2)  # both pooled connections are busy: no check within the scrape's wait
            answered = await asyncio.to_thread(scrape, revoked["token"])
            await locker_txn.commit()
            for thread in fillers:
                await asyncio.to_thread(thread.join, 60)
            assert answers["fillers"] == [200, 200]
            assert answered.status_code == 503, f"a key this worker found revoked was believed: {answered.text[:300]}"
            _assert_retriable_unavailable(answered)
        finally:
            await locker.close()
            await observer.close()

    asyncio.run(scenario())
