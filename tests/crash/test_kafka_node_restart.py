"""A txbroker node SIGKILLed and restarted with its id and port, the only node serving its groups:
the time no node could hear the members does not count against their sessions and rebalances, as a
Kafka broker restarted loads its groups with every member's session begun anew (and Kafka's clients
find their coordinator again)."""

from __future__ import annotations

import time

from kio.schema.errors import ErrorCode as KafkaError

from tests.crash.test_kafka_database_outage import CANARY_SESSION, OUTLASTED, _joined, _synced
from tests.kafka import raw_groups
from tests.kafka.clients import WAIT_S
from tests.kafka.raw import RawConnection
from tests.kafka.test_nodes import held_port

NODE_ID = 3


def _node(server_process, database_url: str, port: int):
    env = {
        "TXBROKER_KAFKA_LISTENER": f"127.0.0.1:{port}",
        "TXBROKER_NODE_ID": str(NODE_ID),
        "TXBROKER_GROUP_MIN_SESSION_TIMEOUT_MS": "100",
        "TXBROKER_GROUP_SESSION_CHECK_INTERVAL_MS": "50",
    }
    return server_process("--database-url", database_url, env=env)


def test_a_member_keeps_its_place_across_a_restart_of_the_only_node_longer_than_its_session(
    server_process, database_url
):
    """A static member alone in its Stable group, whose node is SIGKILLed and restarted (the same id,
    the same port) after longer than its session timeout, is still the group's member: the restarted
    node's first session check puts every session off by the time since the last heartbeat any
    member sent (no node was up to hear one). Before, that check evicted every member at once,
    before their clients could reconnect. The canary, a member of another group with a far shorter
    session, sends nothing after the restart: its eviction shows the session check has run since."""
    with held_port() as holder:
        port = holder.getsockname()[1]
        bootstrap = f"127.0.0.1:{port}"
        node = _node(server_process, database_url, port)
        with RawConnection(bootstrap) as connection:
            static = _joined(connection, "restarted", instance="restarted-0")
            _synced(connection, "restarted", static, {static.member_id: b"mine"}, "restarted-0")
            canary = _joined(connection, "restart-canary", session=CANARY_SESSION)
            _synced(connection, "restart-canary", canary, {canary.member_id: b""})
        killed = time.monotonic()
        node.kill()
        while time.monotonic() < killed + OUTLASTED.total_seconds() + 0.5:
            time.sleep(0.05)  # down longer than the member's session
        _node(server_process, database_url, port)
        with RawConnection(bootstrap) as connection:
            deadline = time.monotonic() + WAIT_S
            while [m.member_id for m in raw_groups.describe(connection, "restart-canary").members] == [
                canary.member_id
            ]:
                assert time.monotonic() < deadline, "the canary's session never lapsed after the restart"
                time.sleep(0.02)
            answer = raw_groups.heartbeat(
                connection, "restarted", static.member_id, static.generation_id, "restarted-0"
            )
            assert answer.error_code == KafkaError.none, answer
            [described] = raw_groups.describe(connection, "restarted").members
            assert (described.member_id, described.group_instance_id) == (static.member_id, "restarted-0")
