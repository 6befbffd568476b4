"""How the console shows numbers, durations, times, text previews, and the URLs of its pages (pure
functions, the templates' filters and globals)."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import quote


def format_number(value: int | float | None) -> str:
    return "—" if value is None else f"{value:,}"


def format_compact(value: int | float | None) -> str:
    if value is None:
        return "—"
    for limit, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.1f}".rstrip("0").rstrip(".") + suffix
    return f"{value:,}" if isinstance(value, int) else f"{value:.1f}"


def format_duration(ms: int | None) -> str:
    if ms is None or ms < 0:
        return "—"
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{int(seconds)} s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{hours // 24} d {hours % 24} h"


# The last moment a date can name (9999-12-31 23:59:59.999 UTC). A record's timestamp is whatever its
# producer sent, up to 2^63-1 ms (Kafka's and the API's bound): a later one is shown as its number.
LATEST_DATED_MS = 253_402_300_799_999


def format_utc(ms: int | None) -> str:
    if ms is None or ms < 0:
        return "—"
    if ms > LATEST_DATED_MS:
        return f"{ms:,} ms since the epoch (after the year 9999)"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def format_iso(ms: int) -> str:
    """For `<time datetime>`: only a moment up to LATEST_DATED_MS has one."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def preview(text: str | None, length: int = 80) -> str:
    if text is None:
        return ""
    flat = " ".join(text.split()) if len(text) < 10 * length else " ".join(text[: 10 * length].split())
    return flat if len(flat) <= length else flat[: length - 1] + "…"


def _path_segment(value: str) -> str:
    return quote(value, safe="")


def transaction_url(transactional_id: str, suffix: str = "", query: str = "") -> str:
    """The page of a transactional id (with `suffix`, an action of it), `query` (e.g. "confirm=abort")
    joined to whatever query the URL already has."""
    # "." and ".." would be dot segments that browsers resolve away: they travel in the query.
    if transactional_id in (".", ".."):
        url = f"/console/transactions/{suffix}?id={_path_segment(transactional_id)}"
        return f"{url}&{query}" if query else url
    url = f"/console/transactions/{_path_segment(transactional_id)}{suffix}"
    return f"{url}?{query}" if query else url


def group_url(group_id: str) -> str:
    if group_id in (".", ".."):
        return f"/console/groups/?id={_path_segment(group_id)}"
    return f"/console/groups/{_path_segment(group_id)}"


def topic_url(topic: str) -> str:
    return f"/console/topics/{_path_segment(topic)}"


def partition_url(topic: str, partition: int) -> str:
    return f"{topic_url(topic)}/partitions/{partition}"
