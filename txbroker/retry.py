"""Retrying retriable errors with exponential backoff and jitter (Kafka's retry.backoff.ms and
retry.backoff.max.ms, KIP-580), within a deadline.

What is retriable is the error's own `retriable` flag (txbroker.errors): CONCURRENT_TRANSACTIONS,
COORDINATOR_*, NOT_COORDINATOR, REBALANCE_IN_PROGRESS, UNSTABLE_OFFSET_COMMIT, UNKNOWN_SERVER_ERROR,
and connection errors. Everything else is raised at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from txbroker.errors import TxbrokerError, TxbrokerTimeoutError

log = logging.getLogger("txbroker")
T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    initial_ms: int = 100
    max_ms: int = 1000
    jitter: float = 0.2

    def delay_s(self, attempt: int, error: BaseException | None = None) -> float:
        """Delay before retry number `attempt` (0-based); a server's Retry-After wins when longer."""
        delay_ms = min(self.max_ms, self.initial_ms * (2 ** min(attempt, 30)))
        delay_ms *= 1 + random.uniform(-self.jitter, self.jitter)
        retry_after = getattr(error, "retry_after_s", None)
        return max(delay_ms / 1000, min(retry_after or 0, self.max_ms / 1000 * 5))


async def retrying(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    timeout_s: float,
    backoff: Backoff,
    on_retry: Callable[[TxbrokerError], None] | None = None,
) -> T:
    """`await call()` until it succeeds or raises a non-retriable error; a retriable error past the
    deadline becomes TxbrokerTimeoutError (chained to the last error)."""
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        try:
            return await call()
        except TxbrokerError as error:
            if not error.retriable:
                raise
            delay = backoff.delay_s(attempt, error)
            if time.monotonic() + delay > deadline:
                raise TxbrokerTimeoutError(
                    f"{what} did not succeed within {timeout_s:g}s; last error: {error}"
                ) from error
            log.info("%s: %s; retrying in %.0f ms", what, error, delay * 1000)
            if on_retry is not None:
                on_retry(error)
            attempt += 1
            await asyncio.sleep(delay)
