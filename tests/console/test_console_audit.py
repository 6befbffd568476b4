"""The console's audit log page, over real HTTP on real PostgreSQL: the entries GET /v1/audit shows,
each with its door (`source`) and client address, filtered by door, principal and action, a page at
a time, with the API's access rule (Describe on the Cluster)."""

from __future__ import annotations

import asyncio
import re
from html import unescape

import asyncpg
import httpx
from confluent_kafka.admin import AdminClient, NewTopic

from app.console import pages
from tests.api.test_transactions import TxnProducer
from tests.conftest import RunningServer
from tests.console.abort_form import abort_from_the_console
from tests.console.test_console_acls import allow

ADMIN_TOKEN = "console-audit-test-admin-token-0123456789"


def _rows(page: str) -> list[list[str]]:
    """The audit table's rows, each cell as its text."""
    table = page.split("<tbody>")[1].split("</tbody>")[0] if 'id="audit"' in page else ""
    return [
        [
            re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", cell))).strip()
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        ]
        for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)
    ]


def _next_page(page: str) -> str | None:
    found = re.search(r'<a class="button small" href="([^"]+)" rel="next">', page)
    return found.group(1).replace("&amp;", "&") if found else None


def test_entries_of_every_door_with_their_client_address_filtered_and_paged(make_server) -> None:
    server: RunningServer = make_server(kafka_listener="127.0.0.1:0")
    client = server.client
    client.post("/v1/topics", json={"name": "audited-http", "partitions": 1}).raise_for_status()
    admin = AdminClient({"bootstrap.servers": server.extra["kafka_bootstrap"]})
    admin.create_topics([NewTopic("audited-kafka", 1, 1)])["audited-kafka"].result(30)  # Kafka's CreateTopics
    client.post("/v1/topics", json={"name": "audited-console", "partitions": 1}).raise_for_status()
    producer = TxnProducer(client, "audited-writer")
    producer.init()
    producer.send("audited-console", 0, "v")
    assert abort_from_the_console(client, server.url, "audited-writer").status_code == 303

    api = {e["entry_id"]: e for e in client.get("/v1/audit").json()["entries"]}
    page = client.get("/console/audit").text
    rows = _rows(page)
    assert [int(row[0]) for row in rows] == sorted(api, reverse=True), "every entry, newest first"
    for row in rows:
        entry = api[int(row[0])]
        assert row[2:7] == [
            entry["principal"],
            entry["source"],
            entry["client_address"] or "—",
            entry["action"],
            entry["resource"],
        ]
    doors = {row[3]: row for row in rows}
    assert {"http", "kafka", "console"} <= set(doors)
    assert re.fullmatch(r"127\.0\.0\.1:\d+", doors["console"][4])
    assert [row[6] for row in rows if row[3] == "kafka"] == ["audited-kafka"]

    # Filters: by door, principal and action (each alone and together).
    kafka_rows = _rows(client.get("/console/audit", params={"source": "kafka"}).text)
    assert [row[6] for row in kafka_rows] == ["audited-kafka"]
    aborts = _rows(client.get("/console/audit", params={"action": doors["console"][5]}).text)
    assert [row[3] for row in aborts] == ["console"]
    assert _rows(client.get("/console/audit", params={"source": "kafka", "principal": "nobody"}).text) == []
    refused = client.get("/console/audit", params={"source": "<script>"})
    assert refused.status_code == 400 and refused.headers["content-type"].startswith("text/html")
    assert "<script>" not in refused.text

    # Paging: 60 more entries make two pages of 50, the second continuing below the first.
    for i in range(60):
        client.post("/v1/topics", json={"name": f"audited-{i}", "partitions": 1}).raise_for_status()
    first = client.get("/console/audit").text
    second_url = _next_page(first)
    assert second_url is not None and len(_rows(first)) == 50
    second = client.get(second_url).text
    ids = [int(row[0]) for row in _rows(first) + _rows(second)]
    assert ids == sorted(api.keys() | set(range(max(api) + 1, max(api) + 61)), reverse=True)
    assert _next_page(second) is None


def test_a_filter_that_matches_little_reads_a_bounded_part_of_the_log_a_page(
    module_server: RunningServer, monkeypatch
) -> None:
    """A page reads at most the scan budget's entries; a filter that matches none of them offers to
    read on, and the next pages reach the match."""
    monkeypatch.setattr(pages, "AUDIT_SCAN_BUDGET", 100)

    async def write_entries() -> None:
        conn = await asyncpg.connect(module_server.database_url)
        try:
            await conn.execute(
                "INSERT INTO audit_log (timestamp_ms, principal, source, action, resource, details, client_address) "
                "VALUES (1700000000000, 'rare', 'kafka', 'delete topic', 'rare-topic', '', '10.0.0.1:9')"
            )
            await conn.execute(
                "INSERT INTO audit_log (timestamp_ms, principal, source, action, resource, details, client_address) "
                "SELECT 1700000000000, 'common', 'http', 'create topic', 'c' || g, '', '10.0.0.2:9' "
                "FROM generate_series(1, 250) g"
            )
        finally:
            await conn.close()

    asyncio.run(write_entries())
    client = module_server.client
    url = "/console/audit?principal=rare"
    pages_read = 0
    while True:
        page = client.get(url).text
        pages_read += 1
        if _rows(page):
            break
        assert "100 entries read for this page" in page
        url = _next_page(page)
        assert url is not None and pages_read < 5
    assert _rows(page)[0][2:7] == ["rare", "kafka", "10.0.0.1:9", "delete topic", "rare-topic"]
    assert pages_read == 3  # 250 common entries above it: read 100 at a time


def test_the_audit_page_needs_describe_on_the_cluster_as_the_api(make_server) -> None:
    server: RunningServer = make_server(auth="required", admin_token=ADMIN_TOKEN)
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)
    admin.post("/v1/principals", json={"name": "viewer"}).raise_for_status()
    token = admin.post("/v1/principals/viewer/keys").json()["token"]
    viewer = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert viewer.get("/v1/audit").status_code == 403
    refused = viewer.get("/console/audit")
    assert refused.status_code == 403 and "CLUSTER_AUTHORIZATION_FAILED" in refused.text
    allow(admin, "Cluster", "txbroker-cluster", "Describe")

    async def hostile_entry() -> None:  # a transactional id an abort names may be any text
        conn = await asyncpg.connect(server.database_url)
        try:
            await conn.execute(
                "INSERT INTO audit_log (timestamp_ms, principal, source, action, resource, details, client_address) "
                "VALUES (1700000000000, 'viewer', 'console', 'abort transaction', '<img src=x onerror=alert(1)>', "
                "'<script>alert(2)</script>', '[::1]:5')"
            )
        finally:
            await conn.close()

    asyncio.run(hostile_entry())
    assert viewer.get("/v1/audit").status_code == 200
    page = viewer.get("/console/audit")
    assert page.status_code == 200
    assert "<img src=x" not in page.text and "<script>alert" not in page.text
    newest = _rows(page.text)[0]
    assert newest[2:8] == [
        "viewer",
        "console",
        "[::1]:5",
        "abort transaction",
        "<img src=x onerror=alert(1)>",
        "<script>alert(2)</script>",
    ]
    assert any(row[5] == "create principal" and row[6] == "viewer" for row in _rows(page.text))
    admin.close()
    viewer.close()
