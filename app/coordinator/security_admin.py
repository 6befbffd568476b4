"""Principals, API keys, ACLs and the audit log: authentication and the administration of who may
do what. Every change is written with its audit entry (who made it) in one PostgreSQL transaction:
both happen or neither. Authorization of the caller is the front door's (it knows the operation
asked); these operations trust it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg

from app.clock import now_ms
from app.coordinator.acl_filters import AclFilter
from app.coordinator.audit import Actor, record
from app.coordinator.authorizer import Principal, principal_from
from app.coordinator.identifiers import check_identifier
from app.errors import BrokerError, ErrorCode
from app.storage.replication_barrier import commit_waits_for_the_standby
from app.storage.security import principals
from app.storage.security.principals import AclRow, AuditRow, KeyRow, PrincipalRow

__all__ = [
    "AclRow",
    "AuditRow",
    "KeyRow",
    "PrincipalRow",
    "add_acl",
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
    if not rule.principal or not rule.resource_name:
        raise BrokerError(
            ErrorCode.INVALID_REQUEST,
            f"an ACL rule with principal {rule.principal!r} and resource name {rule.resource_name!r}: "
            'expected both non-empty (the principal "*" or the resource name "*" for every one)',
        )
    check_identifier("the ACL rule's principal", rule.principal)
    check_identifier("the ACL rule's resource_name", rule.resource_name)
    async with pool.acquire() as conn, conn.transaction():
        acl = await principals.add_acl(conn, rule)
        await _record_rule(conn, actor, "add acl", acl)
    return acl


async def list_acls(pool: asyncpg.Pool, principal: str | None, resource_type: str | None) -> list[AclRow]:
    async with pool.acquire() as conn:
        return await principals.list_acls(conn, principal, resource_type)


async def find_acls(pool: asyncpg.Pool, acl_filter: AclFilter) -> list[AclRow]:
    """The rules the filter selects (Kafka's DescribeAcls), oldest first."""
    found = await list_acls(pool, acl_filter.principal, acl_filter.resource_type)
    return [acl for acl in found if acl_filter.matches(acl)]


async def remove_acl(pool: asyncpg.Pool, actor: Actor, acl_id: int) -> None:
    async def remove(conn: asyncpg.Connection) -> BrokerError | None:
        if not await _remove_acl(conn, actor, acl_id):
            return BrokerError(ErrorCode.NOT_FOUND, f"no ACL rule {acl_id}: list them with GET /v1/acls")
        return None

    await removed_or_refused(pool, remove)


async def remove_acls(pool: asyncpg.Pool, actor: Actor, acl_filter: AclFilter) -> list[AclRow]:
    """Removes the rules the filter selects (Kafka's DeleteAcls), all or none; the rules removed.
    A rule removed by a concurrent caller after it was read is that caller's, so not returned."""
    async with pool.acquire() as conn, conn.transaction():
        # By rule id (list_acls' order), the order a principal's deletion locks its rules in.
        selected = await principals.list_acls(conn, acl_filter.principal, acl_filter.resource_type)
        removed = [acl for acl in selected if acl_filter.matches(acl) and await _remove_acl(conn, actor, acl.acl_id)]
        if not removed:
            # Nothing left to remove may be the work of a removal whose commit the standby did not
            # confirm: a failover could bring its rules back, so "none" waits for the standby too.
            await commit_waits_for_the_standby(conn)
        return removed


async def _remove_acl(conn: asyncpg.Connection, actor: Actor, acl_id: int) -> bool:
    removed = await principals.remove_acl(conn, acl_id)
    if removed is None:
        return False
    await _record_rule(conn, actor, "remove acl", removed)
    return True


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
