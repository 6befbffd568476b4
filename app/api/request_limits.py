"""Limits against resource exhaustion that concern a request's shape, each a setting (app/settings.py).
(The body size limit is in request_bodies.py; the core checks a produce's records again, for the
Kafka door too: app/coordinator/produce.py's check_request.)"""

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


def check_record_count(settings: Settings, count: int) -> None:
    if count > settings.max_records_per_request:
        raise invalid_request(
            f"the request carries {count} records: expected at most "
            f"{settings.max_records_per_request} (setting max_records_per_request); split it"
        )


def check_header_count(settings: Settings, count: int) -> None:
    """A request's record headers are bounded over the whole request (max_record_headers_per_request):
    each costs validation and encoding about as a record does, and a bound per record alone would
    leave a request of a few records with millions of headers each (a 64 MiB body holds six million
    empty ones). Its own setting, above the records': a request at the records' bound may still carry
    several headers a record (the SDK's requests, of at most 50,000 records, twenty on average).
    Kafka's clients never meet it: the bound is the HTTP door's only."""
    if count > settings.max_record_headers_per_request:
        raise invalid_request(
            f"the request carries {count} record headers: expected at most "
            f"{settings.max_record_headers_per_request} over all its records (setting "
            f"max_record_headers_per_request); split it, or send fewer headers"
        )


# The top-level lists of the bodies that name partitions (fetch, ListOffsets, offsets, transactions,
# DeleteRecords, produce), each bounded by max_partitions_per_request.
_PARTITION_LISTS = ("partitions", "offsets")


def check_listed_entries(settings: Settings, body: object) -> None:
    """The request's bounds on a body as parsed, before its schema validates it: validating costs a
    step per entry on the worker's event loop, so a body of millions of small entries (partitions,
    records, or one record's headers) within max_request_bytes held every other request of the
    worker for seconds before its count was refused (docs/api.md, Conventions). Counted here, for
    the lists the bounds concern: the partitions (the top-level `partitions` or `offsets`), the
    records (the top-level `records` of POST /v1/topics/{topic}/records and those of each of
    produce's partitions) and their headers. Records are counted before their headers, so that a
    body of millions of records is not walked. An entry that is not what the schema wants is left to
    it. The produce fast path calls this on the body it parsed itself."""
    if body.__class__ is not dict:
        return
    listed_records = []
    for key in _PARTITION_LISTS:
        listed = body.get(key)
        if listed.__class__ is list:
            check_partition_count(settings, len(listed))
            for entry in listed:
                records = entry.get("records") if entry.__class__ is dict else None
                if records.__class__ is list:
                    listed_records.append(records)
    records = body.get("records")
    if records.__class__ is list:
        listed_records.append(records)
    if not listed_records:
        return
    check_record_count(settings, sum(map(len, listed_records)))
    header_count = 0
    for records in listed_records:
        for record in records:
            headers = record.get("headers") if record.__class__ is dict else None
            if headers.__class__ is list:
                header_count += len(headers)
    check_header_count(settings, header_count)


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
