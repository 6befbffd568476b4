"""A server with a Kafka listener shared by a test module (a fresh server per test costs ~0.5 s);
its tests use topic names of their own."""

from __future__ import annotations

import re

import pytest

from tests.conftest import start_server_on_fresh_database, stop_in_process_server

# Sessions of a few hundred ms let group tests see a session lapse without waiting Kafka's minimum
# (6 s): the shared server lowers group_min_session_timeout_ms, as Kafka's own consumer tests lower
# group.min.session.timeout.ms (AbstractConsumerTest: 100).
BRIEF_SESSIONS_FROM_MS = 100


@pytest.fixture(scope="module")
def module_kafka_server(request, postgres):
    """The module's server; a module that needs settings of its own names them in a dict
    KAFKA_SERVER_SETTINGS."""
    name = "kafka_" + re.sub(r"\W", "_", request.module.__name__.rsplit(".", 1)[-1])
    running = start_server_on_fresh_database(
        postgres,
        name,
        kafka_listener="127.0.0.1:0",
        group_min_session_timeout_ms=BRIEF_SESSIONS_FROM_MS,
        **getattr(request.module, "KAFKA_SERVER_SETTINGS", {}),
    )
    yield running
    stop_in_process_server(running)
