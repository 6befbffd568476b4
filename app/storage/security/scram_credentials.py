"""Principals' SASL/SCRAM credentials (migration 0018): per principal and mechanism, the salt, the
iteration count, the stored key and the server key (RFC 5802), never the password. Rows come back
as plain values; the core (app/coordinator/scram_credentials.py) computes and checks them."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from app.storage.rows import all_from_rows, from_row
from app.storage.security.principals import AclRow, PrincipalRow, acls_of


@dataclass(frozen=True, slots=True)
class ScramCredentialRow:
    principal: str
    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes
    updated_ms: int


@dataclass(frozen=True, slots=True)
class ScramCredentialInfo:
    """What may be shown of a credential: no key, no salt."""

    principal: str
    mechanism: str
    iterations: int
    updated_ms: int


_COLUMNS = "principal, mechanism, salt, iterations, stored_key, server_key, updated_ms"
_INFO_COLUMNS = "principal, mechanism, iterations, updated_ms"


async def upsert(conn: asyncpg.Connection, credential: ScramCredentialRow) -> None:
    await conn.execute(
        f"INSERT INTO scram_credentials ({_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7) "
        f"ON CONFLICT (principal, mechanism) DO UPDATE SET salt = EXCLUDED.salt, "
        f"iterations = EXCLUDED.iterations, stored_key = EXCLUDED.stored_key, "
        f"server_key = EXCLUDED.server_key, updated_ms = EXCLUDED.updated_ms",
        credential.principal,
        credential.mechanism,
        credential.salt,
        credential.iterations,
        credential.stored_key,
        credential.server_key,
        credential.updated_ms,
    )


async def delete(conn: asyncpg.Connection, principal: str, mechanism: str) -> bool:
    """False when the principal had no credential for the mechanism."""
    status = await conn.execute(
        "DELETE FROM scram_credentials WHERE principal = $1 AND mechanism = $2", principal, mechanism
    )
    return status.endswith(" 1")


async def find(conn: asyncpg.Connection, principal: str, mechanism: str) -> ScramCredentialRow | None:
    row = await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM scram_credentials WHERE principal = $1 AND mechanism = $2", principal, mechanism
    )
    return None if row is None else from_row(ScramCredentialRow, row)


async def find_all(conn: asyncpg.Connection, principal: str) -> list[ScramCredentialRow]:
    """The principal's credentials, one per mechanism it has one for (by mechanism)."""
    return all_from_rows(
        ScramCredentialRow,
        await conn.fetch(
            f"SELECT {_COLUMNS} FROM scram_credentials WHERE principal = $1 ORDER BY mechanism", principal
        ),
    )


async def describe(conn: asyncpg.Connection, principals: list[str] | None) -> list[ScramCredentialInfo]:
    """The credentials of the named principals (None: of every principal), by principal and mechanism."""
    return all_from_rows(
        ScramCredentialInfo,
        await conn.fetch(
            f"SELECT {_INFO_COLUMNS} FROM scram_credentials WHERE ($1::text[] IS NULL OR principal = ANY($1)) "
            f"ORDER BY principal, mechanism",
            principals,
        ),
    )


async def authenticated(
    conn: asyncpg.Connection, principal: str, mechanism: str, stored_key: bytes
) -> tuple[PrincipalRow, list[AclRow]] | None:
    """The principal with every ACL rule that may apply to it (as principals.authenticate gives
    them) while its credential for `mechanism` is still the one of `stored_key`; None once it was
    deleted or changed, or the principal deleted. No caching: read for every request."""
    row = await conn.fetchrow(
        "SELECT p.name, p.is_super_user, p.created_ms FROM scram_credentials c "
        "JOIN principals p ON p.name = c.principal "
        "WHERE c.principal = $1 AND c.mechanism = $2 AND c.stored_key = $3",
        principal,
        mechanism,
        stored_key,
    )
    if row is None:
        return None
    return from_row(PrincipalRow, row), await acls_of(conn, principal)
