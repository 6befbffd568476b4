"""Which Kafka nodes are alive, through PostgreSQL itself (no table for the liveness): each node
holds one connection whose application_name is `kafka-node <id> <host>:<port>` (its Kafka node id
and the address its first listener advertises) for as long as it serves, and asks on it every HEARTBEAT_INTERVAL_S
whether its server takes writes (`beat`, a statement as cheap as `SELECT 1`); the live nodes are
those names in pg_stat_activity whose session showed a sign of life within SESSION_TIMEOUT_S. A
node that stops or dies loses its connection (PostgreSQL ends the session when the socket closes),
so it leaves the list without anyone cleaning up; a node restarted with the same id reappears
with it.

A node that hangs rather than dies (a stopped process, a frozen machine, an event loop blocked)
keeps its socket, and with it its session: its heartbeats stop, its session's `state_change` (when
its last statement ended, stamped by PostgreSQL's clock, which the listing compares with its own
now(): the nodes' clocks never matter) grows old, and past SESSION_TIMEOUT_S it is no longer
listed, as Kafka's controller fences a broker whose heartbeats stop for broker.session.timeout.ms
whatever its sockets do. Its next heartbeat, the moment it resumes, lists it again. Kafka's
numbers: a heartbeat every 2 s (broker.heartbeat.interval.ms), gone after 9 s without one
(broker.session.timeout.ms): a node's event loop late by up to 7 s (a long request, a busy
PostgreSQL) is still listed, and the cost is one statement per node (per worker) every 2 s.

Two kinds of session count as alive whatever their age, judged by the session alone (as before
heartbeats): one whose times PostgreSQL hides from the listing (`state_change` NULL: another role's
session, to a role without pg_read_all_stats; or track_activities off), and one running a statement
(`active`: a heartbeat PostgreSQL is slow to answer; a hung node's session is idle, its last
answer sent).

A node whose machine dies or is cut off closes nothing and beats no more: it leaves the list after
SESSION_TIMEOUT_S, and PostgreSQL's side of its connection ends by TCP keepalive, which the
announcement sets on its session (`tcp_keepalives_*`, `tcp_user_timeout`, as txbroker's own side
of every connection has them in database.py), instead of the kernel's default of about two hours.

A failover may leave the old primary running, demoted to a standby or set read-only: the
announcing connection to it stays open and its heartbeats succeed there, while the other nodes read
the new primary and no longer see the node. The heartbeat's answer says so (False: the server no
longer takes writes), and the node announces itself again on the read-write server
(coordinator/cluster_nodes.NodePresence), as the pool leaves such a server (database._keep_session).

PostgreSQL keeps 63 bytes of an application_name: an announcement that does not fit is refused
(the node then lists only itself).

A node of several Kafka listeners (one per security protocol) also writes the address each
advertises to `kafka_node_listeners` when it announces itself (migration 0019), read with the live
sessions: a row counts only for a node whose session is live, so a node gone needs no clean-up, and
a node restarted with other listeners rewrites its rows. A live node without rows (a node of the
version before, during a rolling upgrade) is listed at its application_name's one address on every
listener, as before (LiveNode.on)."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from app.storage.database import (
    IS_READ_WRITE_SQL,
    KEEPALIVE_COUNT,
    KEEPALIVE_IDLE_S,
    KEEPALIVE_INTERVAL_S,
    TCP_USER_TIMEOUT_MS,
)

PREFIX = "kafka-node "
MAX_APPLICATION_NAME = 63
# Kafka's broker.heartbeat.interval.ms and broker.session.timeout.ms (see the module docstring).
HEARTBEAT_INTERVAL_S = 2.0
SESSION_TIMEOUT_S = 9.0


@dataclass(frozen=True, slots=True, order=True)
class LiveNode:
    """A node and the address it advertises (its first listener's), with each listener's as
    (protocol, host, port), by protocol (none known: a node of the version before)."""

    node_id: int
    host: str
    port: int
    listeners: tuple[tuple[str, str, int], ...] = ()

    def on(self, protocol: str) -> LiveNode | None:
        """The node as a client of a listener of `protocol` reaches it: at its address for that
        listener; None when it has no such listener. A node whose listeners are not known (the
        version before wrote none) is reached at its one address, whatever the protocol."""
        if not self.listeners:
            return self
        for listener_protocol, host, port in self.listeners:
            if listener_protocol == protocol:
                return LiveNode(self.node_id, host, port, self.listeners)
        return None


def application_name(node: LiveNode) -> str | None:
    name = f"{PREFIX}{node.node_id} {node.host}:{node.port}"
    return name if len(name.encode()) <= MAX_APPLICATION_NAME else None


# PostgreSQL's side of the announcing session (ignored on a unix socket, whose peer's death closes it).
_SERVER_KEEPALIVES = {
    "tcp_keepalives_idle": str(KEEPALIVE_IDLE_S),
    "tcp_keepalives_interval": str(KEEPALIVE_INTERVAL_S),
    "tcp_keepalives_count": str(KEEPALIVE_COUNT),
    "tcp_user_timeout": str(TCP_USER_TIMEOUT_MS),
}


async def announce(conn: asyncpg.Connection, node: LiveNode) -> bool:
    """Names this connection after the node (kept open while the node serves), with PostgreSQL's
    keepalives on its side of it; False when the name is too long."""
    name = application_name(node)
    if name is None:
        return False
    if node.listeners:
        await _write_listeners(conn, node)
    await conn.execute(
        "SELECT set_config(name, setting, false) FROM unnest($1::text[], $2::text[]) AS s(name, setting)",
        list(_SERVER_KEEPALIVES),
        list(_SERVER_KEEPALIVES.values()),
    )
    await conn.execute("SELECT set_config('application_name', $1, false)", name)
    return True


async def _write_listeners(conn: asyncpg.Connection, node: LiveNode) -> None:
    """The node's listeners' addresses, in place of those it announced before (a restart with other
    listeners): one statement, rows written only when they change (each worker of a node announces)."""
    await conn.execute(
        "WITH announced AS (SELECT * FROM unnest($2::text[], $3::text[], $4::int[]) AS a(protocol, host, port)), "
        "dropped AS (DELETE FROM kafka_node_listeners l WHERE l.node_id = $1 "
        "AND l.protocol NOT IN (SELECT protocol FROM announced)) "
        "INSERT INTO kafka_node_listeners AS l (node_id, protocol, host, port) "
        "SELECT $1, protocol, host, port FROM announced ORDER BY protocol "
        "ON CONFLICT (node_id, protocol) DO UPDATE SET host = excluded.host, port = excluded.port "
        "WHERE (l.host, l.port) IS DISTINCT FROM (excluded.host, excluded.port)",
        node.node_id,
        [protocol for protocol, _, _ in node.listeners],
        [host for _, host, _ in node.listeners],
        [port for _, _, port in node.listeners],
    )


async def beat(conn: asyncpg.Connection) -> bool:
    """A sign of life on the announcing connection (its session's state_change, when it ends), and
    whether its server still takes writes: False once it is a standby or set read-only, as a
    failover can leave the old primary running (the other nodes then read the new primary, where
    this connection announces nothing: announce again on the read-write server)."""
    return bool(await conn.fetchval(IS_READ_WRITE_SQL))


def _parsed(name: str, listeners: tuple[tuple[str, str, int], ...]) -> LiveNode | None:
    try:
        node_id, address = name[len(PREFIX) :].split(" ", 1)
        host, port = address.rsplit(":", 1)
        return LiveNode(int(node_id), host.strip("[]"), int(port), listeners)
    except ValueError:
        return None


async def live_nodes(conn: asyncpg.Connection, session_timeout_s: float = SESSION_TIMEOUT_S) -> list[LiveNode]:
    """The nodes announced on this database that showed a sign of life within `session_timeout_s`
    (see the module docstring), one per id (the lowest address if two claim one), each with its
    listeners' addresses."""
    rows = await conn.fetch(
        "WITH announced AS (SELECT DISTINCT application_name FROM pg_stat_activity "
        "WHERE datname = current_database() AND starts_with(application_name, $1) "
        "AND (state_change IS NULL OR state = 'active' OR state_change > now() - make_interval(secs => $2))) "
        "SELECT a.application_name, l.protocol, l.host, l.port FROM announced a "
        "LEFT JOIN kafka_node_listeners l "
        "ON l.node_id::text = split_part(substr(a.application_name, $3), ' ', 1) "
        "ORDER BY a.application_name, l.protocol",
        PREFIX,
        session_timeout_s,
        len(PREFIX) + 1,
    )
    listeners: dict[str, list[tuple[str, str, int]]] = {}
    for row in rows:
        found = listeners.setdefault(row["application_name"], [])
        if row["protocol"] is not None:
            found.append((row["protocol"], row["host"], row["port"]))
    by_id: dict[int, LiveNode] = {}
    for node in sorted(filter(None, (_parsed(name, tuple(found)) for name, found in listeners.items()))):
        by_id.setdefault(node.node_id, node)
    return list(by_id.values())
