"""Reads answered only once the database's synchronous standby has what they saw
(docs/operations-high-availability.md, What readers see).

A commit whose wait for the synchronous standby ended otherwise (its session cancelled or
terminated, the primary restarted after a crash) is visible on the primary and lost by a failover.
A read that shows it (a transaction's state CompleteCommit that comes back Ongoing, a committed
offset, a high watermark that goes back, a console page with a record that is then gone) would
lead its reader to act on what the database then takes back. The core's reads that a person or a
tool acts on call `confirmed_by_the_standby` after reading and before answering; the hot paths
(fetch, ListOffsets) have their own use of the barrier, which answers a reader caught up instead of
an error (app/coordinator/fetch.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from app.errors import BrokerError, DatabaseUnavailable
from app.storage.replication_barrier import READ_WAIT_MIN_S, ReplicationBarrier

__all__ = ["READ_WAIT_MIN_S", "ReplicationBarrier", "confirmed_by_the_standby", "reads_confirmed_by_the_standby"]


async def confirmed_by_the_standby(barrier: ReplicationBarrier | None, what: str) -> None:
    """Returns once the synchronous standby has everything the caller read before this call: at
    once without a synchronous standby (nothing is committed then) or without a barrier (a core
    used outside a server: tools, tests). Raises DatabaseUnavailable (COORDINATOR_NOT_AVAILABLE,
    retriable; the Kafka door answers each API's retriable code for it) when the standby has not
    confirmed within READ_WAIT_MIN_S. `what`: what was read, for the error's message."""
    if barrier is not None and not await barrier.confirm(READ_WAIT_MIN_S):
        raise DatabaseUnavailable(
            f"{what}, as read, is not confirmed by the database's synchronous standby after "
            f"{READ_WAIT_MIN_S:g} s (it is away or slow), so a failover could take it back: retry "
            f"(the answer comes once the standby has caught up)"
        )


@contextlib.asynccontextmanager
async def reads_confirmed_by_the_standby(barrier: ReplicationBarrier | None, what: str) -> AsyncIterator[None]:
    """The block's reads, confirmed by the standby (`confirmed_by_the_standby`) when the block ends,
    whether it returns or raises a BrokerError from what it read: an absence (a topic or partition
    not found) is as much a read as a row, and a deletion the standby lacks comes back with a
    failover; unconfirmed, the block's error gives way to DatabaseUnavailable. Its own
    DatabaseUnavailable (PostgreSQL away: nothing was read) is raised at once."""
    try:
        yield
    except DatabaseUnavailable:
        raise
    except BrokerError:
        await confirmed_by_the_standby(barrier, what)
        raise
    await confirmed_by_the_standby(barrier, what)
