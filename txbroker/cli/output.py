"""How commands print: human-readable tables and times, or JSON for scripts (--json)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any


def emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=None, sort_keys=False) + "\n")


def print_done(as_json: bool, result: dict, text: str) -> None:
    """What a command that changes something did: `result` as JSON (--json), else `text`."""
    if as_json:
        emit_json(result)
    else:
        print(text)


def _table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells)


def print_table(rows: Sequence[Sequence[Any]], headers: Sequence[str], empty: str) -> None:
    print(_table(rows, headers) if rows else empty)


def print_found(
    as_json: bool, found: list[dict], row: Callable[[dict], Sequence[Any]], headers: Sequence[str], empty: str
) -> None:
    """What a listing command found: as JSON (--json), or as a table of one `row` per item (`empty` if none)."""
    if as_json:
        emit_json(found)
    else:
        print_table([row(item) for item in found], headers, empty)


def format_time(ms: int | None) -> str | None:
    if ms is None or ms < 0:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def open_for_ms(start_ms: int) -> int | None:
    return None if start_ms < 0 else max(0, int(time.time() * 1000) - start_ms)
