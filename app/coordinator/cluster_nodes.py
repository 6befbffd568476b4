"""Which nodes serve on this database: each node announces itself, with the address it advertises,
for as long as it serves, and any node lists the live ones (storage/node_presence.py: through
PostgreSQL's own sessions, no table). A node that stops or dies leaves the list by itself; each
process lists it a while longer (NodeListing), as Kafka lists a dead broker until its session
times out."""

from __future__ import annotations

import time
from collections.abc import Callable

import asyncpg

from app.storage import database, node_presence
from app.storage.node_presence import LiveNode

__all__ = ["LiveNode", "NodeListing", "NodePresence", "live_nodes"]


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


class NodeListing:
    """The other nodes one process lists as brokers: the live ones, and each node it listed before
    whose presence has lapsed, for `lapse_s` after this process first found it gone (never as a
    leader or coordinator: every node answers itself as those). Kafka's controller likewise lists
    a broker that died until its session times out (broker.session.timeout.ms, 9 s), and clients
    rely on it: librdkafka re-finds a coordinator it waits for when a connection to the dead one
    fails, which it tries only while the broker is in its metadata; a broker gone from a Metadata
    answer is dropped with its connection attempts, and a request waiting for it as its group
    coordinator (send_offsets_to_transaction's TxnOffsetCommit) then waited for good
    (confluentinc/librdkafka#5511). Per process, in memory: a node restarted with its id is live
    again at once; a process that never listed a node does not list it after its death."""

    def __init__(self, lapse_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._lapse_s = lapse_s
        self._clock = clock
        self._listed: dict[int, LiveNode] = {}  # by id: each node listed, at its last live address
        self._gone_since: dict[int, float] = {}  # by id: when this process first found it gone

    def listed(self, live: list[LiveNode]) -> list[LiveNode]:
        """The nodes to list, given the live ones (a node id once)."""
        now = self._clock()
        live_by_id = {node.node_id: node for node in live}
        for node_id in self._listed.keys() - live_by_id.keys():
            since = self._gone_since.setdefault(node_id, now)
            if now - since >= self._lapse_s:
                del self._listed[node_id], self._gone_since[node_id]
        for node_id in live_by_id.keys() & self._gone_since.keys():
            del self._gone_since[node_id]  # back (restarted with its id)
        self._listed.update(live_by_id)
        return sorted(self._listed.values())
