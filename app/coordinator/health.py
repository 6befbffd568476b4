"""Whether the core can serve: its database reachable (ReachabilityProbe, on a connection of its own:
a busy pool is not an unreachable database), how busy its request pool is (pool_usage, which
/metrics shows), and the errors that mean it cannot (a front door answers them as transient:
`unavailable`)."""

from __future__ import annotations

from app.errors import DatabaseUnavailable
from app.storage.database import CONNECTION_ERRORS, CommitNotReplicated, PoolUsage, ReachabilityProbe, pool_usage

__all__ = ["CONNECTION_ERRORS", "PoolUsage", "ReachabilityProbe", "pool_usage", "unavailable"]


def unavailable(error: BaseException) -> DatabaseUnavailable:
    """What a request that met `error` (one of CONNECTION_ERRORS) is answered: COORDINATOR_NOT_AVAILABLE,
    retriable, as Kafka's coordinators answer a request whose write to their log failed. Nothing
    is acknowledged; what it may have written is found by its retry (a duplicate produce answered
    with its offsets, an EndTxn with the transaction's outcome)."""
    if isinstance(error, CommitNotReplicated):
        return DatabaseUnavailable(
            "the database's synchronous standby did not confirm this request's commit (its wait was "
            "cancelled), so a failover could lose it: it is not acknowledged; retry it (it is safe to "
            "retry): the retry answers what was written",
        )
    return DatabaseUnavailable(
        "the database is unavailable; nothing was changed by this request unless it reports "
        "otherwise later: retry it (it is safe to retry)",
    )
