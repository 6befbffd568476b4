"""Principals, API keys, ACLs and the audit log: authentication and the administration of who may
do what. Every change is written with its audit entry (who made it) in one PostgreSQL transaction:
both happen or neither. Authorization of the caller is the front door's (it knows the operation
asked); these operations trust it."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

import asyncpg

from app.clock import now_ms
from app.coordinator.acl_filters import AclFilter
from app.coordinator.audit import Actor, record
from app.coordinator.authorizer import Principal, principal_from
from app.coordinator.identifiers import check_identifier
from app.errors import BrokerError, ErrorCode
from app.storage.database import ROLLED_BACK_BY_POSTGRESQL
from app.storage.replication_barrier import commit_waits_for_the_standby
from app.storage.security import principals
from app.storage.security.principals import AclRow, AuditRow, KeyRow, PrincipalRow

__all__ = [
    "AclRow",
    "AuditRow",
    "KeyRow",
    "PrincipalRow",
    "add_acl",
    "add_acls",
    "add_key",
    "anonymous_principal",
    "audit_entries",
    "authenticate",
    "create_principal",
    "delete_principal",
    "find_acls",
    "list_acls",
    "list_keys",
    "list_principals",
    "remove_acl",
    "remove_acls",
    "removed_or_refused",
    "revoke_key",
]


log = logging.getLogger(__name__)

# Kafka's name of an unauthenticated client (User:ANONYMOUS): ACL rules may name it.
ANONYMOUS_NAME = "ANONYMOUS"


def _no_principal(name: str) -> BrokerError:
    return BrokerError(ErrorCode.NOT_FOUND, f"principal {name!r} does not exist: create it with POST /v1/principals")


async def authenticate(pool: asyncpg.Pool, token: str, wait_for_connection_s: float | None = None) -> Principal | None:
    """The principal an API key belongs to, with its ACL rules; None for an unknown or revoked key.
    TimeoutError when no pooled connection is free within `wait_for_connection_s` (None: no bound)."""
    async with pool.acquire(timeout=wait_for_connection_s) as conn:
        found = await principals.authenticate(conn, token)
    return None if found is None else principal_from(*found)


async def anonymous_principal(pool: asyncpg.Pool) -> Principal:
    """The principal ANONYMOUS as the ACLs judge it: no super user, with the rules naming it and the
    wildcard's (a Kafka client of a listener that authenticates nobody while auth is required)."""
    async with pool.acquire() as conn:
        rules = await principals.acls_of(conn, ANONYMOUS_NAME)
    return principal_from(PrincipalRow(ANONYMOUS_NAME, False, 0), rules)


async def create_principal(pool: asyncpg.Pool, actor: Actor, name: str, super_user: bool) -> int:
    """Creates the principal; its creation time."""
    now = now_ms()
    async with pool.acquire() as conn, conn.transaction():
        if not await principals.create_principal(conn, name, super_user, now):
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"principal {name!r} already exists")
        await record(conn, actor, "create principal", name, f"super_user={super_user}", at_ms=now)
    return now


async def list_principals(pool: asyncpg.Pool) -> list[PrincipalRow]:
    async with pool.acquire() as conn:
        return await principals.list_principals(conn)


async def removed_or_refused(
    pool: asyncpg.Pool, remove: Callable[[asyncpg.Connection], Awaitable[BrokerError | None]]
) -> None:
    """Runs `remove` (a removal and its audit entry, or the refusal it found: nothing to remove) in
    one transaction. A refusal is raised once the synchronous standby has what the removal read:
    nothing to remove may be the work of an earlier attempt whose commit's wait for the standby was
    cancelled (answered a retriable error), which a failover brings back, so its retry's NOT_FOUND
    must not say "gone" before the standby has the removal (as remove_acls' "none")."""
    async with pool.acquire() as conn, conn.transaction():
        refusal = await remove(conn)
        if refusal is not None:
            await commit_waits_for_the_standby(conn)
    if refusal is not None:
        raise refusal


