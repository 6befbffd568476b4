"""KIP-848's server-side assignors: the target assignment of a consumer group, computed by the
coordinator from the members' subscriptions (app/coordinator/consumer_groups.py), never by a client.

- `uniform` (Kafka's default, UniformAssignor): every member gets as many partitions as any other, to
  one, and keeps as many of those its previous target gave it as that allows (sticky), so that a
  member joining or leaving moves only the partitions it must;
- `range` (Kafka's RangeAssignor): each topic's partitions in consecutive ranges over the members
  subscribed to it, by member id (app/coordinator/assignment.py's, which HTTP's groups use too).

Both are deterministic for the same members, subscriptions, partition counts and previous target.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.coordinator.assignment import range_assignment

UNIFORM = "uniform"
RANGE = "range"
# In Kafka's order of group.consumer.assignors: the first is the default.
SERVER_ASSIGNORS = (UNIFORM, RANGE)
DEFAULT_ASSIGNOR = UNIFORM

Assignment = dict[str, dict[str, list[int]]]  # member id -> topic -> partitions


def uniform_assignment(
    subscriptions: Mapping[str, list[str]], partition_counts: Mapping[str, int], previous: Mapping[str, Mapping]
) -> Assignment:
    """subscriptions: member id -> topics; partition_counts: topic -> partitions (a topic that does
    not exist is left out); previous: the last target (member id -> topic -> partitions)."""
    members = sorted(subscriptions)
    assignment: Assignment = {member: {} for member in members}
    if not members:
        return assignment
    partitions = sorted(
        (topic, p)
        for topic in {t for topics in subscriptions.values() for t in topics}
        for p in range(partition_counts.get(topic, 0))
    )
    eligible = {tp: [m for m in members if tp[0] in subscriptions[m]] for tp in partitions}
    # Each member's fair share: the partitions it can take over those that can take them, at least
    # the floor of the total over every member when all subscribe alike (the usual case), plus one
    # for as many members as the remainder allows.
    floor_quota, extra = divmod(len(partitions), len(members))
    counts = dict.fromkeys(members, 0)
    owner: dict[tuple[str, int], str] = {}

    def give(tp: tuple[str, int], member: str) -> None:
        owner[tp] = member
        counts[member] += 1
        assignment[member].setdefault(tp[0], []).append(tp[1])

    # Sticky: each member keeps its previous partitions up to its floor quota, then, while the
    # remainder lasts, one more.
    kept: dict[str, list[tuple[str, int]]] = {
        m: sorted(
            (topic, p)
            for topic, ps in previous.get(m, {}).items()
            for p in ps
            if (topic, p) in eligible and m in eligible[(topic, p)]
        )
        for m in members
    }
    for member in members:
        for tp in kept[member][:floor_quota]:
            give(tp, member)
    for member in members:
        if extra and len(kept[member]) > floor_quota:
            give(kept[member][floor_quota], member)
            extra -= 1
    # The rest: each to the eligible member with the fewest, below its quota when one is.
    for tp in partitions:
        if tp in owner or not eligible[tp]:
            continue
        under = [m for m in eligible[tp] if counts[m] < floor_quota or (counts[m] == floor_quota and extra)]
        member = min(under or eligible[tp], key=lambda m: (counts[m], m))
        if counts[member] == floor_quota and under:
            extra -= 1
        give(tp, member)
    for member in members:
        for topic in assignment[member]:
            assignment[member][topic].sort()
    return assignment


def target_assignment(
    assignor: str,
    subscriptions: Mapping[str, list[str]],
    partition_counts: Mapping[str, int],
    previous: Mapping[str, Mapping],
) -> Assignment:
    if assignor == RANGE:
        return range_assignment(subscriptions, partition_counts)
    return uniform_assignment(subscriptions, partition_counts, previous)


def preferred_assignor(preferences: list[str | None]) -> str:
    """The group's assignor, as Kafka's coordinator chooses it: the one most of its members name
    (ties by name), the default when none names one."""
    named = sorted(p for p in preferences if p is not None)
    if not named:
        return DEFAULT_ASSIGNOR
    return max(sorted(set(named)), key=named.count)
