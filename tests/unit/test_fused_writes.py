"""WriteStatement.then: two statements become one whose parameters and WITH queries do not clash."""

from __future__ import annotations

import pytest

from app.storage.log.fused_writes import WriteStatement

FIRST = WriteStatement(
    "a AS (\n    SELECT $1::int AS x\n), b AS (\n    SELECT $2::int AS y\n)", "SELECT pg_notify('c', '') FROM a", (1, 2)
)
SECOND = WriteStatement("c AS (\n    SELECT $1::int + $2::int AS z\n)", "SELECT pg_notify('c', '') FROM c", (3, 4))


def test_the_second_statement_s_parameters_are_numbered_after_the_first_s():
    fused = FIRST.then(SECOND)
    assert fused.args == (1, 2, 3, 4)
    assert "SELECT $3::int + $4::int AS z" in fused.sql
    assert "SELECT $1::int AS x" in fused.sql and "SELECT $2::int AS y" in fused.sql
    assert fused.query_names == ["a", "b", "c"]
    assert fused.sql.startswith("WITH a AS (")
    assert fused.final.splitlines() == [
        "SELECT pg_notify('c', '') FROM a",
        "UNION ALL",
        "SELECT pg_notify('c', '') FROM c",
    ]


def test_statements_that_name_a_query_alike_are_refused():
    with pytest.raises(ValueError, match=r"\['a'\]"):
        FIRST.then(WriteStatement("a AS (\n    SELECT 1\n)", "SELECT pg_notify('c', '') FROM a", ()))


def test_the_statements_that_the_hot_paths_fuse_name_their_queries_apart():
    from app.storage.log import append, markers
    from app.storage.transactions import transaction_log

    save = transaction_log._SAVE_QUERIES
    for other in (append._WRITE_APPENDS_QUERIES, markers._WRITE_ALL_QUERIES):
        fused = WriteStatement(other, "SELECT 1", ()).then(WriteStatement(save, "SELECT 1", ()))
        assert len(set(fused.query_names)) == len(fused.query_names) >= 8