async def delete_principal(pool: asyncpg.Pool, actor: Actor, name: str) -> None:
    """Deletes the principal with its keys and ACL rules."""

    async def remove(conn: asyncpg.Connection) -> BrokerError | None:
        if not await principals.delete_principal(conn, name):
            return _no_principal(name)
        await record(conn, actor, "delete principal", name)
        return None

    await removed_or_refused(pool, remove)


async def add_key(pool: asyncpg.Pool, actor: Actor, name: str) -> tuple[str, str]:
    """A new API key for the principal: its id and its token (which is stored hashed only)."""
    async with pool.acquire() as conn, conn.transaction():
        if await principals.get_principal(conn, name, hold=True) is None:
            raise _no_principal(name)
        key_id, token = await principals.add_key(conn, name, now_ms())
        await record(conn, actor, "add key", name, key_id)
    return key_id, token


async def list_keys(pool: asyncpg.Pool, name: str) -> list[KeyRow]:
    """The principal's keys, revoked ones too; NOT_FOUND for a principal that does not exist, as
    adding or revoking one of its keys answers (an empty list would read as a principal without keys)."""
    async with pool.acquire() as conn, conn.transaction():
        if await principals.get_principal(conn, name) is None:
            raise _no_principal(name)
        return await principals.list_keys(conn, name)


async def revoke_key(pool: asyncpg.Pool, actor: Actor, name: str, key_id: str) -> None:
    """The next request with the key is refused (no cache anywhere)."""

    async def remove(conn: asyncpg.Connection) -> BrokerError | None:
        if not await principals.revoke_key(conn, name, key_id, now_ms()):
            return BrokerError(ErrorCode.NOT_FOUND, f"principal {name!r} has no unrevoked key {key_id!r}")
        await record(conn, actor, "revoke key", name, key_id)
        return None

    await removed_or_refused(pool, remove)


async def add_acl(pool: asyncpg.Pool, actor: Actor, rule: AclRow) -> AclRow:
    """Adds a rule (idempotent: the same rule twice is one rule); the rule as stored (with its id).
    INVALID_REQUEST for an empty principal or resource name, or one over the identifier limit."""
    [added] = await add_acls(pool, actor, [rule])
    if isinstance(added, BrokerError):
        raise added
    return added


async def add_acls(pool: asyncpg.Pool, actor: Actor, rules: list[AclRow]) -> list[AclRow | BrokerError]:
    """Adds the rules (Kafka's CreateAcls): each rule's answer, in the order given, is the rule as
    stored (with its id) or its refusal (add_acl's); the accepted ones are added, each with its audit
    entry, in one PostgreSQL transaction, run once more if PostgreSQL rolled it back to break a
    deadlock."""
    answers: list[AclRow | BrokerError | None] = [_refusal_of(rule) for rule in rules]
    accepted = [index for index, refusal in enumerate(answers) if refusal is None]
    if accepted:
        try:
            added = await _added_rules(pool, actor, [rules[index] for index in accepted])
        except ROLLED_BACK_BY_POSTGRESQL as error:
            # Its rules are taken in the order asked (their ids in that order), where a removal
            # takes them by id and another creation in its own order: it may close a cycle with
            # either. Nothing was written or answered: run again, it waits for whoever won.
            log.warning(
                "a creation of %d ACL rules was rolled back by PostgreSQL (%s): running it once more",
                len(accepted),
                error,
            )
            added = await _added_rules(pool, actor, [rules[index] for index in accepted])
        for index, acl in zip(accepted, added, strict=True):
            answers[index] = acl
    return answers


def _refusal_of(rule: AclRow) -> BrokerError | None:
    if not rule.principal or not rule.resource_name:
        return BrokerError(
            ErrorCode.INVALID_REQUEST,
            f"an ACL rule with principal {rule.principal!r} and resource name {rule.resource_name!r}: "
            'expected both non-empty (the principal "*" or the resource name "*" for every one)',
        )
    try:
        check_identifier("the ACL rule's principal", rule.principal)
        check_identifier("the ACL rule's resource_name", rule.resource_name)
    except BrokerError as refused:
        return refused
    return None


