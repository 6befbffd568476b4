"""A Kafka client that goes away while its request is being answered is an ordinary disconnect. Under
uvloop (the loop `txbroker serve` runs), once the client has reset the connection, the answer's
write raised RuntimeError ("the handler is closed"), which the listener logged as an unexpected
error with its traceback (seen with librdkafka's consumers closing)."""

from __future__ import annotations

import dataclasses
import datetime
import socket
import struct
import time
from types import SimpleNamespace

import httpx

from app.runtime.listening_sockets import bound_accepting_socket
from tests.kafka.clients import create_topic
from tests.kafka.raw import RawConnection
from tests.kafka.test_fetch_read_ahead import fetch_request


def test_a_client_gone_before_its_answer_is_no_error_of_the_node(server_process, database_url):
    with bound_accepting_socket("127.0.0.1", 0) as holder:
        port = holder.getsockname()[1]
        process = server_process("--database-url", database_url, env={"TXBROKER_KAFKA_LISTENER": f"127.0.0.1:{port}"})
        with httpx.Client(base_url=process.url, timeout=60) as client:
            server = SimpleNamespace(client=client, extra={"kafka_bootstrap": f"127.0.0.1:{port}"})
            create_topic(server, "gone", 1)
            request = fetch_request(server, 12, "gone", [(0, 0)], 1 << 20)
            long_poll = dataclasses.replace(request, max_wait=datetime.timedelta(milliseconds=500), min_bytes=1)
            for _ in range(3):  # the answer, after 500 ms, goes to a connection the client reset
                connection = RawConnection(f"127.0.0.1:{port}")
                connection.send(long_poll)
                connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                connection.close()
            time.sleep(1.5)
            assert client.get("/v1/health").status_code == 200
        log = process.log_path.read_text()
        assert "unexpected error" not in log and "Traceback" not in log, log[-3000:]
