"""The classic group protocol's pure rules, with no I/O: when a rebalance may complete (the initial
delay, pending members, the deadline), which requests a replaced static member is fenced on, and
what counts as a static member asking for what it had."""

from __future__ import annotations

import base64

from app.coordinator.classic_groups import (
    PREPARING,
    STABLE,
    _completion_due,
    _same_subscription,
    fenced_instance_error,
    static_member_id,
)
from app.errors import ErrorCode

NOW = 1_000_000


def _group(joined: list[bool], pending: dict[str, int] | None = None, initial_delay=None, deadline=NOW + 5000):
    return {
        "state": PREPARING,
        "deadline_ms": deadline,
        "members": {f"m{i}": {"joined": j, "group_instance_id": f"instance-{i}"} for i, j in enumerate(joined)},
        "pending": pending or {},
        "initial_delay": initial_delay,
    }


def test_a_rebalance_completes_once_everyone_rejoined_and_no_pending_member_may_still_join():
    assert _completion_due(_group([True, True]), NOW)
    assert not _completion_due(_group([True, False]), NOW)
    assert not _completion_due(_group([True], pending={"p": NOW + 1}), NOW)
    assert _completion_due(_group([True], pending={"p": NOW}), NOW)  # its session lapsed
    assert _completion_due(_group([True, False], pending={"p": NOW + 1}, deadline=NOW), NOW)
    assert not _completion_due({**_group([True]), "state": STABLE}, NOW)


def test_the_first_rebalance_waits_for_its_delay_only():
    delay = {"until_ms": NOW + 1, "limit_ms": NOW + 10, "member_added": False}
    assert not _completion_due(_group([True], initial_delay=delay), NOW)
    due = {**delay, "until_ms": NOW}
    assert _completion_due(_group([True], pending={"p": NOW + 1}, initial_delay=due), NOW)


def test_only_a_request_naming_an_instance_id_another_member_has_is_fenced():
    group = _group([True, True])
    assert static_member_id(group, "instance-1") == "m1"
    assert fenced_instance_error(group, "g", "m1", "instance-1") is None
    assert fenced_instance_error(group, "g", "m0", None) is None
    assert fenced_instance_error(group, "g", "old", "unknown-instance") is None
    error = fenced_instance_error(group, "g", "old", "instance-1")
    assert error is not None and error.code == ErrorCode.FENCED_INSTANCE_ID
    assert fenced_instance_error(None, "g", "old", "instance-1") is None


def _protocols(*named: tuple[str, bytes]) -> list[list[str]]:
    return [[name, base64.b64encode(data).decode()] for name, data in named]


def test_a_restarted_static_member_asks_for_what_it_had_when_its_protocols_and_topics_are_the_same():
    # ConsumerProtocolSubscription v1: topics ["a"], no user data, owned partitions differ.
    owned_none = bytes.fromhex("000100000001000161ffffffff00000000")
    owned_some = bytes.fromhex("000100000001000161ffffffff000000010001610000000100000000")
    other_topic = bytes.fromhex("000100000001000162ffffffff00000000")
    same = _same_subscription("consumer", _protocols(("range", owned_some)), _protocols(("range", owned_none)))
    assert same
    assert not _same_subscription("consumer", _protocols(("range", owned_none)), _protocols(("range", other_topic)))
    assert not _same_subscription("consumer", _protocols(("range", owned_none)), _protocols(("roundrobin", owned_none)))
    assert not _same_subscription("connect", _protocols(("v1", b"x")), _protocols(("v1", b"y")))
