"""Whether the core can serve: its database reachable, and the errors that mean it is not (a
front door answers them as transient)."""

from __future__ import annotations

from app.storage.database import CONNECTION_ERRORS, CommitNotReplicated, is_reachable

__all__ = ["CONNECTION_ERRORS", "CommitNotReplicated", "is_reachable"]
