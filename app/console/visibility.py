"""What the console shows a principal: what the API would show it. Describe on the Cluster lets a
principal into the console and shows it the cluster's aggregates (counts, totals); every topic,
transactional id and group in a page is one it may Describe, as the API's listings and descriptions
filter them, and a partition's records, producers and markers need Read on its topic, as the API's
reads of them do. Without this a principal allowed into the console read every topic's records and
saw every transaction and group, whatever its ACLs said.

With `auth` off every caller is the anonymous super user, who sees everything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request

from app.console.queries.transaction_health import LsoPin, Overdue
from app.console.queries.transaction_history import HistoryPage, WrittenMarker
from app.coordinator.authorizer import Operation, Principal, ResourceType, authorize, is_allowed
from app.coordinator.transaction_metadata import TransactionMetadata
from app.storage.groups.groups import Group, Member

# Rows one read takes once a page's first read found some hidden (a principal that sees few of many
# topics or groups): fewer round trips to find a page's worth.
HIDDEN_SKIP_READ = 1000

T = TypeVar("T")
K = TypeVar("K")


class Visibility:
    """The page's principal's view: predicates, checks that raise the resource's *_AUTHORIZATION_FAILED,
    and filters of the rows a page read."""

    def __init__(self, principal: Principal) -> None:
        self.principal = principal

    def topic(self, name: str) -> bool:
        return is_allowed(self.principal, Operation.DESCRIBE, ResourceType.TOPIC, name)

    def group(self, group_id: str) -> bool:
        return is_allowed(self.principal, Operation.DESCRIBE, ResourceType.GROUP, group_id)

    def transactional_id(self, transactional_id: str) -> bool:
        return is_allowed(self.principal, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id)

    def require(self, operation: Operation, resource_type: ResourceType, name: str) -> None:
        authorize(self.principal, operation, resource_type, name)

    def shown_id(self, transactional_id: str | None) -> str | None:
        """A transactional id named beside something the principal may see: None unless it may
        Describe the id too."""
        return transactional_id if transactional_id is not None and self.transactional_id(transactional_id) else None

    def transaction(self, meta: TransactionMetadata) -> TransactionMetadata:
        """The transaction with the partitions and groups the principal may Describe, as the API's
        DescribeTransactions shows it."""
        return dataclasses.replace(
            meta,
            partitions=[p for p in meta.partitions if self.topic(p.topic)],
            groups=[g for g in meta.groups if self.group(g)],
        )

    def history(self, page: HistoryPage) -> HistoryPage:
        return dataclasses.replace(
            page,
            transitions=[
                dataclasses.replace(
                    t,
                    partitions=[(topic, p) for topic, p in t.partitions if self.topic(topic)],
                    groups=[g for g in t.groups if self.group(g)],
                )
                for t in page.transitions
            ],
        )

    def markers(self, markers: list[WrittenMarker]) -> list[WrittenMarker]:
        return [m for m in markers if self.topic(m.topic)]

    def overdue(self, overdue: Overdue) -> Overdue:
        """The overdue transactions the principal may Describe (the total stays the cluster's count)."""
        return dataclasses.replace(
            overdue, transactions=[t for t in overdue.transactions if self.transactional_id(t.transactional_id)]
        )

    def ids_shown(self, rows: list[T]) -> list[T]:
        """Rows of something the principal may see (a partition's producers, markers, a pin of the
        LSO, a pending offset) that name a transactional id: None where it may not Describe it."""
        return [dataclasses.replace(row, transactional_id=self.shown_id(row.transactional_id)) for row in rows]

    def pins(self, pins: list[LsoPin]) -> list[LsoPin]:
        return self.ids_shown([pin for pin in pins if self.topic(pin.topic)])

    def group_members(self, group: Group, members: list[Member]) -> tuple[Group, list[Member]]:
        """The members' subscriptions and assignments, of the topics the principal may Describe (the
        members of the page only: the row's other keys, such as a Kafka group's classic state, are
        no assignment)."""
        assignment = {
            m.member_id: {topic: parts for topic, parts in group.assignment[m.member_id].items() if self.topic(topic)}
            for m in members
            if m.member_id in group.assignment
        }
        return (
            dataclasses.replace(group, assignment=assignment),
            [dataclasses.replace(m, topics=[t for t in m.topics if self.topic(t)]) for m in members],
        )


async def visible_page(
    read: Callable[[K | None, int], Awaitable[list[T]]],
    after: K | None,
    size: int,
    visible: Callable[[T], bool],
    position: Callable[[T], K],
) -> tuple[list[T], bool]:
    """A page of `size` rows the principal may see, from a keyset listing `read(after, limit)`, and
    whether more follow. Hidden rows are skipped before the page is cut, as the API's listings skip
    them: a page is never short while more follow, and its next page starts after a row the
    principal may see (a hidden name never travels in a link)."""
    found: list[T] = []
    limit = size + 1
    while len(found) <= size:
        rows = await read(after, limit)
        found += [row for row in rows if visible(row)]
        if len(rows) < limit:
            break
        after = position(rows[-1])
        limit = HIDDEN_SKIP_READ  # the principal sees few of these: read on in larger steps
    return found[:size], len(found) > size


def visibility(request: Request) -> Visibility:
    """The view of the principal the console's page wrapper authenticated."""
    return Visibility(request.state.console_principal)
