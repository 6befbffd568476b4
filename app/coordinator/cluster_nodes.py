"""Which nodes serve on this database: each node announces itself, with the address it advertises,
for as long as it serves, shows itself alive by a heartbeat, and any node lists the live ones
(storage/node_presence.py: through PostgreSQL's own sessions, no table). A node that stops or dies
leaves the list by itself, and so does one that hangs (its heartbeats stop); each process lists it
a while longer (NodeListing), as Kafka lists a dead broker until its session times out."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import Callable
from typing import NamedTuple

import asyncpg

from app.storage import database, node_presence
from app.storage.node_presence import LiveNode

__all__ = ["ListedNodes", "LiveNode", "NodeListing", "NodePresence", "live_nodes", "partition_leader"]

log = logging.getLogger(__name__)

# The partitions of Kafka's __consumer_offsets and __transaction_state (offsets.topic.num.partitions
# and transaction.state.log.num.partitions, 50 by default), over which a key's coordinator is found.
COORDINATOR_PARTITIONS = 50


class NodePresence:
    """This node's announcement: a connection of its own, named after the node, held open while it
    serves, with a heartbeat on it every node_presence.HEARTBEAT_INTERVAL_S (a task of the event
    loop that announced it: a loop that stops running stops the heartbeats, and the node leaves
    the list). Invariant: the node is listed exactly while that connection is open and its
    heartbeats keep coming; when PostgreSQL drops the connection (a restart, a failover, a network
    cut), or its server no longer takes writes (a failover that left the old primary running, as a
    standby or read-only, where the other nodes no longer look), the next heartbeat announces the
    node again on a new one, to the read-write server."""

    def __init__(self, database_url: str) -> None:
        self._database_url = database_url
        self._connection: asyncpg.Connection | None = None
        self._heartbeats: asyncio.Task | None = None

    async def announce(self, node: LiveNode) -> bool:
        """Opens the connection, names it after the node and starts the heartbeats; False when the
        name is too long for PostgreSQL (the connection is held all the same, and other nodes do
        not list this one)."""
        await self.withdraw()
        fits = await self._open(node)
        self._heartbeats = asyncio.create_task(self._beat_while_announced(node), name=f"kafka-node {node.node_id}")
        return fits

    async def _open(self, node: LiveNode) -> bool:
        connection = await database.connect(self._database_url)
        try:
            fits = await node_presence.announce(connection, node)
        except BaseException:
            connection.terminate()
            raise
        self._connection = connection
        return fits

    async def _beat_while_announced(self, node: LiveNode) -> None:
        """Never ends by itself: a heartbeat that fails (PostgreSQL away) is logged once, and the
        next one tries again; heartbeats that stopped would take a live node off the list."""
        failing = False
        while True:
            await asyncio.sleep(node_presence.HEARTBEAT_INTERVAL_S)
            try:
                await self._beat(node)
            except Exception as error:
                if not failing:
                    log.warning(
                        "kafka-node %d: no heartbeat on PostgreSQL (%r), retried every %.0f s: the other nodes "
                        "may stop listing this one until a heartbeat succeeds",
                        node.node_id,
                        error,
                        node_presence.HEARTBEAT_INTERVAL_S,
                    )
                failing = True
            else:
                if failing:
                    log.info("kafka-node %d: its heartbeats succeed again: listed by the other nodes", node.node_id)
                failing = False

    async def _beat(self, node: LiveNode) -> None:
        assert self._connection is not None, "announce() first"
        try:
            takes_writes = await node_presence.beat(self._connection)
        except Exception:
            if not self._connection.is_closed():
                raise
            await self._open(node)  # dropped by PostgreSQL: announced again, listed at once
            return
        if not takes_writes:
            # A failover left the old primary running, a standby or read-only: the other nodes read
            # the new primary, where this node is not announced. Leave the old server, as the pool
            # does, and announce on the read-write one (if there is none yet, this heartbeat fails
            # and the next one, on the closed connection, looks again).
            log.warning(
                "kafka-node %d: its presence's PostgreSQL server no longer takes writes (a standby, or set "
                "read-only: a failover?); announcing this node again on the read-write server of the database URL",
                node.node_id,
            )
            self._connection.terminate()  # at once: PostgreSQL ends the session when the socket closes
            await self._open(node)

    async def withdraw(self) -> None:
        heartbeats, self._heartbeats = self._heartbeats, None
        if heartbeats is not None:
            heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeats
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()


async def live_nodes(pool: asyncpg.Pool) -> list[LiveNode]:
    """The nodes announced on this database, one per node id."""
    async with pool.acquire() as conn:
        return await node_presence.live_nodes(conn)


class ListedNodes(NamedTuple):
    """The nodes a process lists, each once: those alive, and those listed only because their
    presence lapsed a moment ago (dead, stopped or hung: NodeListing), what Kafka calls a fenced
    broker (registered with its controller, no longer heartbeating)."""

    live: list[LiveNode]
    lapsed: list[LiveNode]

    def on(self, protocol: str) -> ListedNodes:
        """The nodes as a client of a listener of `protocol` reaches them (LiveNode.on): each at its
        address for that listener, those without one left out, as a Kafka broker answers a request
        with the endpoints of the listener it came in on and leaves out a broker without it. The
        leaders and coordinators named on such a connection are then dealt over the nodes listed
        there, so a client is never sent to a node it cannot reach by its protocol."""
        return ListedNodes(
            [node for node in (n.on(protocol) for n in self.live) if node is not None],
            [node for node in (n.on(protocol) for n in self.lapsed) if node is not None],
        )

    @property
    def every(self) -> list[LiveNode]:
        """Every node listed, alive or lapsed, by id."""
        return sorted([*self.live, *self.lapsed])

    def leader(self, topic: str, partition: int) -> int:
        """The id of the node every node names the partition's leader (its one replica and ISR)
        while they list the same live nodes: partition_leader over the live ones, never a lapsed
        one."""
        return partition_leader(topic, partition, [node.node_id for node in self.live])

    def coordinator(self, internal_topic: str, key: str) -> LiveNode:
        """The live node every node names the coordinator of a group (internal_topic
        `__consumer_offsets`) or of a transactional id (`__transaction_state`): as in Kafka, the
        leader of the internal topic's partition the key hashes to (of COORDINATOR_PARTITIONS,
        Kafka's default count), clients (KafkaJS's cluster) expecting every broker to name the same
        one."""
        by_id = {node.node_id: node for node in self.live}
        partition = zlib.crc32(key.encode()) % COORDINATOR_PARTITIONS
        return by_id[partition_leader(internal_topic, partition, list(by_id))]


def partition_leader(topic: str, partition: int, live_node_ids: list[int]) -> int:
    """The node that leads a partition among the live ones, by id: the topic's partitions dealt
    round-robin over the live nodes in the order of their ids, from a node that a stable hash of
    the topic's name picks (CRC-32: Python's hash() of a str is salted per process), as Kafka's
    controller deals a new topic's partitions over its brokers. Every node computes the same
    leader from the same live nodes, which is what Kafka's clients expect of a cluster (KafkaJS
    runs one fetcher per leader: two nodes naming two leaders made two fetchers fetch one
    partition), and a topic's partitions are spread evenly (KafkaJS's tests count on 9 partitions
    on 3 brokers being 3 each). When the live nodes change (a node dies, stops, its heartbeats
    lapse, or comes back) most leaders move; any node still serves any partition (they share
    PostgreSQL), so a client that still sends to an old leader that lives is served, and the
    leader named is only where clients are sent."""
    if not live_node_ids:
        raise ValueError(f"no live node to lead {topic}-{partition}: expected at least the node answering")
    ordered = sorted(live_node_ids)
    return ordered[(zlib.crc32(topic.encode()) + partition) % len(ordered)]


class NodeListing:
    """The other nodes one process lists as brokers: the live ones, and each node it listed before
    whose presence has lapsed, for `lapse_s` after this process first found it gone (never as a
    leader or coordinator: ListedNodes.leader and .coordinator name live nodes only). Kafka's
    controller likewise lists a broker that died until its session times out
    (broker.session.timeout.ms, 9 s), and clients rely on it: librdkafka re-finds a coordinator it
    waits for when a connection to the dead one fails, which it tries only while the broker is in
    its metadata; a broker gone from a Metadata answer is dropped with its connection attempts, and
    a request waiting for it as its group coordinator (send_offsets_to_transaction's
    TxnOffsetCommit) then waited for good (confluentinc/librdkafka#5511). Per process, in memory: a
    node restarted with its id is live again at once; a process that never listed a node does not
    list it after its death."""

    def __init__(self, lapse_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._lapse_s = lapse_s
        self._clock = clock
        self._listed: dict[int, LiveNode] = {}  # by id: each node listed, at its last live address
        self._gone_since: dict[int, float] = {}  # by id: when this process first found it gone

    def listed(self, live: list[LiveNode]) -> ListedNodes:
        """The nodes to list, given the live ones (a node id once): those, and the lapsed ones."""
        now = self._clock()
        live_by_id = {node.node_id: node for node in live}
        for node_id in self._listed.keys() - live_by_id.keys():
            since = self._gone_since.setdefault(node_id, now)
            if now - since >= self._lapse_s:
                del self._listed[node_id], self._gone_since[node_id]
        for node_id in live_by_id.keys() & self._gone_since.keys():
            del self._gone_since[node_id]  # back (restarted with its id)
        self._listed.update(live_by_id)
        return ListedNodes(sorted(live_by_id.values()), sorted(self._listed[node_id] for node_id in self._gone_since))
