"""Deletions of ACL rules that overlap (a principal's deletion, Kafka's DeleteAcls) lock the rules in
one order, parked at a row lock the test holds (lock_waits.py). A server on a database of its own:
the test places the rules' rows in the table (see the test), which needs a table of one page."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.concurrency.lock_waits import parked_in_turn
from tests.kafka.raw import RawConnection, nested, request_of
from tests.kafka.test_security import (
    ADMIN_TOKEN,
    admin_client,
    every_rule_filter,
    http_rules,
    log_in,
    rule,
    secured_on_a_database_of_its_own,
)

PRINCIPAL = "lock-rules"


@pytest.fixture(scope="module")
def secured(postgres):
    with secured_on_a_database_of_its_own(postgres, "security_lock_order") as server:
        yield server


def added(server, *acl: dict) -> int:
    """The id of the rule added for PRINCIPAL."""
    with admin_client(server) as admin:
        answer = admin.post("/v1/acls", json={"principal": PRINCIPAL, **rule(*acl)})
        answer.raise_for_status()
        return answer.json()["acl_id"]


async def vacuumed(server) -> None:
    connection = await asyncpg.connect(server.database_url)
    try:
        await connection.execute("VACUUM (INDEX_CLEANUP ON) acls")
    finally:
        await connection.close()


def test_deleting_a_principal_while_deleteacls_removes_its_rules_both_succeed(secured):
    """A principal's deletion locks its rules in DeleteAcls' order (by rule id), not in the order
    its DELETE finds them: a principal deleted over HTTP while a Kafka DeleteAcls removed its rules
    deadlocked (PostgreSQL aborted one: the HTTP call answered 500, or the Kafka connection was
    closed unanswered). The rule on 'lock-z' is added first; the one on 'lock-a' after it, in the
    place a deleted rule left (vacuumed), so every scan of the principal's rules (the table's
    order, the index's) meets 'lock-a' first. The interleaving that deadlocked: DeleteAcls waits for
    rule 'lock-z' (held by the test); the deletion takes rule 'lock-a', then waits for 'lock-z'."""
    with admin_client(secured) as admin:
        admin.post("/v1/principals", json={"name": PRINCIPAL}).raise_for_status()
    left_its_place = added(secured, "Topic", "lock-f", "Read")
    first_rule = added(secured, "Topic", "lock-z", "Read")
    with admin_client(secured) as admin:
        admin.delete(f"/v1/acls/{left_its_place}").raise_for_status()
    asyncio.run(vacuumed(secured))
    added(secured, "Topic", "lock-a", "Read")
    of_the_principal = nested(api_table.DELETE_ACLS, 3, "DeleteAclsFilter", **every_rule_filter(f"User:{PRINCIPAL}"))

    def rules_deleted() -> list:
        with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
            assert log_in(connection, "admin", ADMIN_TOKEN).error_code == KafkaError.none
            answer = connection.call(request_of(api_table.DELETE_ACLS, 3, filters=(of_the_principal,)))
        return [(r.error_code, sorted(acl.resource_name for acl in r.matching_acls)) for r in answer.filter_results]

    def principal_deleted() -> int:
        with admin_client(secured) as admin:
            return admin.delete(f"/v1/principals/{PRINCIPAL}").status_code

    rules, principal = asyncio.run(
        parked_in_turn(
            secured.database_url,
            "SELECT 1 FROM acls WHERE acl_id = $1 FOR UPDATE",
            (first_rule,),
            rules_deleted,
            principal_deleted,
        )
    )
    assert rules == [(KafkaError.none, ["lock-a", "lock-z"])]
    assert principal == 204
    assert http_rules(secured, PRINCIPAL) == []
