"""What the console shows a principal with `--auth required`: what the API would show it, over real
HTTP on real PostgreSQL. Describe on the Cluster lets it in; the topics, transactional ids and
groups of its pages are those it may Describe, and a partition's records need Read on its topic.
Each page is checked whole and as the live block the console's script asks for."""

from __future__ import annotations

import re
import time
from urllib.parse import quote

import httpx
import pytest

from tests.api.test_transactions import TxnProducer
from tests.conftest import RunningServer

ADMIN_TOKEN = "console-acl-test-admin-token-0123456789"
SECRET = "top-secret-payload"


def allow(admin: httpx.Client, resource_type: str, name: str, operation: str, pattern: str = "literal") -> None:
    admin.post(
        "/v1/acls",
        json={
            "principal": "viewer",
            "resource_type": resource_type,
            "pattern_type": pattern,
            "resource_name": name,
            "operation": operation,
        },
    ).raise_for_status()


def admin_and_viewer(server: RunningServer, partitions: int) -> tuple[httpx.Client, httpx.Client]:
    """Clients of the administrator and of a principal `viewer` (no ACL yet), and the topics `public`
    and `secret`."""
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)
    admin.post("/v1/principals", json={"name": "viewer"}).raise_for_status()
    token = admin.post("/v1/principals/viewer/keys").json()["token"]
    viewer = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    for topic in ("public", "secret"):
        admin.post("/v1/topics", json={"name": topic, "partitions": partitions}).raise_for_status()
    return admin, viewer


@pytest.fixture
def secured(make_server) -> tuple[RunningServer, httpx.Client, httpx.Client]:
    """Topics `public` (the viewer may Describe and Read it) and `secret` (not); transactions
    `pub-writer` (it may Describe) and `hidden-writer` (not), each writing to both topics and
    committing offsets for a group; groups `pub-group` (it may Describe) and `hidden-group`."""
    server = make_server(auth="required", admin_token=ADMIN_TOKEN)
    admin, viewer = admin_and_viewer(server, partitions=1)
    for transactional_id, group in (("pub-writer", "pub-group"), ("hidden-writer", "hidden-group")):
        producer = TxnProducer(admin, transactional_id, timeout_ms=300_000)
        producer.init()
        producer.send("public", 0, "public-record")
        producer.send("secret", 0, SECRET)
        for offsets_group in (group, "pub-group"):
            admin.post(
                "/v1/txn/offset-commit",
                json={
                    **producer.ids(),
                    "group_id": offsets_group,
                    "offsets": [{"topic": "secret", "partition": 0, "offset": 1}],
                },
            ).raise_for_status()
    for group in ("pub-group", "hidden-group"):
        admin.post(
            f"/v1/groups/{group}/offsets/commit",
            json={"offsets": [{"topic": t, "partition": 0, "offset": 1} for t in ("public", "secret")]},
        ).raise_for_status()
        admin.post(f"/v1/groups/{group}/heartbeat", json={"member_id": "", "topics": ["public", "secret"]})
    allow(admin, "Cluster", "txbroker-cluster", "Describe")
    allow(admin, "Topic", "public", "Read")
    allow(admin, "TransactionalId", "pub-", "Describe", "prefixed")
    allow(admin, "Group", "pub-", "Describe", "prefixed")
    yield server, admin, viewer
    admin.close()
    viewer.close()


HIDDEN = ("secret", SECRET, "hidden-writer", "hidden-group")


@pytest.mark.parametrize("fragment", [None, "live"])
def test_pages_show_only_what_the_principal_may_describe(secured, fragment: str | None) -> None:
    _server, admin, viewer = secured
    headers = {"X-Console-Fragment": fragment} if fragment else {}
    for path, shown in (
        ("/console", ["public"]),
        ("/console?internal=true", ["public"]),
        ("/console/topics/public", ["public"]),
        ("/console/topics/public/partitions/0", ["public-record", "pub-writer"]),
        ("/console/transactions", ["pub-writer"]),
        ("/console/transactions?state=open", ["pub-writer"]),
        ("/console/transactions/pub-writer", ["public-0"]),
        ("/console/groups", ["pub-group"]),
        ("/console/groups/pub-group", ["public-0"]),
    ):
        page = viewer.get(path, headers=headers)
        assert page.status_code == 200, (path, page.text[:500])
        for text in shown:
            assert text in page.text, (path, text)
        for text in HIDDEN:
            assert text not in page.text, (path, text)
        # What the administrator sees of the same page names them (the check above is not vacuous).
        if path != "/console/topics/public":
            assert any(text in admin.get(path, headers=headers).text for text in HIDDEN), path


