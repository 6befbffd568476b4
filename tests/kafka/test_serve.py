"""`txbroker serve` and its Kafka listener: the loopback-without-auth rule covers it, flags that
are not HOST:PORT are refused, and every worker of `--workers N` serves it."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import httpx

from app.cli import listening_refusal
from app.runtime.listening_sockets import bound_accepting_socket
from app.settings import Settings
from tests.conftest import REPO_ROOT
from tests.kafka.clients import ConfluentKafka, create_topic

LISTEN_STATE = "0A"  # TCP_LISTEN in /proc/net/tcp


def test_the_listening_rule_covers_the_kafka_listener():
    assert listening_refusal(Settings(kafka_listener="127.0.0.1:9092"), None) is None
    assert listening_refusal(Settings(kafka_listener="[::1]:9092"), None) is None
    assert listening_refusal(Settings(kafka_listener="off"), None) is None
    refusal = listening_refusal(Settings(kafka_listener="0.0.0.0:9092"), None)
    assert refusal is not None and "refusing to open the Kafka listener on 0.0.0.0 without authentication" in refusal
    assert listening_refusal(Settings(kafka_listener="0.0.0.0:9092", auth="required"), None) is None
    assert listening_refusal(Settings(kafka_listener="0.0.0.0:9092", allow_anonymous=True), None) is None
    assert "is not HOST:PORT" in listening_refusal(Settings(kafka_listener="9092"), None)
    assert "is not HOST:PORT" in listening_refusal(Settings(kafka_advertised_listener="host-without-port"), None)


def test_serve_refuses_a_non_loopback_kafka_listener_without_authentication(database_url):
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--kafka-listener", "0.0.0.0:0", "--database-url", database_url],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "refusing to open the Kafka listener on 0.0.0.0 without authentication" in result.stderr


def _listening_sockets(port: int) -> int:
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return sum(1 for row in rows if int(row[1].split(":")[1], 16) == port and row[3] == LISTEN_STATE)


def test_every_worker_serves_the_kafka_listener(server_process, database_url):
    # A port of our own, held as `serve` holds its Kafka port: bound with address and port reuse and
    # never listening, so the kernel hands it no connection, the node's claim passes it (it is no
    # live listener), and the workers bind theirs beside it.
    with bound_accepting_socket("127.0.0.1", 0) as holder:
        port = holder.getsockname()[1]
        process = server_process(
            "--database-url", database_url, "--workers", "2", env={"TXBROKER_KAFKA_LISTENER": f"127.0.0.1:{port}"}
        )
        assert _listening_sockets(port) == 2, "each worker listens on the Kafka port"
        with httpx.Client(base_url=process.url, timeout=60) as client:
            server = SimpleNamespace(client=client, extra={"kafka_bootstrap": f"127.0.0.1:{port}"})
            create_topic(server, "workers", 1)
            sent = [{"value": f"{i}".encode()} for i in range(50)]
            client = ConfluentKafka()
            # Each producer and consumer is a connection of its own, which the kernel gives to either worker.
            for chunk in range(5):
                client.produce(server, "workers", sent[chunk * 10 : chunk * 10 + 10])
            assert [r.value for r in client.consume(server, "workers", 0, 50)] == [m["value"] for m in sent]
