"""Which nodes serve on this database: each node announces itself, with the address it advertises,
for as long as it serves, and any node lists the live ones (storage/node_presence.py: through
PostgreSQL's own sessions, no table). A node that stops or dies leaves the list by itself."""

from __future__ import annotations

import asyncpg

from app.storage import database, node_presence
from app.storage.node_presence import LiveNode

__all__ = ["LiveNode", "NodePresence", "live_nodes"]


class NodePresence:
    """This node's announcement: a connection of its own, named after the node, held open while it
    serves. Invariant: the node is listed exactly while that connection is open; PostgreSQL
    dropping it (a restart, a network cut) ends the announcement, `lost` then says to announce
    again."""

    def __init__(self, database_url: str) -> None:
        self._database_url = database_url
        self._connection: asyncpg.Connection | None = None

    async def announce(self, node: LiveNode) -> bool:
        """Opens the connection and names it after the node; False when the name is too long for
        PostgreSQL (the connection is held all the same, and other nodes do not list this one)."""
        self._connection = await database.connect(self._database_url)
        return await node_presence.announce(self._connection, node)

    @property
    def lost(self) -> bool:
        """Announced, and the connection has since been dropped."""
        return self._connection is not None and self._connection.is_closed()

    async def withdraw(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()


async def live_nodes(pool: asyncpg.Pool) -> list[LiveNode]:
    """The nodes announced on this database, one per node id."""
    async with pool.acquire() as conn:
        return await node_presence.live_nodes(conn)
