"""InitProducerIds of new transactional ids by one principal racing each other at its quota
(`max_transactional_ids_per_principal`): however they interleave, the principal never holds more
ids than its quota, and an InitProducerId of an id that exists (a racing one created it) is never
refused as a new one.

Deterministic: this test's own PostgreSQL session inserts the rows of the ids the requests create
and keeps its transaction open, so each request, having found no row, goes as far as its own insert
and waits there (an insert waits for an uncommitted one of the same key). Then the session rolls
back, and the requests finish in the order PostgreSQL lets them."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx

from app.storage.database import connect
from tests.api.test_security import ADMIN_TOKEN, new_user, rule
from tests.concurrency.lock_waits import wait_for_lock_waits

QUOTA = 1


async def _placeholder_rows(blocker: asyncpg.Connection, transactional_ids: list[str]) -> None:
    await blocker.executemany(
        "INSERT INTO transactions (transactional_id, producer_id, producer_epoch, state, timeout_ms, txn_start_ms, "
        "last_update_ms, partitions, groups) VALUES ($1, -1, -1, 'Empty', 1000, -1, 0, '[]', '[]')",
        [(transactional_id,) for transactional_id in transactional_ids],
    )


async def _race(server, user: httpx.Client, transactional_ids: list[str]) -> list[httpx.Response]:
    """The InitProducerIds of these ids at once, each parked at its insert, then released."""
    blocker, observer = [await connect(server.database_url) for _ in range(2)]
    try:
        async with blocker.transaction():
            await _placeholder_rows(blocker, sorted(set(transactional_ids)))
            calls = [
                asyncio.create_task(
                    asyncio.to_thread(
                        user.post,
                        "/v1/producers/init",
                        json={"transactional_id": transactional_id, "transaction_timeout_ms": 1000},
                    )
                )
                for transactional_id in transactional_ids
            ]
            await wait_for_lock_waits(observer, len(calls))
            assert not any(call.done() for call in calls)
            raise _RollBack
    except _RollBack:
        pass
    finally:
        for conn in (blocker, observer):
            await conn.close()
    return [await call for call in calls]


class _RollBack(Exception):
    """Leaves the blocking transaction by rolling it back."""


def _user(make_server) -> tuple[object, httpx.Client]:
    server = make_server(auth="required", admin_token=ADMIN_TOKEN, max_transactional_ids_per_principal=QUOTA)
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    return server, new_user(admin, "racer", rule("TransactionalId", "*", "Write"))


def _owned(server, principal: str) -> list[str]:
    async def read() -> list[str]:
        conn = await connect(server.database_url)
        try:
            rows = await conn.fetch(
                "SELECT transactional_id FROM transactions WHERE principal = $1 ORDER BY 1", principal
            )
            return [row["transactional_id"] for row in rows]
        finally:
            await conn.close()

    return asyncio.run(read())


def test_racing_creations_of_new_ids_never_pass_the_principal_s_quota(make_server):
    server, user = _user(make_server)
    answers = asyncio.run(_race(server, user, ["racing-a", "racing-b"]))
    assert sorted(answer.status_code for answer in answers) == [200, 403], [a.text for a in answers]
    refused = next(answer for answer in answers if answer.status_code == 403)
    assert refused.json()["error"]["code"] == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", refused.text
    assert len(_owned(server, "racer")) == QUOTA


def test_racing_creations_of_one_id_at_the_quota_both_succeed(make_server):
    """Two instances of one new id: the second finds the first's row and initializes it again (a new
    epoch), as an existing id is; the quota counts the id once."""
    server, user = _user(make_server)
    answers = asyncio.run(_race(server, user, ["racing-same", "racing-same"]))
    assert [answer.status_code for answer in answers] == [200, 200], [a.text for a in answers]
    epochs = sorted(answer.json()["producer_epoch"] for answer in answers)
    assert epochs == [0, 1] and len({answer.json()["producer_id"] for answer in answers}) == 1, answers
    assert _owned(server, "racer") == ["racing-same"]
