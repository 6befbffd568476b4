"""Wakes long-polling fetches when their partitions get data (and, on the same listening connection,
passes other channels' notifications to the callbacks registered for them: `also_listen`).

Every append sends a PostgreSQL NOTIFY on `txbroker_appends` at commit, so a fetch waiting on any
server process wakes whichever server appended. If the listening connection is lost, waiters still
wake every `fallback_s` and re-read: a lost notification delays a long poll, it never loses data,
because the fetch always re-reads the log rather than trusting the notification. The listening
connection is found like the pool's (app/storage/database.py): after a failover it reconnects to the
new primary, and keepalives tell it when its server went silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import asyncpg

from app.storage.database import connect_to_primary
from app.storage.log.partition_log import APPENDS_CHANNEL, notification_key

log = logging.getLogger(__name__)


class AppendNotifier:
    """Invariant: a fetch starts watching its partitions BEFORE it reads them and clears its event
    before each re-read, so an append that commits between the read and the wait still wakes it."""

    def __init__(self, database_url: str, fallback_s: float) -> None:
        self._database_url = database_url
        self.fallback_s = fallback_s
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._connection: asyncpg.Connection | None = None
        self._keeper: asyncio.Task | None = None
        self._other_channels: dict[str, Callable[[str], None]] = {}
        self._first_attempt = asyncio.Event()

    def also_listen(self, channel: str, on_payload: Callable[[str], None]) -> None:
        """Before `start`: each notification on `channel` calls `on_payload(payload)` in the event
        loop. One lost while the connection is down is never replayed: its listener must poll too."""
        self._other_channels[channel] = on_payload

    async def start(self) -> None:
        """Starts listening; returns once the first attempt has listened or failed (within
        `fallback_s`), so that a server ready to serve is woken by what commits from then on."""
        self._keeper = asyncio.create_task(self._keep_listening(), name="append-notifier")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._first_attempt.wait(), self.fallback_s)

    async def stop(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close(timeout=2)

    async def _keep_listening(self) -> None:
        while True:
            try:
                self._connection = await connect_to_primary(self._database_url)
                lost = asyncio.Event()
                self._connection.add_termination_listener(lambda _conn, lost=lost: lost.set())
                await self._connection.add_listener(APPENDS_CHANNEL, self._on_notification)
                for channel, on_payload in self._other_channels.items():
                    await self._connection.add_listener(
                        channel, lambda _conn, _pid, _channel, payload, on_payload=on_payload: on_payload(payload)
                    )
                self._first_attempt.set()
                await lost.wait()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # PostgreSQL restarting: waiters fall back to polling
                self._first_attempt.set()
                log.warning(
                    "notifications unavailable (%s); long polls re-read every %.1fs, group waits at their poll",
                    error,
                    self.fallback_s,
                )
            await asyncio.sleep(self.fallback_s)

    def _on_notification(self, _conn, _pid, _channel, payload: str) -> None:
        for event in self._waiters.get(payload, ()):
            event.set()

    @contextlib.contextmanager
    def watching(self, partitions: list[tuple[int, int]]):
        """An event set whenever one of the (topic_id, partition)s gets an append, while inside."""
        event = asyncio.Event()
        keys = [notification_key(topic_id, partition) for topic_id, partition in partitions]
        for key in keys:
            self._waiters.setdefault(key, set()).add(event)
        try:
            yield event
        finally:
            for key in keys:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiters[key]
