"""No SQL is built from user input: every SQL string in app/ is a literal, or an f-string that
interpolates only module constants (UPPER_CASE names), int(...) conversions, the internal
`where_sql` of TransactionLog.claim (and UnitOfWork.claim), which every caller passes as a
literal, or the parts of a fused_writes.WriteStatement, which every caller builds from module
constants. Values always travel as query parameters ($1, $2, ...)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
SQL_WORDS = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|WITH|FROM|WHERE)\b")
CONSTANT_NAME = re.compile(r"^_?[A-Z][A-Z0-9_]*$")
INTERNAL_FRAGMENTS = {"where_sql"}
FUSED_WRITES = APP / "storage" / "log" / "fused_writes.py"
# WriteStatement's SQL (checked by test_write_statements_are_constants) and the names fused_writes gives it
STATEMENT_PARTS = {"with_queries", "final", "first_queries", "first_final", "second_queries", "second_final"}


def _allowed(expression: ast.expr, path: Path) -> bool:
    if path == FUSED_WRITES:
        # Composes statements: their parts, renumbered (renumbered(...)), and the WITH queries' names.
        if isinstance(expression, ast.Attribute) and expression.attr in STATEMENT_PARTS:
            return True
        if isinstance(expression, ast.Name) and expression.id in STATEMENT_PARTS:
            return True
        if isinstance(expression, ast.Call) and isinstance(expression.func, ast.Name):
            return expression.func.id == "renumbered" and all(_allowed(a, path) for a in expression.args)
    if isinstance(expression, ast.Name):
        return bool(CONSTANT_NAME.match(expression.id)) or expression.id in INTERNAL_FRAGMENTS
    if isinstance(expression, ast.Call) and isinstance(expression.func, ast.Name):
        return expression.func.id == "int"
    return False


def _sql_fstrings():
    for path in sorted(APP.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                literal = "".join(part.value for part in node.values if isinstance(part, ast.Constant))
                if SQL_WORDS.search(literal):
                    yield path, node


def test_sql_fstrings_interpolate_only_constants():
    offenders = []
    for path, node in _sql_fstrings():
        for part in node.values:
            if isinstance(part, ast.FormattedValue) and not _allowed(part.value, path):
                offenders.append(f"{path.relative_to(APP.parent)}:{node.lineno}: {ast.unparse(part.value)}")
    assert not offenders, "SQL built from non-constant values:\n" + "\n".join(offenders)


def test_no_sql_built_with_format_or_percent():
    offenders = []
    for path in sorted(APP.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "format"
                and isinstance(node.func.value, ast.Constant)
                and SQL_WORDS.search(str(node.func.value.value))
            ):
                offenders.append(f"{path}:{node.lineno}")
            if (
                isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Mod)
                and isinstance(node.left, ast.Constant)
                and SQL_WORDS.search(str(node.left.value))
            ):
                offenders.append(f"{path}:{node.lineno}")
    assert not offenders, offenders


def _is_connection(argument: ast.expr) -> bool:
    return (isinstance(argument, ast.Name) and argument.id == "conn") or (
        isinstance(argument, ast.Attribute) and argument.attr == "conn"
    )


def test_claim_fragments_are_literals():
    """`where_sql` reaches SQL text, so every call that passes it must pass a string literal."""
    calls = 0
    for path in sorted(APP.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("_each_claimed", "claim")
                and node.args
            ):
                # TransactionLog.claim takes the connection first; UnitOfWork.claim has its own.
                candidates = node.args[:2] if node.func.attr == "claim" else node.args[:1]
                fragment = next(a for a in candidates if not _is_connection(a))
                if isinstance(fragment, ast.Name) and fragment.id == "where_sql":
                    continue  # the pass-through inside _each_claimed and UnitOfWork.claim
                calls += 1
                assert isinstance(fragment, ast.Constant) and isinstance(fragment.value, str), (
                    f"{path}:{node.lineno} passes a non-literal SQL fragment"
                )
    assert calls >= 3


def test_write_statements_are_constants():
    """WriteStatement's SQL parts reach SQL text: every construction passes module constants."""
    built = 0
    for path in sorted(APP.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "WriteStatement":
                if path == FUSED_WRITES:
                    continue  # WriteStatement.then, which composes two of them
                built += 1
                for part in node.args[:2]:
                    assert isinstance(part, ast.Name) and CONSTANT_NAME.match(part.id), (
                        f"{path}:{node.lineno} builds a WriteStatement from {ast.unparse(part)}: expected a constant"
                    )
    assert built >= 3
