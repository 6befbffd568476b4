"""Each group's own configs (Kafka's group configs: app/coordinator/group_configs.py), by Kafka's
name, as text; a group's rows change under a transaction-scoped advisory lock on its id, so two
alterations of one group apply one after the other."""

from __future__ import annotations

import asyncpg

# The class id of the advisory locks on a group's configs (pg_advisory_xact_lock(int, int)'s first
# key): -2, which neither the topic names' locks (0), the transactional id creations' (-1) nor the
# log cleaner's ((topic_id, partition), topic ids from 1) use.
GROUP_CONFIGS_LOCK_CLASS = -2


async def lock(conn: asyncpg.Connection, group_id: str) -> None:
    """Holds the group's configs until the caller's transaction ends."""
    await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", GROUP_CONFIGS_LOCK_CLASS, group_id)


async def configs(conn: asyncpg.Connection | asyncpg.Pool, group_id: str) -> dict[str, str]:
    rows = await conn.fetch("SELECT name, value FROM group_configs WHERE group_id = $1", group_id)
    return {row["name"]: row["value"] for row in rows}


async def replace(conn: asyncpg.Connection, group_id: str, configs: dict[str, str]) -> None:
    """The group's configs become `configs` (empty: none of its own)."""
    await conn.execute("DELETE FROM group_configs WHERE group_id = $1", group_id)
    await conn.executemany(
        "INSERT INTO group_configs (group_id, name, value) VALUES ($1, $2, $3)",
        [(group_id, name, value) for name, value in sorted(configs.items())],
    )