async def _added_rules(pool: asyncpg.Pool, actor: Actor, rules: list[AclRow]) -> list[AclRow]:
    async with pool.acquire() as conn, conn.transaction():
        added = await principals.add_acls(conn, rules)
        for acl in added:
            await _record_rule(conn, actor, "add acl", acl)
    return added


async def list_acls(pool: asyncpg.Pool, principal: str | None, resource_type: str | None) -> list[AclRow]:
    async with pool.acquire() as conn:
        return await principals.list_acls(conn, principal, resource_type)


async def find_acls(pool: asyncpg.Pool, acl_filter: AclFilter) -> list[AclRow]:
    """The rules the filter selects (Kafka's DescribeAcls), oldest first."""
    found = await list_acls(pool, acl_filter.principal, acl_filter.resource_type)
    return [acl for acl in found if acl_filter.matches(acl)]


async def remove_acl(pool: asyncpg.Pool, actor: Actor, acl_id: int) -> None:
    async def remove(conn: asyncpg.Connection) -> BrokerError | None:
        if not await _removed_rules(conn, actor, [acl_id]):
            return BrokerError(ErrorCode.NOT_FOUND, f"no ACL rule {acl_id}: list them with GET /v1/acls")
        return None

    await removed_or_refused(pool, remove)


async def remove_acls(pool: asyncpg.Pool, actor: Actor, acl_filters: list[AclFilter]) -> list[list[AclRow]]:
    """Removes the rules the filters select (Kafka's DeleteAcls), all in one PostgreSQL transaction;
    for each filter, in the order given, the rules it removed: a rule two filters select is the
    first's. A rule removed by a concurrent caller after it was read is that caller's, so not
    returned."""
    if not acl_filters:
        return []
    async with pool.acquire() as conn, conn.transaction():
        selected = await principals.list_acls(
            conn,
            _shared(acl_filter.principal for acl_filter in acl_filters),
            _shared(acl_filter.resource_type for acl_filter in acl_filters),
        )
        first_filter_of: dict[int, int] = {}
        for position, acl_filter in enumerate(acl_filters):
            for acl in selected:
                if acl_filter.matches(acl):
                    first_filter_of.setdefault(acl.acl_id, position)
        # By rule id, the order a principal's deletion locks its rules in.
        removed = await _removed_rules(conn, actor, sorted(first_filter_of))
        if not removed:
            # Nothing left to remove may be the work of a removal whose commit the standby did not
            # confirm: a failover could bring its rules back, so "none" waits for the standby too.
            # (A removal's own COMMIT waits for it, and its WAL comes after every commit read.)
            await commit_waits_for_the_standby(conn)
    removed_by: list[list[AclRow]] = [[] for _ in acl_filters]
    for acl in removed:
        removed_by[first_filter_of[acl.acl_id]].append(acl)
    return removed_by


def _shared(values: Iterable[str | None]) -> str | None:
    """The one value every filter names, which narrows the rules read; None when they differ or
    any is None (every value)."""
    distinct = set(values)
    return next(iter(distinct)) if len(distinct) == 1 else None


async def _removed_rules(conn: asyncpg.Connection, actor: Actor, acl_ids: list[int]) -> list[AclRow]:
    """The rules of these ids removed, each with its audit entry, by id."""
    removed = await principals.remove_acls(conn, acl_ids)
    for acl in removed:
        await _record_rule(conn, actor, "remove acl", acl)
    return removed


async def _record_rule(conn: asyncpg.Connection, actor: Actor, action: str, acl: AclRow) -> None:
    """A rule's addition or removal, named alike, its id included: once removed, the rule is gone
    from /v1/acls, and its removal's entry is what tells whose permission it was."""
    await record(
        conn,
        actor,
        action,
        f"{acl.resource_type}:{acl.resource_name}",
        f"{acl.permission} {acl.operation} for {acl.principal} ({acl.pattern_type}), rule {acl.acl_id}",
    )


async def audit_entries(pool: asyncpg.Pool, limit: int, before: int | None) -> list[AuditRow]:
    """Administrative actions, newest first."""
    async with pool.acquire() as conn:
        return await principals.audit_entries(conn, limit, before)
