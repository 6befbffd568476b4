"""Per-group wake-ups: the JoinGroups and SyncGroups waiting in this process for a group to change
(the rest of its members to rejoin, its leader to sync) re-read it as soon as a change to that group
commits here, whichever door or worker task made it (a Kafka request, an HTTP consumer's heartbeat or
leave, DeleteGroups, a session expiry). A change to another group wakes none of them. A change made
in another process wakes them by its NOTIFY (ClassicGroups.listen_for_changes), or at the waiters'
poll when that notification is lost (classic_groups.POLL_S).

Invariants: a waiter takes its group's event before it reads the group, so a change committed
between its read and its wait still wakes it; a change replaces the group's event with a fresh one
after setting it; an event is kept only while a waiter holds it (a weak reference), so groups nobody
waits for cost nothing.
"""

from __future__ import annotations

import asyncio
import weakref


class GroupWakeUps:
    def __init__(self) -> None:
        self._events: weakref.WeakValueDictionary[str, asyncio.Event] = weakref.WeakValueDictionary()

    def before_read(self, group_id: str) -> asyncio.Event:
        """What a waiter waits on after reading `group_id`: set by the next change to it committed here."""
        event = self._events.get(group_id)
        if event is None:
            event = self._events[group_id] = asyncio.Event()
        return event

    def changed(self, group_id: str) -> None:
        """A change to `group_id` has committed (after the commit, never before: a waiter woken
        earlier would read the old row and wait again)."""
        event = self._events.pop(group_id, None)
        if event is not None:
            event.set()
