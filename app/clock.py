"""The server's clock, in one place: every timestamp txbroker stores or compares (append times,
transaction start and update times, expiry cut-offs) is milliseconds since the Unix epoch as read
here, so a test or a future monotonic-safe clock has one function to replace."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Wall-clock milliseconds since the Unix epoch (Kafka's timestamp unit)."""
    return int(time.time() * 1000)
