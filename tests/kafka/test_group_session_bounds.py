"""Kafka's group.min.session.timeout.ms and group.max.session.timeout.ms on the Kafka listener: a
JoinGroup whose session timeout is outside the server's bounds is INVALID_SESSION_TIMEOUT (26) and
changes nothing (no member added, replaced or forgotten, no rebalance), whoever sends it: a new
member, a pending one, a member rejoining, a static member restarting. The bounds themselves are
accepted. One server for the module, with Kafka's bounds (6000..1800000 ms)."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys

import pytest
from confluent_kafka import Consumer
from confluent_kafka import KafkaError as ClientError
from kio.schema.errors import ErrorCode as KafkaError

from app.settings import Settings
from tests.conftest import REPO_ROOT, start_server_on_fresh_database, stop_in_process_server
from tests.kafka.clients import WAIT_S, bootstrap, create_topic
from tests.kafka.raw import RawConnection
from tests.kafka.raw_groups import describe, heartbeat, join, sync

# Kafka's defaults of group.min.session.timeout.ms and group.max.session.timeout.ms, the server's.
KAFKA_MIN = datetime.timedelta(milliseconds=6000)
KAFKA_MAX = datetime.timedelta(milliseconds=1_800_000)
ONE_MS = datetime.timedelta(milliseconds=1)
OUTSIDE = (KAFKA_MIN - ONE_MS, KAFKA_MAX + ONE_MS)


@pytest.fixture(scope="module")
def kafka_bounds_server(postgres):
    """The module's server, with the default (Kafka's) session timeout bounds."""
    running = start_server_on_fresh_database(postgres, "kafka_group_session_bounds", kafka_listener="127.0.0.1:0")
    yield running
    stop_in_process_server(running)


def _members(connection, group: str) -> list[tuple[str, str | None]]:
    return sorted((m.member_id, m.group_instance_id) for m in describe(connection, group).members)


def _stable_static_member(connection, group: str, instance: str):
    joined = join(connection, group, instance=instance)
    assert joined.error_code == KafkaError.none
    assert sync(connection, group, joined.member_id, joined.generation_id, {joined.member_id: b"p"}).error_code == (
        KafkaError.none
    )
    return joined


def test_a_new_member_asking_for_a_session_outside_the_bounds_is_refused_and_no_group_appears(kafka_bounds_server):
    with RawConnection(bootstrap(kafka_bounds_server)) as connection:
        for session in OUTSIDE:
            for version, instance in ((3, None), (9, None), (9, "instance")):
                refused = join(connection, "bounds-new", session=session, instance=instance, version=version)
                # Not MEMBER_ID_REQUIRED (v4+): the session is checked before the group is looked at.
                assert refused.error_code == KafkaError.invalid_session_timeout, (session, version, instance)
                assert refused.member_id == ""
        described = describe(connection, "bounds-new")
        assert (described.group_state, described.members) == ("Dead", ())


def test_members_of_a_group_asking_for_a_session_outside_the_bounds_change_nothing(kafka_bounds_server):
    group = "bounds-existing"
    with RawConnection(bootstrap(kafka_bounds_server)) as connection:
        leader = _stable_static_member(connection, group, "leader")
        for session in OUTSIDE:
            # The leader rejoining (which would start a rebalance), the static member restarting
            # under a new member id (which would replace it and fence the old id), a new member.
            for member, instance in ((leader.member_id, "leader"), ("", "leader"), ("", None)):
                refused = join(connection, group, member, session=session, instance=instance)
                assert refused.error_code == KafkaError.invalid_session_timeout, (session, member, instance)
            described = describe(connection, group)
            assert (described.group_state, _members(connection, group)) == ("Stable", [(leader.member_id, "leader")])
        # Still the member it was, in its generation.
        assert heartbeat(connection, group, leader.member_id, leader.generation_id, "leader").error_code == (
            KafkaError.none
        )


def test_a_pending_member_asking_for_a_session_outside_the_bounds_stays_pending(kafka_bounds_server):
    group = "bounds-pending"
    with RawConnection(bootstrap(kafka_bounds_server)) as connection:
        pending = join(connection, group)
        assert pending.error_code == KafkaError.member_id_required
        for session in OUTSIDE:
            refused = join(connection, group, pending.member_id, session=session)
            assert refused.error_code == KafkaError.invalid_session_timeout, session
            assert describe(connection, group).members == ()
        # Its id was not used up: it joins with a session within the bounds.
        joined = join(connection, group, pending.member_id)
        assert (joined.error_code, joined.member_id) == (KafkaError.none, pending.member_id)


def test_the_bounds_themselves_are_accepted(kafka_bounds_server):
    with RawConnection(bootstrap(kafka_bounds_server)) as connection:
        for group, session in (("bounds-at-min", KAFKA_MIN), ("bounds-at-max", KAFKA_MAX)):
            joined = join(connection, group, session=session, instance="alone")
            assert joined.error_code == KafkaError.none, group
            assert _members(connection, group) == [(joined.member_id, "alone")]


def test_confluent_kafka_with_a_session_below_the_minimum_reports_the_error(kafka_bounds_server):
    create_topic(kafka_bounds_server, "bounds-client", 1)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap(kafka_bounds_server),
            "group.id": "bounds-client-group",
            "session.timeout.ms": int((KAFKA_MIN - ONE_MS).total_seconds() * 1000),
            "heartbeat.interval.ms": 1000,
        }
    )
    try:
        consumer.subscribe(["bounds-client"])
        message = consumer.poll(WAIT_S)
        assert message is not None and message.error() is not None
        assert message.error().code() == ClientError.INVALID_SESSION_TIMEOUT, message.error()
        assert consumer.assignment() == []
    finally:
        consumer.close()
    with RawConnection(bootstrap(kafka_bounds_server)) as connection:
        assert describe(connection, "bounds-client-group").members == ()


def test_the_bounds_are_settings_and_the_server_refuses_to_start_with_a_minimum_above_the_maximum(
    kafka_bounds_server,
):
    defaults = Settings()
    assert (defaults.group_min_session_timeout_ms, defaults.group_max_session_timeout_ms) == (6000, 1_800_000)
    with pytest.raises(ValueError, match="group_min_session_timeout_ms .7000. is above group_max_session_timeout_ms"):
        Settings(group_min_session_timeout_ms=7000, group_max_session_timeout_ms=6999)
    result = subprocess.run(
        # (A database, so that a server that did start would not start an embedded PostgreSQL.)
        [sys.executable, "-m", "app.cli", "serve", "--port", "0", "--kafka-listener", "off", "--workers", "1"]
        + ["--database-url", kafka_bounds_server.database_url],
        cwd=REPO_ROOT,
        env={
            **os.environ,
            "TXBROKER_GROUP_MIN_SESSION_TIMEOUT_MS": "7000",
            "TXBROKER_GROUP_MAX_SESSION_TIMEOUT_MS": "6999",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "group_min_session_timeout_ms (7000) is above group_max_session_timeout_ms (6999)" in result.stderr
    assert "Traceback" not in result.stderr
