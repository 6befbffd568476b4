"""Kafka's CreateAcls and DeleteAcls apply a request's accepted changes in one PostgreSQL
transaction (as Kafka's controller applies them atomically, AclControlManager), each creation and
filter answered its own result. Raw requests to a server on a database of its own: the atomicity
tests park the request at a rule's row lock the test holds, and read what is committed meanwhile."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.concurrency.lock_waits import in_a_deadlock, wait_for_lock_waits
from tests.kafka.raw import RawConnection, nested, request_of
from tests.kafka.test_security import (
    ADMIN_TOKEN,
    admin_client,
    creation,
    every_rule_filter,
    log_in,
    rule,
    secured_on_a_database_of_its_own,
)

PRINCIPAL = "batched"
# A DeleteAcls of the boundary sweep's size (tests/kafka/boundary_sweep.py's MANY_ENTRIES).
MANY_FILTERS = 3000


@pytest.fixture(scope="module")
def secured(postgres):
    with secured_on_a_database_of_its_own(postgres, "acl_batches") as server:
        yield server


@pytest.fixture
def principal(secured):
    with admin_client(secured) as admin:
        admin.post("/v1/principals", json={"name": PRINCIPAL}).raise_for_status()
    yield PRINCIPAL
    with admin_client(secured) as admin:
        admin.delete(f"/v1/principals/{PRINCIPAL}").raise_for_status()


def added(server, *names: str) -> list[int]:
    """The ids of the Topic Read rules of PRINCIPAL on `names`, added over HTTP in that order."""
    ids = []
    with admin_client(server) as admin:
        for name in names:
            answer = admin.post("/v1/acls", json={"principal": PRINCIPAL, **rule("Topic", name, "Read")})
            answer.raise_for_status()
            ids.append(answer.json()["acl_id"])
    return ids


def of_topic(name: str, principal: str = f"User:{PRINCIPAL}"):
    return nested(
        api_table.DELETE_ACLS, 3, "DeleteAclsFilter", **{**every_rule_filter(principal), "resource_name_filter": name}
    )


def as_admin(server, api_key: int, **fields):
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, "admin", ADMIN_TOKEN).error_code == KafkaError.none
        return connection.call(request_of(api_key, 3, **fields))


def audited(server, action: str, topic_prefix: str) -> list[str]:
    """The resources of the audit entries of `action` on topics named `topic_prefix`..."""
    with admin_client(server) as admin:
        entries = admin.get("/v1/audit", params={"limit": 1000}).json()["entries"]
    return sorted(
        e["resource"] for e in entries if e["action"] == action and e["resource"].startswith(f"Topic:{topic_prefix}")
    )


def committed_topics(database_url: str) -> list[str]:
    async def read() -> list[str]:
        connection = await asyncpg.connect(database_url)
        try:
            rows = await connection.fetch("SELECT resource_name FROM acls WHERE principal = $1", PRINCIPAL)
        finally:
            await connection.close()
        return sorted(row["resource_name"] for row in rows)

    return asyncio.run(read())


def parked(database_url: str, acl_id: int, call):
    """`call`'s answer, and the rules of PRINCIPAL committed while it waited for the row lock of rule
    `acl_id` (held by the test until it waits)."""

    async def run():
        holder = await asyncpg.connect(database_url)
        observer = await asyncpg.connect(database_url)
        try:
            transaction = holder.transaction()
            await transaction.start()
            await holder.execute("SELECT 1 FROM acls WHERE acl_id = $1 FOR UPDATE", acl_id)
            answer = asyncio.create_task(asyncio.to_thread(call))
            await wait_for_lock_waits(observer, 1)
            rows = await observer.fetch("SELECT resource_name FROM acls WHERE principal = $1", PRINCIPAL)
            await transaction.rollback()
            return await answer, sorted(row["resource_name"] for row in rows)
        finally:
            await holder.close()
            await observer.close()

    return asyncio.run(run())


def test_a_delete_acls_of_thousands_of_filters_answers_each_its_own_rules(secured, principal):
    """Most filters match nothing (a principal without rules); some match one rule; the one that
    matches every rule of the principal answers those no earlier filter took (a rule two filters
    select is the first's); an invalid filter is refused alone. One audit entry per rule removed."""
    added(secured, "batch-a", "batch-b", "batch-c")
    filters = [of_topic("batch-a", f"User:nobody-{index}") for index in range(MANY_FILTERS)]
    filters[10] = of_topic("batch-b")
    filters[2000] = nested(api_table.DELETE_ACLS, 3, "DeleteAclsFilter", **every_rule_filter(f"User:{PRINCIPAL}"))
    filters[2500] = of_topic("batch-c")
    filters[2600] = nested(
        api_table.DELETE_ACLS, 3, "DeleteAclsFilter", **{**every_rule_filter(), "operation": 0}
    )  # UNKNOWN: INVALID_REQUEST
    deleted = as_admin(secured, api_table.DELETE_ACLS, filters=tuple(filters))
    answers = [(r.error_code, sorted(a.resource_name for a in r.matching_acls)) for r in deleted.filter_results]
    assert len(answers) == MANY_FILTERS
    assert answers[10] == (KafkaError.none, ["batch-b"])
    assert answers[2000] == (KafkaError.none, ["batch-a", "batch-c"])
    assert answers[2600][0] == KafkaError.invalid_request
    rest = answers[:10] + answers[11:2000] + answers[2001:2600] + answers[2601:]
    assert rest == [(KafkaError.none, [])] * (MANY_FILTERS - 3)
    assert committed_topics(secured.database_url) == []
    assert audited(secured, "remove acl", "batch-") == ["Topic:batch-a", "Topic:batch-b", "Topic:batch-c"]


def test_a_delete_acls_removes_its_filters_rules_in_one_transaction(secured, principal):
    """While the request waits for its last rule (a row lock the test holds), none of its filters'
    removals is committed: before, each filter's removal was a transaction of its own, and the
    first filters' rules were gone while the last one waited."""
    _, _, last = added(secured, "atomic-a", "atomic-b", "atomic-z")
    filters = (of_topic("atomic-a"), of_topic("nothing"), of_topic("atomic-z"))
    (deleted, meanwhile) = parked(
        secured.database_url, last, lambda: as_admin(secured, api_table.DELETE_ACLS, filters=filters)
    )
    assert meanwhile == ["atomic-a", "atomic-b", "atomic-z"]
    assert [(r.error_code, [a.resource_name for a in r.matching_acls]) for r in deleted.filter_results] == [
        (KafkaError.none, ["atomic-a"]),
        (KafkaError.none, []),
        (KafkaError.none, ["atomic-z"]),
    ]
    assert committed_topics(secured.database_url) == ["atomic-b"]


def test_a_create_acls_adds_its_accepted_rules_in_one_transaction_and_answers_each(secured, principal):
    """As Kafka's controller: a creation refused is answered its error, and the request's other
    creations are made, all at once: while the request waits for an existing rule it names (a row
    lock the test holds), none of its new rules is committed. A rule named twice is one rule."""
    [existing] = added(secured, "create-m")
    user = f"User:{PRINCIPAL}"
    creations = (
        creation(user, name="create-a"),
        creation(user, host="10.0.0.1", name="create-b"),  # txbroker's rules apply from every host
        creation(user, name="create-m"),
        creation(user, name="create-z"),
        creation(user, name="create-a"),
    )
    (created, meanwhile) = parked(
        secured.database_url, existing, lambda: as_admin(secured, api_table.CREATE_ACLS, creations=creations)
    )
    assert meanwhile == ["create-m"]
    assert [r.error_code for r in created.results] == [
        KafkaError.none,
        KafkaError.invalid_request,
        KafkaError.none,
        KafkaError.none,
        KafkaError.none,
    ]
    assert "'10.0.0.1'" in created.results[1].error_message
    assert committed_topics(secured.database_url) == ["create-a", "create-m", "create-z"]
    assert audited(secured, "add acl", "create-") == [
        "Topic:create-a",
        "Topic:create-a",
        "Topic:create-m",
        "Topic:create-m",
        "Topic:create-z",
    ]


_INSERT_RULE_SQL = (
    "INSERT INTO acls (principal, resource_type, pattern_type, resource_name, operation, permission) "
    "VALUES ($1, 'Topic', 'literal', $2, 'Read', 'allow') ON CONFLICT DO NOTHING"
)


def test_a_create_acls_rolled_back_by_postgresql_to_break_a_deadlock_is_made_once_more(secured, principal):
    """A request's creations take their rules in the order asked, where a removal takes them by
    id and another creation in its own order, so it may close a lock cycle with them. The test's
    session closes one (its own deadlock check off): the request has inserted its new rule and
    waits for the existing one the test holds; the test inserts the same new rule. PostgreSQL rolls
    the request back; nothing of it was written, and it is run once more, answered as if first."""
    [existing] = added(secured, "deadlock-m")
    user = f"User:{PRINCIPAL}"
    creations = (creation(user, name="deadlock-a"), creation(user, name="deadlock-m"))
    created = asyncio.run(
        in_a_deadlock(
            secured.database_url,
            ("SELECT 1 FROM acls WHERE acl_id = $1 FOR UPDATE", (existing,)),
            (_INSERT_RULE_SQL, (PRINCIPAL, "deadlock-a")),
            lambda: as_admin(secured, api_table.CREATE_ACLS, creations=creations),
        )
    )
    assert [(r.error_code, r.error_message) for r in created.results] == [(KafkaError.none, None)] * 2
    assert committed_topics(secured.database_url) == ["deadlock-a", "deadlock-m"]
    assert audited(secured, "add acl", "deadlock-") == ["Topic:deadlock-a", "Topic:deadlock-m", "Topic:deadlock-m"]
