"""GroupWakeUps' rules, without I/O: a change wakes the waiters of its own group only, each wait
takes the event of the next change, and groups nobody waits for keep nothing."""

from __future__ import annotations

import asyncio

from app.coordinator.group_wake_ups import GroupWakeUps


def test_a_change_wakes_only_the_waiters_of_its_group():
    async def scenario():
        wake_ups = GroupWakeUps()
        seen_g, also_g, seen_h = wake_ups.before_read("g"), wake_ups.before_read("g"), wake_ups.before_read("h")
        assert seen_g is also_g  # one event per group, however many wait
        wake_ups.changed("h")
        assert seen_h.is_set() and not seen_g.is_set()
        wake_ups.changed("g")
        assert seen_g.is_set()
        fresh = wake_ups.before_read("g")
        assert fresh is not seen_g and not fresh.is_set()  # the next wait waits for the next change

    asyncio.run(scenario())


def test_groups_nobody_waits_for_keep_nothing():
    async def scenario():
        wake_ups = GroupWakeUps()
        wake_ups.changed("nobody-waits")  # nothing to wake, nothing kept
        seen = wake_ups.before_read("g")
        del seen  # the waiter answered
        return wake_ups

    assert len(asyncio.run(scenario())._events) == 0
