"""The health probe of /v1/health (app/storage/database.py, ReachabilityProbe), on a real PostgreSQL:
one connection of its own per server process, one question in flight shared by every caller, a lost
connection reopened, a read-only database not reachable, each caller's wait bounded by the timeout.
tests/crash/test_database_outage.py checks it in a node: a busy pool, PostgreSQL stopped, read-only."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from app.storage.database import PROBE_APPLICATION_NAME, PROBE_RECONNECT_INTERVAL_S, ReachabilityProbe


async def _probe_backends(observer: asyncpg.Connection) -> list[int]:
    return [
        row["pid"]
        for row in await observer.fetch(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()",
            PROBE_APPLICATION_NAME,
        )
    ]


async def _until_no_probe_backend(observer: asyncpg.Connection) -> None:
    deadline = time.monotonic() + 10
    while await _probe_backends(observer):
        assert time.monotonic() < deadline, "the probe's connection outlived its close"
        await asyncio.sleep(0.02)


def test_concurrent_callers_share_one_question_on_one_connection_closed_with_the_probe(database_url):
    async def run() -> None:
        observer = await asyncpg.connect(database_url)
        probe = ReachabilityProbe(database_url)
        try:
            assert await asyncio.gather(*(probe.is_reachable() for _ in range(50))) == [True] * 50
            assert probe.questions_asked == 1, "concurrent callers did not share the question in flight"
            for _ in range(5):
                assert await probe.is_reachable()
            assert probe.questions_asked == 6
            assert len(await _probe_backends(observer)) == 1, "the probe opened more than one connection"
        finally:
            await probe.close()
        await _until_no_probe_backend(observer)
        assert not await probe.is_reachable(), "a closed probe answered"
        assert await _probe_backends(observer) == [], "a closed probe connected again"
        await observer.close()

    asyncio.run(run())


def test_a_lost_connection_is_reopened_by_the_next_question(database_url):
    """PostgreSQL ended the probe's session (a restart, an administrator, a failover): the next
    question finds the kept connection broken and asks again on a new one, answering True."""

    async def run() -> None:
        observer = await asyncpg.connect(database_url)
        probe = ReachabilityProbe(database_url)
        try:
            assert await probe.is_reachable()
            [lost] = await _probe_backends(observer)
            assert await observer.fetchval("SELECT pg_terminate_backend($1, 5000)", lost)
            assert await probe.is_reachable()
            [reopened] = await _probe_backends(observer)
            assert reopened != lost
        finally:
            await probe.close()
            await observer.close()

    asyncio.run(run())


def test_a_read_only_database_is_not_reachable_until_it_takes_writes_again(database_url):
    """As the pool, which closes its connections to a read-only server: the probe's answer is False
    there (the read-write server is what txbroker needs), and True again once it takes writes, on a
    new connection tried no sooner than PROBE_RECONNECT_INTERVAL_S after the last that failed."""

    async def run() -> None:
        observer = await asyncpg.connect(database_url)
        database = await observer.fetchval("SELECT current_database()")
        probe = ReachabilityProbe(database_url)
        try:
            assert await probe.is_reachable()
            # New sessions only: the probe's own ends, so that its next connection meets it.
            await observer.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
            [kept] = await _probe_backends(observer)
            await observer.fetchval("SELECT pg_terminate_backend($1, 5000)", kept)
            assert not await probe.is_reachable()
            await observer.execute(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
            refused_at = time.monotonic()
            assert not await probe.is_reachable(), "the probe connected again at once"
            deadline = time.monotonic() + 10
            while not await probe.is_reachable():
                assert time.monotonic() < deadline, "the probe never found the database writable again"
                await asyncio.sleep(0.05)
            assert time.monotonic() - refused_at >= PROBE_RECONNECT_INTERVAL_S * 0.5
        finally:
            await probe.close()
            await observer.close()

    asyncio.run(run())


@pytest.mark.parametrize("callers", [1, 20])
def test_a_database_that_never_answers_is_not_reachable_within_the_timeout(callers):
    """A server that accepts the connection and never answers (a database hung, a silent host):
    each caller hears False once its timeout has passed, and the callers, at once or one after the
    other, share the one attempt in flight: the probe never opens a second connection meanwhile.
    Closed while callers wait, the probe answers them False."""

    async def run() -> None:
        accepted: list[asyncio.StreamWriter] = []

        async def never_answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)

        silent = await asyncio.start_server(never_answer, "127.0.0.1", 0)
        port = silent.sockets[0].getsockname()[1]
        probe = ReachabilityProbe(f"postgresql://txbroker@127.0.0.1:{port}/txbroker", timeout_s=0.3)
        try:
            for _ in range(3):
                started = time.monotonic()
                assert await asyncio.gather(*(probe.is_reachable() for _ in range(callers))) == [False] * callers
                assert 0.25 <= time.monotonic() - started < 2
            assert len(accepted) == 1, f"{len(accepted)} connections opened, expected the one attempt in flight"
            # The server stops while callers wait: they hear False, not the attempt's cancellation.
            waiting = [asyncio.create_task(probe.is_reachable()) for _ in range(callers)]
            await asyncio.sleep(0.05)
            await probe.close()
            assert await asyncio.gather(*waiting) == [False] * callers
        finally:
            await probe.close()
            silent.close()
            for writer in accepted:
                writer.close()

    asyncio.run(run())
