"""What a consumer reads (Kafka's SubscriptionState): the subscribed topics with their rebalance
listeners (group-managed assignment) or a manual assignment, the adopted assignment and its
generation, a position per assigned partition, and the paused partitions.

Invariants:
- Positions and pauses exist only for assigned partitions: adopting an assignment that revokes a
  partition drops both, as it does for a partition assigned again that another member may have
  owned since (not `kept`): revoked, then assigned, it starts again from the committed offset.
- A revoked partition stays assigned, with its position, while on_revoke runs (`revoking`), as in
  Kafka's onPartitionsRevoked: the listener commits the positions (commit() without offsets),
  reads position() and may seek(); it is not fetched meanwhile. The adopted assignment replaces
  it when the listener returns or raises (`RebalanceEvent.release_revoked`).
- A position is the offset of the next record poll() returns for its partition.
- `assignment_changed` is set when what poll() should read changes (a subscribe(), or a heartbeat
  that brought another assignment): a long poll in flight then returns early.
- `acknowledged_generation` (what the heartbeats send as `generation_id`) is the adopted
  generation only once its revocations are done: the pre-revocation auto-commit (made before the
  event is returned) and on_revoke have ended, when the event's `release_revoked()` runs. The server
  gives the revoked partitions to their next owners only then (its revocation barrier), so a commit
  in on_revoke lands before the next owner reads from the committed offset.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from txbroker.errors import IllegalStateError
from txbroker.records import TopicPartition
from txbroker.wire import NO_GENERATION

Listener = Callable[[set[TopicPartition]], Any]


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class RebalanceEvent:
    """What changed when poll() adopted a new assignment: on_revoke(revoked), then
    `release_revoked()` (whether or not the listener raised: the revoked partitions leave the
    assignment, the adopted one takes its place), then on_assign(assigned). After them poll()
    adopts again what changed meanwhile (a membership lost while they ran) before it fetches."""

    revoked: set[TopicPartition]
    assigned: set[TopicPartition]
    on_revoke: Listener | None
    on_assign: Listener | None
    release_revoked: Callable[[], None] = _nothing

    def revoke_call(self) -> tuple[Listener, set[TopicPartition]] | None:
        return None if self.on_revoke is None or not self.revoked else (self.on_revoke, self.revoked)

    def assign_call(self) -> tuple[Listener, set[TopicPartition]] | None:
        return None if self.on_assign is None or not self.assigned else (self.on_assign, self.assigned)


class SubscriptionState:
    def __init__(self) -> None:
        self.topics: list[str] | None = None  # subscribed (group-managed); None: manual assignment
        self.on_assign: Listener | None = None
        self.on_revoke: Listener | None = None
        self.generation = NO_GENERATION  # of the adopted assignment
        # The adopted generation once its revocations are done (see the module's doc).
        self.acknowledged_generation = NO_GENERATION
        self.revocations_done = asyncio.Event()  # set when it changes: a heartbeat tells the server now
        self.assignment: frozenset[TopicPartition] = frozenset()
        # While on_revoke runs: the revoked partitions (still in `assignment`, not fetched) and the
        # adopted assignment that replaces `assignment` when it returns (`_release_revoked`).
        self.revoking: frozenset[TopicPartition] = frozenset()
        self._adopting: frozenset[TopicPartition] | None = None
        self.positions: dict[TopicPartition, int] = {}
        self.paused: set[TopicPartition] = set()
        self.assignment_changed = asyncio.Event()

    @property
    def subscribed(self) -> bool:
        return self.topics is not None

    def subscribe(self, topics: list[str], on_assign: Listener | None, on_revoke: Listener | None) -> None:
        self.topics = topics
        self.on_assign, self.on_revoke = on_assign, on_revoke
        self.assignment_changed.set()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        if self.subscribed:
            raise IllegalStateError("assign() on a subscribed consumer: unsubscribe() first")
        self.assignment = frozenset(TopicPartition(*tp) for tp in partitions)
        self.positions = {tp: offset for tp, offset in self.positions.items() if tp in self.assignment}

    def unsubscribe(self) -> None:
        self.topics = None
        self.assignment, self.revoking, self._adopting = frozenset(), frozenset(), None
        self.positions.clear()
        self.generation = self.acknowledged_generation = NO_GENERATION

    def revoke_on_leave(self, not_yet: frozenset[TopicPartition] = frozenset()) -> set[TopicPartition]:
        """Leaving the group (close(), unsubscribe()) revokes every assigned partition but those
        being revoked already, whose on_revoke is running (it called close() or unsubscribe()): as
        Kafka's, the listener is not called twice for a partition. `not_yet`: revoking ones whose
        on_revoke has not started (a rebalance's auto-commit before it is in flight), revoked by the
        leave then. All of them are `revoking` from then on (not fetched) until the consumer leaves."""
        leaving = set(self.assignment - self.revoking) | set(self.assignment & not_yet)
        self.revoking = self.assignment
        return leaving

    def is_adopted(self, generation: int, assignment: frozenset[TopicPartition]) -> bool:
        adopted = self.assignment if self._adopting is None else self._adopting
        return (generation, assignment) == (self.generation, adopted)

    def adopt(
        self, generation: int, assignment: frozenset[TopicPartition], kept: frozenset[TopicPartition]
    ) -> RebalanceEvent:
        """Makes a group's assignment the one poll() reads. Partitions of the current assignment not
        `kept` (owned by this member throughout since its adoption) are revoked, even when assigned
        again: they lose their position and pause, and the assigned ones among them are reported as
        assigned again. With an on_revoke to run, the revoked partitions stay assigned, with their
        positions, until the event's `release_revoked()` (after the listener); else at once."""
        continuing = self.assignment & kept & assignment
        revoked, added = set(self.assignment - continuing), set(assignment - continuing)
        self.generation = generation
        event = RebalanceEvent(revoked, added, self.on_revoke, self.on_assign, self._revocations_ended)
        self.revoking, self._adopting = frozenset(revoked), assignment
        if event.revoke_call() is None:
            self._release_revoked()
        return event

    def _revocations_ended(self) -> None:
        """The event's `release_revoked()`: on_revoke (and the auto-commit before it) ended, so the
        revoked partitions leave the assignment and the generation is acknowledged."""
        self._release_revoked()
        if self.acknowledged_generation != self.generation:
            self.acknowledged_generation = self.generation
            self.revocations_done.set()

    def _release_revoked(self) -> None:
        """The revoked partitions leave the assignment (their positions and pauses go), the adopted
        one takes its place. Once per adoption: called again, nothing."""
        if self._adopting is None:
            return
        for tp in self.revoking:
            self.positions.pop(tp, None)
            self.paused.discard(tp)
        self.assignment, self.revoking, self._adopting = self._adopting, frozenset(), None

    def require_assigned(self, partition: TopicPartition, what: str) -> TopicPartition:
        tp = TopicPartition(*partition)
        if tp not in self.assignment:
            raise IllegalStateError(f"{what}: {tp} is not assigned to this consumer")
        return tp

    def seekable(self, partitions: tuple) -> list[TopicPartition]:
        """The named partitions, or every assigned one when none is named; all must be assigned."""
        chosen = [TopicPartition(*tp) for tp in partitions] or sorted(self.assignment)
        strangers = [tp for tp in chosen if tp not in self.assignment]
        if strangers:
            raise IllegalStateError(f"{strangers} are not assigned to this consumer")
        return chosen

    def missing_positions(self) -> list[TopicPartition]:
        return [tp for tp in self.assignment if tp not in self.positions]

    def fetchable(self) -> list[TopicPartition]:
        """Assigned, not paused, with a position: what a fetch asks for, in a stable order."""
        return [
            tp
            for tp in sorted(self.assignment)
            if tp not in self.paused and tp not in self.revoking and tp in self.positions
        ]

    def assigned_positions(self) -> dict[TopicPartition, int]:
        return {tp: offset for tp, offset in self.positions.items() if tp in self.assignment}
