"""A consumer group's lag on the console's group pages when it is far behind on a partition of many
transactions, over real HTTP on real PostgreSQL: lag counts records, not markers, but a page counts
at most MARKERS_COUNTED markers per committed offset (not every marker of the partition, every few
seconds while the page is open), and past them shows the lag as the upper bound it then is. The
markers are written with SQL (tests/many_transactions.py)."""

from __future__ import annotations

import asyncio
import re
from html import unescape

from app.storage.groups.group_offsets import MARKERS_COUNTED
from tests.conftest import RunningServer
from tests.many_transactions import HIGH_WATERMARK, write_many_transactions


def _lag_cell(page: str, anchor: str) -> str:
    row = page.split(anchor)[1].split("</tr>")[0]
    cells = re.findall(r'<td class="num mono[^"]*">(.*?)</td>', row, re.S)
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", "", cells[-1]))).strip()


def test_a_group_far_behind_on_many_transactions_shows_a_bounded_lag(server: RunningServer) -> None:
    """Regression: the lag's marker count read every marker between the committed offset and the
    high watermark, for each committed partition of each group on the page, at each live refresh:
    a million markers behind was a million index entries per partition per page."""
    client = server.client
    client.post("/v1/topics", json={"name": "many-transactions", "partitions": 1}).raise_for_status()
    asyncio.run(write_many_transactions(server.database_url, "many-transactions"))
    near_end = HIGH_WATERMARK - 2 * (MARKERS_COUNTED // 2)  # MARKERS_COUNTED / 2 markers ahead
    for group, offset in (("far-behind", 0), ("near-the-end", near_end)):
        client.post(
            f"/v1/groups/{group}/offsets/commit",
            json={"offsets": [{"topic": "many-transactions", "partition": 0, "offset": offset}]},
        ).raise_for_status()

    # Far behind: counted up to MARKERS_COUNTED (+1, to know there are more): at most this.
    bound = f"≤ {HIGH_WATERMARK - MARKERS_COUNTED - 1:,}"
    far = client.get("/console/groups/far-behind").text
    assert _lag_cell(far, 'href="/console/topics/many-transactions/partitions/0?offset=0') == bound
    assert re.search(rf"Lag {bound} records past", re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", far))))
    groups = client.get("/console/groups").text
    assert _lag_cell(groups, 'href="/console/groups/far-behind"') == bound

    # Near the end: every marker ahead counted, the lag exact (records, not markers).
    near = client.get("/console/groups/near-the-end").text
    exact = f"{MARKERS_COUNTED // 2:,}"
    assert _lag_cell(near, f'href="/console/topics/many-transactions/partitions/0?offset={near_end}') == exact
    assert _lag_cell(groups, 'href="/console/groups/near-the-end"') == exact
