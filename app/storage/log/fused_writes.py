"""The last writes of a PostgreSQL transaction sent as one statement.

Every statement is a round trip to PostgreSQL, and on the hot paths a round trip costs about as much
CPU as the work it carries (`python -m bench.statement_count` counts them per request). A write
batch's last writes are independent (its batches, its markers and its transactions' rows,
app/coordinator/batched_writes.py): they touch
different rows and need nothing from each other, so they can be one statement of data-modifying
WITH queries, which PostgreSQL runs to completion together, in one snapshot. Writes that would change
the same row (a partition's head, by a batch and a marker) cannot be fused: one statement may not
change a row twice.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import asyncpg

_PARAMETER = re.compile(r"\$(\d+)")
_QUERY_NAME = re.compile(r"^(?:\), )?(\w+) AS (?:MATERIALIZED )?\($", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class WriteStatement:
    """A statement written as its WITH queries (`with_queries`: "name AS (...), name AS (...)", each
    name at the start of a line) and a final query over them that notifies or returns nothing the
    caller needs (`final`: "SELECT pg_notify(...) FROM name", one column of type void), with its
    arguments ($1, $2, ... in both)."""

    with_queries: str
    final: str
    args: tuple

    @property
    def query_names(self) -> list[str]:
        return _QUERY_NAME.findall(self.with_queries)

    def then(self, other: WriteStatement) -> WriteStatement:
        """Both statements as one: `other`'s parameters are numbered after this one's, its WITH
        queries follow, and the final queries are joined with UNION ALL."""
        with_queries, final = _fused(self.with_queries, self.final, len(self.args), other.with_queries, other.final)
        return WriteStatement(with_queries, final, self.args + other.args)

    @property
    def sql(self) -> str:
        return _statement(self.with_queries, self.final)

    async def execute(self, conn: asyncpg.Connection) -> None:
        await conn.execute(self.sql, *self.args)


def fused(first: WriteStatement | None, then: WriteStatement | None) -> WriteStatement | None:
    """`first` then `then` as one statement; either may be None (nothing to write)."""
    if first is not None and then is not None:
        return first.then(then)
    return first or then


async def execute_fused(conn: asyncpg.Connection, first: WriteStatement | None, then: WriteStatement | None) -> None:
    """Runs `first` then `then` as one statement; either may be None (nothing to write)."""
    statement = fused(first, then)
    if statement is not None:
        await statement.execute(conn)


# The parts are module constants, so the fused texts are few: composed once each, and the same str
# objects every time (asyncpg finds its prepared statement by the text, hashed once).
@functools.lru_cache(maxsize=64)
def _fused(
    first_queries: str, first_final: str, offset: int, second_queries: str, second_final: str
) -> tuple[str, str]:
    shared = sorted(set(_QUERY_NAME.findall(first_queries)) & set(_QUERY_NAME.findall(second_queries)))
    if shared:
        raise ValueError(f"both statements name a query {shared}: expected distinct names, rename one")

    def renumbered(sql: str) -> str:
        return _PARAMETER.sub(lambda match: f"${int(match.group(1)) + offset}", sql)

    return (
        f"{first_queries},\n{renumbered(second_queries)}",
        f"{first_final}\nUNION ALL\n{renumbered(second_final)}",
    )


@functools.lru_cache(maxsize=64)
def _statement(with_queries: str, final: str) -> str:
    return f"WITH {with_queries}\n{final}"
