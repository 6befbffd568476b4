"""Kafka's ConsumerProtocol messages (a member's subscription and assignment) as the classic group
protocol reads them for describe, lag and the console: every version each client sends."""

from __future__ import annotations

from app.coordinator.classic_groups import assigned_partitions, subscribed_topics


def test_every_version_of_the_consumer_protocol_is_read():
    """Regression: each version is read with its own schema (a v0-v2 subscription, which
    kafka-python and aiokafka send, read with v3's ran out of bytes: their members' subscribed
    topics were recorded empty)."""
    v0 = bytes.fromhex("000000000002000161000162ffffffff")
    v1 = bytes.fromhex("000100000001000161ffffffff00000000")
    assert subscribed_topics("consumer", [("range", v0), ("roundrobin", v1)]) == ["a", "b"]
    assignment_v0 = bytes.fromhex("000000000001000161000000020000000000000003ffffffff")
    assert assigned_partitions("consumer", assignment_v0) == {"a": [0, 3]}
    assert assigned_partitions("connect", assignment_v0) == {}
