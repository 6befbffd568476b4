"""Kafka's range assignor, server-side: deterministic for a given set of members and topics.

For each topic, the members subscribed to it (sorted by member id) get consecutive ranges of its
partitions; the first `partitions % members` members get one extra.
"""

from __future__ import annotations

from collections.abc import Mapping


def range_assignment(
    subscriptions: Mapping[str, list[str]], partition_counts: Mapping[str, int]
) -> dict[str, dict[str, list[int]]]:
    """subscriptions: member id -> topics; partition_counts: topic -> partitions (unknown topics
    are left out). Returns member id -> topic -> partitions (every member present)."""
    assignment: dict[str, dict[str, list[int]]] = {member: {} for member in subscriptions}
    topics = sorted({topic for topics in subscriptions.values() for topic in topics})
    for topic in topics:
        count = partition_counts.get(topic)
        if not count:
            continue
        subscribers = sorted(member for member, wanted in subscriptions.items() if topic in wanted)
        per_member, extra = divmod(count, len(subscribers))
        start = 0
        for index, member in enumerate(subscribers):
            size = per_member + (1 if index < extra else 0)
            if size:
                assignment[member][topic] = list(range(start, start + size))
            start += size
    return assignment
