"""A server with a Kafka listener shared by a test module (a fresh server per test costs ~0.5 s);
its tests use topic names of their own."""

from __future__ import annotations

import re

import pytest

from tests.conftest import start_server_on_fresh_database, stop_in_process_server


@pytest.fixture(scope="module")
def module_kafka_server(request, postgres):
    name = "kafka_" + re.sub(r"\W", "_", request.module.__name__.rsplit(".", 1)[-1])
    running = start_server_on_fresh_database(postgres, name, kafka_listener="127.0.0.1:0")
    yield running
    stop_in_process_server(running)
