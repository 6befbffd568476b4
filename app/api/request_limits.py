"""Limits against resource exhaustion that concern a request's shape, each a setting (app/settings.py).
(The body size and records-per-request limits are in request_bodies.py and the produce path.)"""

from __future__ import annotations

import contextlib

from fastapi import Request

from app.errors import invalid_request
from app.settings import Settings


def check_partition_count(settings: Settings, count: int) -> None:
    if count > settings.max_partitions_per_request:
        raise invalid_request(
            f"the request names {count} partitions: expected at most "
            f"{settings.max_partitions_per_request} (setting max_partitions_per_request); split it"
        )


# The top-level lists of the bodies that name partitions (fetch, ListOffsets, offsets, transactions,
# DeleteRecords, produce), each bounded by max_partitions_per_request.
_PARTITION_LISTS = ("partitions", "offsets")


def check_listed_partitions(settings: Settings, body: object) -> None:
    """check_partition_count on a body as parsed, before its schema validates it: validating costs
    microseconds per entry on the worker's event loop, so a body of a million partitions (58 MB,
    within max_request_bytes) held every other request of the worker for seconds before its count
    was refused. A top-level list that is not a list of partitions is left to the schema."""
    if body.__class__ is dict:
        for key in _PARTITION_LISTS:
            listed = body.get(key)
            if listed.__class__ is list:
                check_partition_count(settings, len(listed))


class LongPollSlots:
    """Caps the long polls one server process holds open at once (`max_concurrent_long_polls`).
    A fetch that finds every slot taken is answered at once (as with max_wait_ms 0) instead of
    failing: the client's next poll comes back later anyway, and no request is refused."""

    def __init__(self, settings: Settings) -> None:
        self.capacity = settings.max_concurrent_long_polls
        self.max_wait_ms = settings.max_wait_ms
        self.in_use = 0

    @staticmethod
    def of(request: Request) -> LongPollSlots:
        return request.app.state.long_poll_slots

    @contextlib.contextmanager
    def wait_budget(self, requested_ms: int):
        """The wait this fetch may have: min(requested, max_wait_ms), or 0 when no slot is free."""
        if requested_ms <= 0 or self.in_use >= self.capacity:
            yield 0
            return
        self.in_use += 1
        try:
            yield min(requested_ms, self.max_wait_ms)
        finally:
            self.in_use -= 1
