"""The audit log for the console, newest first, a page at a time, optionally only the entries of one
door (`source`), one principal or one action.

Read-only. A page reads at most `scan_budget` entries below its `before` (a range of the primary
key, read backwards) and keeps those that match: a filter that matches few entries never reads the
whole log for one page; the page then offers to go on from the oldest entry it read.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from app.storage.rows import all_from_rows


@dataclass(frozen=True, slots=True)
class AuditEntry:
    entry_id: int
    timestamp_ms: int
    principal: str
    source: str | None  # http, kafka, console or server; None for entries written before it was recorded
    client_address: str | None  # HOST:PORT as the door saw it; None for a node's own and older entries
    action: str
    resource: str
    details: str


@dataclass(frozen=True, slots=True)
class AuditPage:
    entries: list[AuditEntry]
    next_before: int | None  # where the next (older) page starts; None: nothing older to read
    scanned: int  # entries read to find this page's


_SCANNED = """
WITH scanned AS (
    SELECT * FROM audit_log WHERE ($1::bigint IS NULL OR entry_id < $1) ORDER BY entry_id DESC LIMIT $2
)
"""
_MATCHING_SQL = (
    _SCANNED
    + """
SELECT entry_id, timestamp_ms, principal, source, client_address, action, resource, details FROM scanned
WHERE ($3::text IS NULL OR source = $3) AND ($4::text IS NULL OR principal = $4) AND ($5::text IS NULL OR action = $5)
ORDER BY entry_id DESC LIMIT $6
"""
)
_SCANNED_SQL = _SCANNED + "SELECT count(*) AS scanned, min(entry_id) AS oldest FROM scanned"


async def audit_page(
    conn: asyncpg.Connection,
    before: int | None,
    source: str | None,
    principal: str | None,
    action: str | None,
    size: int,
    scan_budget: int,
) -> AuditPage:
    """Up to `size` matching entries older than the entry id `before` (None: from the newest)."""
    rows = await conn.fetch(_MATCHING_SQL, before, scan_budget, source, principal, action, size + 1)
    entries = all_from_rows(AuditEntry, rows)
    if len(entries) > size:
        return AuditPage(entries[:size], entries[size - 1].entry_id, 0)
    read = await conn.fetchrow(_SCANNED_SQL, before, scan_budget)
    # Fewer than a page matched: the log ended, or the budget did (then the next page goes on below).
    next_before = read["oldest"] if read["scanned"] == scan_budget else None
    return AuditPage(entries, next_before, read["scanned"])
