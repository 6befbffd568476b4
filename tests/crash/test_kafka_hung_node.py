"""A node that hangs (SIGSTOP) in the middle of a group's PostgreSQL transaction, holding the group's
row: the other nodes serve the group again once PostgreSQL ends that transaction
(database_idle_in_transaction_timeout_ms), as Kafka's cluster serves a hung coordinator's groups
again once its controller fences it (broker.session.timeout.ms) and the coordinator moves."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import asyncpg
from kio.schema.errors import ErrorCode as KafkaError

from tests.crash.test_kafka_database_outage import _joined, _synced
from tests.kafka import raw_groups
from tests.kafka.clients import WAIT_S
from tests.kafka.raw import RawConnection
from tests.kafka.test_nodes import held_port

# How long the hung node's transaction may wait for its next statement: short, for the test.
IDLE_IN_TRANSACTION_TIMEOUT_MS = 1000


def _node(server_process, database_url: str, node_id: int, port: int):
    env = {
        "TXBROKER_KAFKA_LISTENER": f"127.0.0.1:{port}",
        "TXBROKER_NODE_ID": str(node_id),
        "TXBROKER_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS": str(IDLE_IN_TRANSACTION_TIMEOUT_MS),
        "TXBROKER_GROUP_MIN_SESSION_TIMEOUT_MS": "100",  # the members' brief sessions (_joined)
    }
    return server_process("--database-url", database_url, env=env)


def test_a_node_hung_holding_a_group_holds_it_only_until_postgresql_ends_its_transaction(server_process, database_url):
    """The hung node's JoinGroup was waiting for the group's row (the test held it) when the node was
    stopped; the row, once released, went to that transaction, which then waited for a node that
    sends nothing. A member on the other node then leaves, its LeaveGroup waiting for the row: it
    is answered once PostgreSQL ends the hung node's transaction. Before, the group's row stayed
    held for as long as the node was stopped: no member of the group could join, sync, leave or
    commit on any node, and no session lapse was judged (the check skips a held group)."""
    with held_port() as hung_holder, held_port() as serving_holder:
        hung_port, serving_port = hung_holder.getsockname()[1], serving_holder.getsockname()[1]
        hung = _node(server_process, database_url, 1, hung_port)
        _node(server_process, database_url, 2, serving_port)
        loop = asyncio.new_event_loop()
        holder = loop.run_until_complete(asyncpg.connect(database_url))
        try:
            with (
                RawConnection(f"127.0.0.1:{serving_port}") as serving,
                RawConnection(f"127.0.0.1:{hung_port}") as on_hung,
            ):
                member = _joined(serving, "held")
                _synced(serving, "held", member, {member.member_id: b""})
                held = holder.transaction()
                loop.run_until_complete(held.start())
                loop.run_until_complete(
                    holder.execute("SELECT 1 FROM consumer_groups WHERE group_id = 'held' FOR UPDATE")
                )
                on_hung.send(raw_groups.join_request("held"))
                deadline = time.monotonic() + WAIT_S
                while not loop.run_until_complete(holder.fetchval("SELECT count(*) FROM pg_locks WHERE NOT granted")):
                    assert time.monotonic() < deadline, "the hung node's JoinGroup never waited for the group's row"
                    time.sleep(0.02)
                os.kill(hung.pid, signal.SIGSTOP)
                loop.run_until_complete(held.commit())  # the row goes to the hung node's transaction
                serving.sock.settimeout(WAIT_S)
                started = time.monotonic()
                assert raw_groups.leave(serving, "held", [(member.member_id, None)]) == [KafkaError.none]
                assert time.monotonic() - started < WAIT_S
                assert raw_groups.describe(serving, "held").members == ()
        finally:
            os.kill(hung.pid, signal.SIGCONT)
            loop.run_until_complete(holder.close())
            loop.close()
