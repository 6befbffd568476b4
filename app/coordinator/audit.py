"""Who makes an administrative change, through which door and from which address: what its audit
entry records (`GET /v1/audit`). Every change is recorded in the PostgreSQL transaction that makes
it, so an entry exists exactly when its change was committed. The door is the front door's to say:
it built the Actor from the principal it authenticated and the peer of the connection the request
came on (as Kafka's authorizer log names a decision's client host)."""

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
    # The connection's peer, HOST:PORT as client_address formats it; None: the door knows none.
    client_address: str | None = None


def client_address(host: str, port: int) -> str:
    """A peer as the audit log shows it: HOST:PORT, [HOST]:PORT for an IPv6 address (as Kafka's
    listener addresses are written); HOST alone when the port is unknown (0: a trusted proxy's
    X-Forwarded-For names an address without one)."""
    if port == 0:
        return host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def record(
    conn: asyncpg.Connection, actor: Actor, action: str, resource: str, details: str = "", at_ms: int | None = None
) -> None:
    """Writes the entry on `conn`, inside the caller's PostgreSQL transaction (at_ms: now)."""
    await principals.audit(
        conn,
        now_ms() if at_ms is None else at_ms,
        actor.principal,
        actor.source,
        action,
        resource,
        details,
        actor.client_address,
    )
