"""Rows to dataclasses by column name, never by position: a query may list its columns in any order,
and a column the dataclass needs but the query forgot fails loudly (KeyError) instead of shifting
every later field by one."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import asyncpg

T = TypeVar("T")


def from_row(cls: type[T], row: asyncpg.Record, **computed: Any) -> T:
    """`cls` built from the row's columns of the same names; `computed` supplies (or replaces) fields
    the row holds in another form."""
    return cls(
        **{
            field.name: computed[field.name] if field.name in computed else row[field.name]
            for field in dataclasses.fields(cls)
            if field.init
        }
    )


def all_from_rows(cls: type[T], rows: list[asyncpg.Record]) -> list[T]:
    return [from_row(cls, row) for row in rows]


def count_rows(status: str) -> int:
    """The rows a statement touched, from its status ("DELETE 3", "UPDATE 0")."""
    return int(status.split()[-1])