def test_pages_of_what_the_principal_may_not_describe_are_refused(secured) -> None:
    _server, admin, viewer = secured
    for path, code in (
        ("/console/topics/secret", "TOPIC_AUTHORIZATION_FAILED"),
        ("/console/topics/secret/partitions/0", "TOPIC_AUTHORIZATION_FAILED"),
        ("/console/topics/secret/partitions/0?offset=0", "TOPIC_AUTHORIZATION_FAILED"),
        # Its records are those of every transaction: Read on it, as on any topic.
        ("/console/topics/__transaction_state/partitions/0", "TOPIC_AUTHORIZATION_FAILED"),
        ("/console/transactions/hidden-writer", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"),
        ("/console/transactions/hidden-writer?confirm=abort", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"),
        ("/console/groups/hidden-group", "GROUP_AUTHORIZATION_FAILED"),
    ):
        for headers in ({}, {"X-Console-Fragment": "live"}, {"X-Console-Fragment": "dialog"}):
            page = viewer.get(path, headers=headers)
            assert page.status_code == 403 and code in page.text, (path, headers, page.status_code)
            assert SECRET not in page.text
        assert admin.get(path).status_code == 200, path


def test_a_page_skips_what_the_principal_may_not_see_before_it_is_cut(secured) -> None:
    """A listing's page is cut after the hidden rows are skipped: no short page while more follow,
    and no hidden name in the link to the next page."""
    server, admin, viewer = secured
    for index in range(60):
        admin.post("/v1/topics", json={"name": f"hidden-{index:02}", "partitions": 1}).raise_for_status()
    for index in range(55):
        admin.post("/v1/topics", json={"name": f"public-{index:02}", "partitions": 1}).raise_for_status()
    allow(admin, "Topic", "public", "Describe", "prefixed")
    first = viewer.get("/console")
    assert first.status_code == 200
    listed = re.findall(r'href="/console/topics/([\w-]+)"', first.text)
    assert listed == ["public", *(f"public-{index:02}" for index in range(49))] and "hidden-" not in first.text
    assert 'after=public-48"' in first.text
    second = viewer.get("/console?after=public-48")
    listed = re.findall(r'href="/console/topics/([\w-]+)"', second.text)
    assert listed == [f"public-{index:02}" for index in range(49, 55)] and "Next page" not in second.text


def test_an_abort_whose_sign_in_lapsed_returns_to_its_page_after_signing_in(make_server) -> None:
    """Signing in again after the abort's POST was turned away leads back to the page the form was
    on, not to the POST's address (as a GET, the page of a transactional id ending in "/abort")."""
    server = make_server(auth="required", admin_token=ADMIN_TOKEN)
    form = "producer_id=1&producer_epoch=0&start_time_ms=1"
    for referer, target in (
        (f"{server.url}/console/transactions/x%2Fy?confirm=abort", "/console/transactions/x%2Fy?confirm=abort"),
        (None, "/console"),
        ("http://elsewhere.example/console/transactions/x", "/console"),
    ):
        headers = {"Origin": server.url, "Content-Type": "application/x-www-form-urlencoded"}
        if referer:
            headers["Referer"] = referer
        turned_away = httpx.post(f"{server.url}/console/transactions/x%2Fy/abort", content=form, headers=headers)
        assert turned_away.status_code == 303
        assert turned_away.headers["location"] == f"/console/login?next={quote(target, safe='')}", referer


def test_the_overviews_warnings_show_the_principals_own_behind_hidden_ones(make_server) -> None:
    """Regression: the overview read the 10 most overdue transactions and the 10 worst LSO pins of
    the cluster, then kept those the principal may see: behind 10 hidden ones its own overdue
    transaction and its pinned partition were never shown, however long they had been open."""
    server = make_server(auth="required", admin_token=ADMIN_TOKEN, abort_timed_out_transaction_interval_ms=3_600_000)
    admin, viewer = admin_and_viewer(server, partitions=12)
    # The hidden ones older and holding back more offsets than the viewer's.
    for n in range(12):
        hidden = TxnProducer(admin, f"hidden-writer-{n}", timeout_ms=1000)
        hidden.init()
        hidden.send("secret", n, *[SECRET] * 5)
    own = TxnProducer(admin, "pub-writer", timeout_ms=1000)
    own.init()
    own.send("public", 0, "public-record")
    allow(admin, "Cluster", "txbroker-cluster", "Describe")
    allow(admin, "Topic", "public", "Describe")
    allow(admin, "TransactionalId", "pub-", "Describe", "prefixed")
    time.sleep(0.6)  # every one open for more than half its timeout

    page = viewer.get("/console").text
    warnings = page.split("Needs attention")[1].split("</section>")[0]
    assert "pub-writer" in warnings and "public-0" in warnings, warnings
    assert "hidden-writer" not in page and "secret" not in page
    admin.close()
    viewer.close()
