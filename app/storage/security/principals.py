"""Principals, their API keys (stored as SHA-256 only), their ACL rules, and the audit log.

Rows come back as plain values; the authorizer (app/coordinator/authorizer.py) gives them meaning.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from enum import StrEnum

import asyncpg

from app.storage.rows import all_from_rows, from_row

BOOTSTRAP_KEY_ID = "bootstrap"


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def new_token() -> str:
    return "txb_" + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class PrincipalRow:
    name: str
    is_super_user: bool
    created_ms: int


@dataclass(frozen=True, slots=True)
class AclRow:
    acl_id: int
    principal: str
    resource_type: str
    pattern_type: str
    resource_name: str
    operation: str
    permission: str


@dataclass(frozen=True, slots=True)
class KeyRow:
    key_id: str
    principal: str
    created_ms: int
    revoked_ms: int | None


_ACL_COLUMNS = "acl_id, principal, resource_type, pattern_type, resource_name, operation, permission"
# Built once: authenticate runs it on every request when auth is on.
_ACLS_OF_SQL = f"SELECT {_ACL_COLUMNS} FROM acls WHERE principal = $1 OR principal = '*'"


async def authenticate(conn: asyncpg.Connection, token: str) -> tuple[PrincipalRow, list[AclRow]] | None:
    """The principal owning this (unrevoked) token, with every ACL rule that may apply to it (its
    own and those of the wildcard principal "*"). One round trip each; no caching, so a revoked
    key stops working with the next request."""
    row = await conn.fetchrow(
        "SELECT p.name, p.is_super_user, p.created_ms FROM api_keys k JOIN principals p ON p.name = k.principal "
        "WHERE k.token_sha256 = $1 AND k.revoked_ms IS NULL",
        token_hash(token),
    )
    if row is None:
        return None
    principal = from_row(PrincipalRow, row)
    return principal, await acls_of(conn, principal.name)


async def acls_of(conn: asyncpg.Connection, principal: str) -> list[AclRow]:
    """Every ACL rule that may apply to the principal: its own and those of the wildcard "*"."""
    return all_from_rows(AclRow, await conn.fetch(_ACLS_OF_SQL, principal))


async def create_principal(conn: asyncpg.Connection, name: str, is_super_user: bool, now_ms: int) -> bool:
    status = await conn.execute(
        "INSERT INTO principals (name, is_super_user, created_ms) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING",
        name,
        is_super_user,
        now_ms,
    )
    return status.endswith(" 1")


async def list_principals(conn: asyncpg.Connection) -> list[PrincipalRow]:
    return all_from_rows(
        PrincipalRow, await conn.fetch("SELECT name, is_super_user, created_ms FROM principals ORDER BY name")
    )


_PRINCIPAL_SQL = "SELECT name, is_super_user, created_ms FROM principals WHERE name = $1"
_HELD_PRINCIPAL_SQL = _PRINCIPAL_SQL + " FOR KEY SHARE"


async def get_principal(conn: asyncpg.Connection, name: str, hold: bool = False) -> PrincipalRow | None:
    """The principal; `hold`: its row held (FOR KEY SHARE) until the caller's transaction ends, for
    a write of a row that references it (a key, a SCRAM credential): a deletion of the principal
    then waits for that write, or, committed first, is seen (None), where a plain read then the
    write would violate the reference."""
    row = await conn.fetchrow(_HELD_PRINCIPAL_SQL if hold else _PRINCIPAL_SQL, name)
    return None if row is None else from_row(PrincipalRow, row)


# The LockRows node sits above the Sort, so the rows are locked in acl_id order.
_LOCK_RULES_OF_SQL = "SELECT acl_id FROM acls WHERE principal = $1 ORDER BY acl_id FOR UPDATE"


async def delete_principal(conn: asyncpg.Connection, name: str) -> bool:
    """Its keys and SCRAM credentials go with it (ON DELETE CASCADE); its ACL rules too."""
    async with conn.transaction():
        # Its rules locked by id, the order a DeleteAcls (security_admin.remove_acls) removes them
        # in, before they are deleted: a DELETE by principal locks them in the order its scan meets
        # them (the table's, the index's), and deadlocked with a DeleteAcls removing the same rules.
        await conn.execute(_LOCK_RULES_OF_SQL, name)
        await conn.execute("DELETE FROM acls WHERE principal = $1", name)
        status = await conn.execute("DELETE FROM principals WHERE name = $1", name)
    return status.endswith(" 1")


async def add_key(
    conn: asyncpg.Connection, principal: str, now_ms: int, token: str | None = None, key_id: str | None = None
) -> tuple[str, str]:
    """(key id, token). The token is returned once and never stored."""
    token = token or new_token()
    key_id = key_id or "k_" + secrets.token_hex(6)
    await conn.execute(
        "INSERT INTO api_keys (key_id, principal, token_sha256, created_ms) VALUES ($1, $2, $3, $4)",
        key_id,
        principal,
        token_hash(token),
        now_ms,
    )
    return key_id, token


async def list_keys(conn: asyncpg.Connection, principal: str) -> list[KeyRow]:
    return all_from_rows(
        KeyRow,
        await conn.fetch(
            "SELECT key_id, principal, created_ms, revoked_ms FROM api_keys WHERE principal = $1 ORDER BY created_ms",
            principal,
        ),
    )


async def revoke_key(conn: asyncpg.Connection, principal: str, key_id: str, now_ms: int) -> bool:
    status = await conn.execute(
        "UPDATE api_keys SET revoked_ms = $3 WHERE principal = $1 AND key_id = $2 AND revoked_ms IS NULL",
        principal,
        key_id,
        now_ms,
    )
    return status.endswith(" 1")


class BootstrapKey(StrEnum):
    """What bootstrap_super_user found of the configured token."""

    INSTALLED = "installed"  # a token the database had not seen: now the bootstrap key
    IN_FORCE = "in force"  # already the bootstrap key
    REVOKED = "revoked"  # a key revoked, or replaced by a newer admin token: left revoked
    ANOTHER_KEY = "another key"  # the token of a key added through the API: left as it is


async def bootstrap_super_user(conn: asyncpg.Connection, name: str, token: str, now_ms: int) -> BootstrapKey:
    """TXBROKER_ADMIN_TOKEN: makes sure the super user `name` exists with `token` as its bootstrap
    key, unless the database has seen the token before. Every worker of every node runs this at
    each start with its own copy of the setting, which may be older than the database's keys: so a
    token the database knows is left as it is, and one revoked (or replaced) stays revoked, however
    many nodes still carry it. A token it has not seen is a rotation: it becomes the bootstrap key,
    and the key it replaces is kept, revoked, under a key id of its own, so that a node still
    configured with the old token finds it revoked instead of swapping it back."""
    digest = token_hash(token)
    async with conn.transaction():
        # The upsert locks the principal's row: nodes starting together bootstrap one at a time.
        await conn.execute(
            "INSERT INTO principals (name, is_super_user, created_ms) VALUES ($1, true, $2) "
            "ON CONFLICT (name) DO UPDATE SET is_super_user = true",
            name,
            now_ms,
        )
        known = await conn.fetchrow("SELECT key_id, revoked_ms FROM api_keys WHERE token_sha256 = $1", digest)
        if known is not None:
            if known["revoked_ms"] is not None:
                return BootstrapKey.REVOKED
            return BootstrapKey.IN_FORCE if known["key_id"] == BOOTSTRAP_KEY_ID else BootstrapKey.ANOTHER_KEY
        retired_key_id = f"{BOOTSTRAP_KEY_ID}-replaced-{secrets.token_hex(6)}"
        replaced = await conn.execute(
            "UPDATE api_keys SET key_id = $2, revoked_ms = coalesce(revoked_ms, $3) WHERE key_id = $1",
            BOOTSTRAP_KEY_ID,
            retired_key_id,
            now_ms,
        )
        await add_key(conn, name, now_ms, token=token, key_id=BOOTSTRAP_KEY_ID)
        details = f"the previous one is kept revoked as {retired_key_id}" if replaced.endswith(" 1") else "created"
        await audit(conn, now_ms, name, SERVER_SOURCE, "install bootstrap key (admin_token)", name, details)
    return BootstrapKey.INSTALLED


_RULE_COLUMNS = "principal, resource_type, pattern_type, resource_name, operation, permission"
# Inserted (an existing rule locked) in the order given; an existing rule is updated to itself so
# that RETURNING has it.
_ADD_ACLS_SQL = (
    f"INSERT INTO acls ({_RULE_COLUMNS}) "
    f"SELECT {_RULE_COLUMNS} FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) "
    f"WITH ORDINALITY AS given({_RULE_COLUMNS}, position) ORDER BY position "
    f"ON CONFLICT ON CONSTRAINT acls_unique_rule DO UPDATE SET principal = EXCLUDED.principal "
    f"RETURNING {_ACL_COLUMNS}"
)


def _rule_of(acl: AclRow) -> tuple[str, ...]:
    """What makes a rule the same rule (acls_unique_rule): all but its id."""
    return (
        str(acl.principal),
        str(acl.resource_type),
        str(acl.pattern_type),
        str(acl.resource_name),
        str(acl.operation),
        str(acl.permission),
    )


async def add_acls(conn: asyncpg.Connection, acls: list[AclRow]) -> list[AclRow]:
    """The rules as stored (with their ids), one for each given, in its place (their `acl_id`
    ignored): a rule given twice, or already stored, is one rule. In one statement, new rules are
    inserted (their ids in that order), and existing ones locked, in the order given."""
    distinct = list(dict.fromkeys(_rule_of(acl) for acl in acls))
    if not distinct:
        return []
    stored = {_rule_of(acl): acl for acl in all_from_rows(AclRow, await conn.fetch(_ADD_ACLS_SQL, *zip(*distinct)))}
    return [stored[_rule_of(acl)] for acl in acls]


async def list_acls(conn: asyncpg.Connection, principal: str | None, resource_type: str | None) -> list[AclRow]:
    return all_from_rows(
        AclRow,
        await conn.fetch(
            f"SELECT {_ACL_COLUMNS} FROM acls WHERE ($1::text IS NULL OR principal = $1) "
            f"AND ($2::text IS NULL OR resource_type = $2) ORDER BY acl_id",
            principal,
            resource_type,
        ),
    )


# The LockRows node sits above the Sort, so the rows are locked in acl_id order.
_LOCK_RULES_SQL = "SELECT acl_id FROM acls WHERE acl_id = ANY($1::bigint[]) ORDER BY acl_id FOR UPDATE"
_REMOVE_RULES_SQL = f"DELETE FROM acls WHERE acl_id = ANY($1::bigint[]) RETURNING {_ACL_COLUMNS}"


async def remove_acls(conn: asyncpg.Connection, acl_ids: list[int]) -> list[AclRow]:
    """The rules removed, by id; an id of no rule (never one, or removed meanwhile) is left out.
    They are locked by id first, the order a principal's deletion locks its rules in
    (_LOCK_RULES_OF_SQL): a DELETE locks them in the order its scan meets them."""
    await conn.execute(_LOCK_RULES_SQL, acl_ids)
    removed = all_from_rows(AclRow, await conn.fetch(_REMOVE_RULES_SQL, acl_ids))
    return sorted(removed, key=lambda acl: acl.acl_id)


# What an audit entry's source is when a node acts by itself (at start), not for a request.
SERVER_SOURCE = "server"


@dataclass(frozen=True, slots=True)
class AuditRow:
    entry_id: int
    timestamp_ms: int
    principal: str
    action: str
    resource: str
    details: str
    source: str | None  # None: written before migration 0013, which records it
    # HOST:PORT of the client's connection; None: written by the node itself (SERVER_SOURCE) or
    # before migration 0014, which records it
    client_address: str | None


async def audit(
    conn: asyncpg.Connection,
    now_ms: int,
    principal: str,
    source: str,
    action: str,
    resource: str,
    details: str = "",
    client_address: str | None = None,
) -> None:
    """`source`: the door the action came through (the coordinator's AuditSource) or SERVER_SOURCE;
    `client_address`: the connection's peer as that door saw it, None for the node's own actions."""
    await conn.execute(
        "INSERT INTO audit_log (timestamp_ms, principal, source, action, resource, details, client_address) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7)",
        now_ms,
        principal,
        source,
        action,
        resource,
        details,
        client_address,
    )


async def audit_entries(conn: asyncpg.Connection, limit: int, before_id: int | None) -> list[AuditRow]:
    return all_from_rows(
        AuditRow,
        await conn.fetch(
            "SELECT entry_id, timestamp_ms, principal, action, resource, details, source, client_address "
            "FROM audit_log "
            "WHERE ($2::bigint IS NULL OR entry_id < $2) ORDER BY entry_id DESC LIMIT $1",
            limit,
            before_id,
        ),
    )
