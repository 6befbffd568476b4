"""Who makes an administrative change, and through which door: what its audit entry records
(`GET /v1/audit`). Every change is recorded in the PostgreSQL transaction that makes it, so an
entry exists exactly when its change was committed. The door is the front door's to say: it built
the Actor from the principal it authenticated."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import asyncpg

from app.clock import now_ms
from app.storage.security import principals


class AuditSource(StrEnum):
    HTTP = "http"
    KAFKA = "kafka"
    CONSOLE = "console"


@dataclass(frozen=True, slots=True)
class Actor:
    principal: str
    source: AuditSource


async def record(
    conn: asyncpg.Connection, actor: Actor, action: str, resource: str, details: str = "", at_ms: int | None = None
) -> None:
    """Writes the entry on `conn`, inside the caller's PostgreSQL transaction (at_ms: now)."""
    await principals.audit(
        conn, now_ms() if at_ms is None else at_ms, actor.principal, actor.source, action, resource, details
    )
