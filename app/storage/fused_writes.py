"""The last writes of a PostgreSQL transaction sent as one statement.

Every statement is a round trip to PostgreSQL, and on the hot paths a round trip costs about as much
CPU as the work it carries (README, "Performance"). A group's last two writes are independent (a
produce group's batches and its transactions' rows, an EndTxn group's markers and its transactions'
rows): they touch different rows and need nothing from each other, so they can be one statement of
data-modifying WITH queries, which PostgreSQL runs to completion together, in one snapshot.
"""

from __future__ import annotations

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
        shared = sorted(set(self.query_names) & set(other.query_names))
        if shared:
            raise ValueError(f"both statements name a query {shared}: expected distinct names, rename one")
        offset = len(self.args)

        def renumbered(sql: str) -> str:
            return _PARAMETER.sub(lambda match: f"${int(match.group(1)) + offset}", sql)

        return WriteStatement(
            f"{self.with_queries},\n{renumbered(other.with_queries)}",
            f"{self.final}\nUNION ALL\n{renumbered(other.final)}",
            self.args + other.args,
        )

    @property
    def sql(self) -> str:
        return f"WITH {self.with_queries}\n{self.final}"

    async def execute(self, conn: asyncpg.Connection) -> None:
        await conn.execute(self.sql, *self.args)
