"""The web console in a real browser (Debian's Chromium driven by Playwright) against a real server on
real PostgreSQL: what a user sees of open, committed, aborted and prepared transactions, the
partition log with its LSO and high watermark, consumer groups, the admin abort with its
confirmation, live updates, the pages without JavaScript, escaping of everything users wrote, and
the sign-in when the server requires credentials. Screenshots go to test-output/console/.

The browser is the system Chromium (scripts/test installs it); nothing is downloaded.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from tests.api.test_transactions import TxnProducer
from tests.conftest import REPO_ROOT, RunningServer
from tests.console.abort_form import abort_from_the_console

pytest.importorskip("playwright.sync_api", reason="the console tests drive a browser with Playwright")
from playwright.sync_api import BrowserContext, Page, expect, sync_playwright  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = REPO_ROOT / "test-output" / "console"
ADMIN_TOKEN = "console-test-admin-token-0123456789"

if not CHROMIUM.exists():
    pytest.skip(
        f"{CHROMIUM} is missing: scripts/test installs Debian's chromium (apt-get install chromium)",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def playwright_driver():
    with sync_playwright() as driver:
        yield driver


@contextmanager
def chromium(driver, javascript: bool = True) -> Iterator[BrowserContext]:
    """The system Chromium with a fresh user data dir, headless."""
    with tempfile.TemporaryDirectory(prefix="txb-chromium-") as profile:
        context = driver.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            java_script_enabled=javascript,
            viewport={"width": 1400, "height": 900},
        )
        context.set_default_timeout(15_000)
        try:
            yield context
        finally:
            context.close()


@pytest.fixture(scope="module")
def browser(playwright_driver) -> Iterator[BrowserContext]:
    with chromium(playwright_driver) as context:
        yield context


class Tab:
    """A page that records script errors and console errors (CSP violations, failed loads)."""

    def __init__(self, context: BrowserContext) -> None:
        self.page: Page = context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))
        self.page.on("console", lambda message: message.type == "error" and self.errors.append(message.text))

    def shot(self, name: str) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)

    def close(self) -> None:
        self.page.close()
        assert self.errors == [], self.errors


@pytest.fixture
def tab(browser) -> Iterator[Tab]:
    opened = Tab(browser)
    yield opened
    opened.close()


# ---- the scenario every page is checked against


def make_scenario(client: httpx.Client) -> None:
    """orders-0: 0 plain | 1-2 committed | 3 COMMIT | 4 aborted | 5 ABORT | 6-7 open (LSO 6, HW 8);
    orders-1: 0 committed | 1 COMMIT; orders-2: 0 prepared (LSO 0, HW 1). Group `readers`: one member,
    committed offset 1 on orders-0, and writer-open's pending transactional offset 2 on orders-1."""
    client.post("/v1/topics", json={"name": "orders", "partitions": 3}).raise_for_status()
    client.post(
        "/v1/topics/orders/records", json={"partition": 0, "records": [{"key": "k0", "value": "plain"}]}
    ).raise_for_status()
    committed = TxnProducer(client, "writer-committed")
    committed.init()
    committed.send("orders", 0, "c1", "c2")
    committed.send("orders", 1, "c3")
    committed.commit()
    aborted = TxnProducer(client, "writer-aborted")
    aborted.init()
    aborted.send("orders", 0, "a1")
    aborted.abort()
    still_open = TxnProducer(client, "writer-open", timeout_ms=300_000)
    still_open.init()
    still_open.send("orders", 0, "o1", "o2")
    client.post(
        "/v1/txn/offset-commit",
        json={**still_open.ids(), "group_id": "readers", "offsets": [{"topic": "orders", "partition": 1, "offset": 2}]},
    ).raise_for_status()
    prepared = TxnProducer(client, "writer-prepared", timeout_ms=300_000)
    prepared.init()
    prepared.send("orders", 2, "p1")
    client.post("/v1/txn/prepare", json=prepared.ids()).raise_for_status()
    client.post("/v1/groups/readers/heartbeat", json={"member_id": "", "topics": ["orders"]}).raise_for_status()
    client.post(
        "/v1/groups/readers/offsets/commit", json={"offsets": [{"topic": "orders", "partition": 0, "offset": 1}]}
    ).raise_for_status()


def transaction_row(page: Page, transactional_id: str):
    return page.locator("#transactions tbody tr").filter(
        has=page.get_by_role("link", name=transactional_id, exact=True)
    )


def log_row(page: Page, offset: int):
    return page.locator(f"tr#o-{offset}")


def fact(page: Page, label: str):
    return (
        page.locator(".fact")
        .filter(has=page.locator(".fact-label").get_by_text(label, exact=True))
        .locator(".fact-value")
    )


# ---- the tests


def test_pages_show_what_the_api_says_and_abort_fences_the_producer(server: RunningServer, tab: Tab) -> None:
    client, page = server.client, tab.page
    make_scenario(client)
    watermarks = client.get("/v1/topics/orders").json()["partitions"]
    assert (watermarks[0]["last_stable_offset"], watermarks[0]["high_watermark"]) == (6, 8)

    # Overview: counts, and the partitions an open transaction holds back, with LSO < HW.
    page.goto(f"{server.url}/console")
    expect(page.locator(".card", has_text="Open transactions").locator(".card-value")).to_have_text("2")
    pin = page.locator(".attention tbody tr").filter(has=page.get_by_role("link", name="orders-0", exact=True))
    expect(pin).to_contain_text("writer-open")
    expect(pin.locator("td").nth(1)).to_have_text("6")
    expect(pin.locator("td").nth(2)).to_have_text("8")
    expect(page.locator("table").last.locator("tbody tr", has_text="orders")).to_contain_text("11")
    tab.shot("overview")

    # Transactions: state, producer id and epoch of each, as DescribeTransactions answers.
    page.goto(f"{server.url}/console/transactions")
    for transactional_id in ("writer-committed", "writer-aborted", "writer-open", "writer-prepared"):
        described = client.get(f"/v1/transactions/{transactional_id}").json()
        row = transaction_row(page, transactional_id)
        expect(row.locator(".badge").first).to_have_text(described["state"])
        expect(row.locator(".producer")).to_have_text(
            f"{described['producer_id']} · epoch {described['producer_epoch']}"
        )
    expect(transaction_row(page, "writer-committed").locator(".badge")).to_have_text("CompleteCommit")
    expect(transaction_row(page, "writer-open").locator("meter")).to_have_count(1)
    expect(transaction_row(page, "writer-open")).to_contain_text("readers")
    tab.shot("transactions")

    page.select_option("select[name=state]", "Ongoing")  # the script submits the filter form
    page.wait_for_url(re.compile(r"state=Ongoing"))
    expect(page.locator("#transactions tbody tr")).to_have_count(1)
    expect(transaction_row(page, "writer-open")).to_have_count(1)

    # Transaction detail: transitions from __transaction_state, the markers, the epochs.
    page.goto(f"{server.url}/console/transactions/writer-committed")
    states = page.locator("#history tbody tr .badge").all_inner_texts()
    assert states[:2] == ["CompleteCommit", "PrepareCommit"] and states[-1] == "Empty" and "Ongoing" in states
    markers = [" ".join(row.split()) for row in page.locator("#markers tbody tr").all_inner_texts()]
    assert any(m.startswith("orders-0 3 COMMIT") for m in markers), markers
    assert any(m.startswith("orders-1 1 COMMIT") for m in markers), markers
    expect(page.locator(".timeline li")).to_have_count(2)
    expect(page.locator(".timeline li").first).to_contain_text("epoch 1")
    tab.shot("transaction-committed")

    # Partition detail: every offset with its status, markers distinct, LSO and HW in the sequence.
    page.goto(f"{server.url}/console/topics/orders/partitions/0")
    expected = {0: "plain", 1: "committed", 2: "committed", 4: "aborted", 6: "open", 7: "open"}
    for offset, status in expected.items():
        expect(log_row(page, offset).locator(".pill")).to_have_text(status)
    expect(log_row(page, 3)).to_contain_text("COMMIT marker")
    expect(log_row(page, 5)).to_contain_text("ABORT marker")
    expect(page.locator("tr.divider-lso")).to_contain_text("LSO 6")
    expect(page.locator("tr.divider-hw")).to_contain_text("High watermark 8")
    assert page.locator("tr.divider-lso + tr").get_attribute("id") == "o-6"
    expect(page.locator(".strip .tick-lso")).to_have_count(1)
    expect(page.locator(".stack .panel").first).to_contain_text("writer-open")  # DescribeProducers
    tab.shot("partition")

    # Consumer groups: members, committed offsets with lag (records, not markers), pending offsets.
    described_group = client.get("/v1/groups/readers").json()
    page.goto(f"{server.url}/console/groups")
    expect(page.locator("#groups tbody tr", has_text="readers").locator("td").nth(3)).to_have_text("1")
    page.get_by_role("link", name="readers", exact=True).click()
    expect(page.locator("#members tbody tr")).to_have_count(1)
    expect(page.locator("#members")).to_contain_text("orders: 0, 1, 2")
    lag = described_group["offsets"][0]["lag"]
    expect(page.locator("#offsets tbody tr").locator("td").nth(4)).to_have_text(str(lag))
    assert lag == 5, "offsets 1-7 less the two markers"
    expect(page.locator("#pending tbody tr")).to_contain_text("writer-open")
    tab.shot("group")

    # Live: a new transactional id appears without a reload.
    page.goto(f"{server.url}/console/transactions")
    page.evaluate("window.__stayed = true")
    TxnProducer(client, "writer-live").init()
    expect(transaction_row(page, "writer-live")).to_have_count(1, timeout=10_000)
    assert page.evaluate("window.__stayed") is True

    # Abort, through the confirmation dialog.
    transaction_row(page, "writer-open").get_by_role("link", name="Abort…").click()
    dialog = page.locator("dialog#console-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Fences the producer")
    expect(dialog).to_contain_text("invisible to read_committed")
    expect(dialog).to_contain_text("offsets it committed for readers are discarded")
    tab.shot("abort-dialog")
    dialog.locator("#confirm-abort").click()
    page.wait_for_url(re.compile(r"/console/transactions/writer-open\?aborted=1"))
    expect(page.locator(".banner-ok")).to_contain_text("Transaction aborted")
    described = client.get("/v1/transactions/writer-open").json()
    assert described["state"] == "CompleteAbort" and described["producer_epoch"] == 1, described
    expect(fact(page, "State")).to_have_text(described["state"])
    expect(fact(page, "Epoch")).to_have_text(str(described["producer_epoch"]))
    expect(page.locator(".timeline li").first).to_contain_text("fenced")
    tab.shot("transaction-aborted")

    page.goto(f"{server.url}/console/topics/orders/partitions/0")
    for offset in (6, 7):
        expect(log_row(page, offset).locator(".pill")).to_have_text("aborted")
    expect(log_row(page, 8)).to_contain_text("ABORT marker")
    expect(page.locator("tr.divider-lso")).to_have_count(0)
    expect(page.locator("tr.divider-hw")).to_contain_text("High watermark 9 = LSO")
    page.goto(f"{server.url}/console/groups/readers")
    expect(page.locator("#pending")).to_have_count(0)


def test_the_transaction_version_is_none_yet_until_an_end_txn_ends_a_transaction(
    server: RunningServer, tab: Tab
) -> None:
    """An id's version is what its last EndTxn used: before its first, "none yet" (its producer may be
    a Kafka client, whose EndTxn is of version 1, or HTTP's, of 2), however its transactions were
    aborted by a fence; in the history, such an abort has none either."""
    client, page = server.client, tab.page
    client.post("/v1/topics", json={"name": "versions", "partitions": 1}).raise_for_status()
    producer = TxnProducer(client, "versionless")
    producer.init()
    producer.send("versions", 0, "fenced")
    page.goto(f"{server.url}/console/transactions/versionless")
    expect(fact(page, "Transaction version")).to_contain_text("none yet")
    assert client.post("/v1/transactions/versionless/abort").json()["state"] == "CompleteAbort"  # a fence

    page.reload()
    expect(fact(page, "State")).to_have_text("CompleteAbort")
    expect(fact(page, "Transaction version")).to_contain_text("none yet")
    aborted = page.locator("#history tbody tr").filter(has=page.locator(".badge", has_text="CompleteAbort"))
    expect(aborted.locator("td").nth(3)).to_have_text("none yet")
    tab.shot("transaction-version-none-yet")

    producer.init()
    producer.send("versions", 0, "committed")
    producer.commit()
    page.reload()
    expect(fact(page, "State")).to_have_text("CompleteCommit")
    expect(fact(page, "Transaction version")).to_contain_text("2 KIP-890")
    committed = page.locator("#history tbody tr").filter(has=page.locator(".badge", has_text="CompleteCommit"))
    expect(committed.locator("td").nth(3)).to_have_text("TV2")


def test_the_group_page_shows_committed_leader_epochs(server: RunningServer, tab: Tab) -> None:
    """Regression: the leader epochs committed with offsets (Kafka's OffsetCommit v6+ and
    TxnOffsetCommit v2+, HTTP's `leader_epoch`) were kept and answered but not shown. Each committed
    and pending offset shows its epoch; -1 (none committed) a dash."""
    client, page = server.client, tab.page
    client.post("/v1/topics", json={"name": "epochs", "partitions": 2}).raise_for_status()
    client.post(
        "/v1/groups/epoch-readers/offsets/commit",
        json={
            "offsets": [
                {"topic": "epochs", "partition": 0, "offset": 1, "leader_epoch": 5},
                {"topic": "epochs", "partition": 1, "offset": 0},
            ]
        },
    ).raise_for_status()
    writer = TxnProducer(client, "epoch-writer", timeout_ms=300_000)
    writer.init()
    writer.send("epochs", 0, "e1")
    client.post(
        "/v1/txn/offset-commit",
        json={
            **writer.ids(),
            "group_id": "epoch-readers",
            "offsets": [{"topic": "epochs", "partition": 0, "offset": 2, "leader_epoch": 9}],
        },
    ).raise_for_status()
    page.goto(f"{server.url}/console/groups/epoch-readers")
    expect(page.locator("#offsets thead th").nth(2)).to_have_text("Leader epoch")
    committed = page.locator("#offsets tbody tr")
    expect(committed.nth(0).locator("td").nth(2)).to_have_text("5")
    expect(committed.nth(1).locator("td").nth(2)).to_have_text("—")
    expect(page.locator("#pending thead th").nth(2)).to_have_text("Leader epoch")
    expect(page.locator("#pending tbody tr").locator("td").nth(2)).to_have_text("9")
    tab.shot("group-leader-epochs")


def test_the_group_page_shows_an_http_members_partitions_held_back_by_the_revocation_barrier(
    server: RunningServer, tab: Tab
) -> None:
    """A partition a rebalance moves from one HTTP member to another is the first's until it
    acknowledges the generation that revoked it: the page shows it as the first member's
    "revoking" and the second's "awaiting"."""
    client, page = server.client, tab.page
    client.post("/v1/topics", json={"name": "held", "partitions": 2}).raise_for_status()

    def heartbeat(member_id: str = "") -> dict:
        answer = client.post("/v1/groups/barrier/heartbeat", json={"member_id": member_id, "topics": ["held"]})
        answer.raise_for_status()
        return answer.json()

    first = heartbeat()
    second = heartbeat()
    moved = 1 if first["member_id"] < second["member_id"] else 0
    page.goto(f"{server.url}/console/groups/barrier")
    rows = page.locator("#members tbody tr")
    first_row = rows.filter(has=page.locator("td", has_text=first["member_id"]))
    second_row = rows.filter(has=page.locator("td", has_text=second["member_id"]))
    expect(first_row.locator("td").nth(3)).to_contain_text(f"revoking held: {moved}")
    expect(second_row.locator("td").nth(3)).to_contain_text(f"awaiting held: {moved}")


def test_pages_work_without_javascript(server: RunningServer, playwright_driver) -> None:
    client = server.client
    make_scenario(client)
    with chromium(playwright_driver, javascript=False) as context:
        tab = Tab(context)
        page = tab.page
        page.goto(f"{server.url}/console")
        expect(page.locator(".static-note")).to_be_visible()
        expect(page.locator("time").first).to_contain_text("UTC")
        page.goto(f"{server.url}/console/transactions?state=Prepared")
        expect(page.locator("#transactions tbody tr")).to_have_count(1)
        transaction_row(page, "writer-prepared").get_by_role("link", name="Abort…").click()
        page.wait_for_url(re.compile(r"confirm=abort"))
        confirm = page.locator(".confirm-panel")
        expect(confirm).to_contain_text("Prepared (two-phase commit)")
        expect(confirm).to_contain_text("Fences the producer")
        tab.shot("abort-confirm-no-js")
        confirm.get_by_role("button", name="Abort transaction").click()
        page.wait_for_url(re.compile(r"aborted=1"))
        expect(page.locator(".banner-ok")).to_contain_text("Transaction aborted")
        assert client.get("/v1/transactions/writer-prepared").json()["state"] == "CompleteAbort"
        page.goto(f"{server.url}/console/topics/orders/partitions/2")
        expect(log_row(page, 0).locator(".pill")).to_have_text("aborted")
        tab.shot("partition-no-js")
        page.goto(f"{server.url}/console/topics/orders")  # the topic's id, as HTTP and Kafka's tools show it
        expect(page.locator(".lede .chip", has_text="topic id")).to_contain_text(
            client.get("/v1/topics/orders").json()["topic_id"]
        )
        tab.close()


def test_empty_pages_say_what_to_do_next(server: RunningServer, tab: Tab) -> None:
    page = tab.page
    for path, title, command in (
        ("/console", "No topics yet", f"curl -X POST {server.url}/v1/topics"),
        ("/console/transactions", "No transactional ids yet", f"curl -X POST {server.url}/v1/producers/init"),
        ("/console/groups", "No consumer groups yet", f"curl -X POST {server.url}/v1/groups/"),
    ):
        page.goto(f"{server.url}{path}")
        expect(page.locator(".empty h3")).to_have_text(title)
        expect(page.locator(".empty .command")).to_contain_text(command)
        if path == "/console":
            tab.shot("overview-empty")
    server.client.post("/v1/topics", json={"name": "quiet", "partitions": 1}).raise_for_status()
    page.goto(f"{server.url}/console/topics/quiet/partitions/0")
    expect(page.locator(".empty .command")).to_contain_text(f"{server.url}/v1/topics/quiet/records")
    for missing in ("/console/topics/loud", "/console/topics/quiet/partitions/7", "/console/nowhere"):
        response = server.client.get(missing)
        assert response.status_code == 404 and response.headers["content-type"].startswith("text/html"), missing
        assert "Not found" in response.text


HOSTILE = "<script>window.__pwned = 1</script>"
HOSTILE_VALUE = '"><img src=x onerror="window.__pwned = 2">'
HOSTILE_GROUP = "<img src=x onerror=window.__pwned=3>"  # no '/': the group id is a path segment of the API


def test_everything_users_wrote_is_shown_as_text(server: RunningServer, tab: Tab) -> None:
    client, page = server.client, tab.page
    client.post("/v1/topics", json={"name": "xss", "partitions": 1}).raise_for_status()
    client.post(
        "/v1/topics/xss/records",
        json={
            "partition": 0,
            "records": [
                {"key": HOSTILE, "value": HOSTILE_VALUE, "headers": [{"key": HOSTILE, "value": HOSTILE_VALUE}]}
            ],
        },
    ).raise_for_status()
    producer = TxnProducer(client, HOSTILE, timeout_ms=300_000)
    producer.init()
    producer.send("xss", 0, HOSTILE_VALUE)
    client.post(
        "/v1/txn/offset-commit",
        json={**producer.ids(), "group_id": HOSTILE_GROUP, "offsets": [{"topic": "xss", "partition": 0, "offset": 1}]},
    ).raise_for_status()
    client.post(
        f"/v1/groups/{quote(HOSTILE_GROUP, safe='')}/offsets/commit",
        json={"offsets": [{"topic": "xss", "partition": 0, "offset": 0, "metadata": HOSTILE}]},
    ).raise_for_status()
    for odd in (".", ".."):  # dot segments, which browsers would resolve away in a path
        TxnProducer(client, odd).init()

    visits = {
        "/console": [HOSTILE],
        "/console/transactions": [HOSTILE, HOSTILE_GROUP],
        f"/console/transactions/{quote(HOSTILE, safe='')}": [HOSTILE, HOSTILE_GROUP],
        "/console/topics/xss/partitions/0": [HOSTILE, HOSTILE_VALUE],
        "/console/groups": [HOSTILE_GROUP],
        f"/console/groups/{quote(HOSTILE_GROUP, safe='')}": [HOSTILE_GROUP, HOSTILE],
    }
    for path, texts in visits.items():
        response = page.goto(f"{server.url}{path}")
        assert response.status == 200, path
        assert "script-src 'self'" in response.headers["content-security-policy"]
        for text in texts:
            expect(page.get_by_text(text, exact=False).first).to_be_attached()
        assert page.evaluate("window.__pwned") is None, path
        assert page.locator("img[src=x]").count() == 0, path
    page.goto(f"{server.url}/console/transactions/{quote(HOSTILE, safe='')}")
    page.get_by_role("link", name="Abort transaction…").click()
    expect(page.locator("dialog#console-dialog")).to_contain_text(HOSTILE)
    assert page.evaluate("window.__pwned") is None
    page.keyboard.press("Escape")
    tab.shot("escaped")

    page.goto(f"{server.url}/console/transactions")
    for odd in (".", ".."):
        page.goto(f"{server.url}/console/transactions")
        transaction_row(page, odd).get_by_role("link", name=odd, exact=True).click()
        expect(page.locator("h1")).to_have_text(odd)

    # A form on another site cannot abort anything: the browser names that site in Origin.
    refused = client.post(
        f"/console/transactions/{quote(HOSTILE, safe='')}/abort", headers={"Origin": "http://evil.example"}
    )
    assert refused.status_code == 400
    assert client.get(f"/v1/transactions/{quote(HOSTILE, safe='')}").json()["state"] == "Ongoing"


def test_sign_in_when_the_server_requires_credentials(make_server, tab: Tab) -> None:
    server = make_server(auth="required", admin_token=ADMIN_TOKEN)
    page = tab.page
    anonymous = httpx.get(f"{server.url}/console/transactions", follow_redirects=False)
    assert anonymous.status_code == 303
    assert anonymous.headers["location"] == "/console/login?next=%2Fconsole%2Ftransactions"
    with_header = httpx.get(f"{server.url}/console", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert with_header.status_code == 200 and "Overview" in with_header.text

    page.goto(f"{server.url}/console/transactions")
    page.wait_for_url(re.compile(r"/console/login"))
    page.fill("#api-key", "not-a-key")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator(".banner-bad")).to_contain_text("unknown or revoked")
    tab.errors.clear()  # the browser logs the 401 of that answer
    tab.shot("sign-in")
    page.fill("#api-key", ADMIN_TOKEN)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/console/transactions$"))
    expect(page.locator(".signed-in")).to_contain_text("admin")
    cookie = next(c for c in page.context.cookies() if c["name"] == "txbroker_console_key")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/console"
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(re.compile(r"/console/login"))
    page.goto(f"{server.url}/console")
    page.wait_for_url(re.compile(r"/console/login"))


def test_what_a_principal_may_see_and_abort(make_server) -> None:
    server = make_server(auth="required", admin_token=ADMIN_TOKEN)
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    admin.post("/v1/principals", json={"name": "viewer"}).raise_for_status()
    token = admin.post("/v1/principals/viewer/keys").json()["token"]
    viewer = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}", "Origin": server.url})
    admin.post("/v1/topics", json={"name": "orders", "partitions": 1}).raise_for_status()
    producer = TxnProducer(admin, "guarded")
    producer.init()
    producer.send("orders", 0, "v")

    refused = viewer.get("/console")
    assert refused.status_code == 403 and "CLUSTER_AUTHORIZATION_FAILED" in refused.text
    admin.post(
        "/v1/acls",
        json={
            "principal": "viewer",
            "resource_type": "Cluster",
            "resource_name": "txbroker-cluster",
            "operation": "Describe",
        },
    ).raise_for_status()
    # Into the console, but not into a transaction it may not Describe (tests/console/test_console_acls.py).
    assert viewer.get("/console/transactions/guarded").status_code == 403
    admin.post(
        "/v1/acls",
        json={
            "principal": "viewer",
            "resource_type": "TransactionalId",
            "resource_name": "guarded",
            "operation": "Describe",
        },
    ).raise_for_status()
    assert viewer.get("/console/transactions/guarded").status_code == 200
    denied = viewer.post("/console/transactions/guarded/abort")
    assert denied.status_code == 403 and "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in denied.text
    assert admin.get("/v1/transactions/guarded").json()["state"] == "Ongoing"

    aborted = abort_from_the_console(admin, server.url, "guarded")
    assert aborted.status_code == 303
    assert admin.get("/v1/transactions/guarded").json()["state"] == "CompleteAbort"
    audit = admin.get("/v1/audit").json()
    assert any(
        entry["action"] == "abort transaction" and entry["resource"] == "guarded" for entry in audit["entries"]
    ), audit


def test_pages_of_the_longest_names_fit_the_window(server: RunningServer, tab: Tab) -> None:
    """Regression: a name has no space to break at, and the breadcrumbs and heading did not wrap, so
    the page of a topic with a 249-character name (Kafka's longest) was 2.5 screens wide."""
    client, page = server.client, tab.page
    topic, transactional_id, group = "t" * 249, "x" * 400, "g" * 255
    client.post("/v1/topics", json={"name": topic, "partitions": 1}).raise_for_status()
    TxnProducer(client, transactional_id).init()
    client.post(
        f"/v1/groups/{group}/offsets/commit", json={"offsets": [{"topic": topic, "partition": 0, "offset": 0}]}
    ).raise_for_status()
    for path in (
        f"/console/topics/{topic}",
        f"/console/topics/{topic}/partitions/0",
        f"/console/transactions/{transactional_id}",
        f"/console/groups/{group}",
    ):
        page.goto(f"{server.url}{path}")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= page.viewport_size["width"], f"{path[:40]}…: {width} px wide"


# ---- live refresh when what a page shows goes away: the page says so (the error page, the sign-in)
# instead of keeping stale figures under "Offline · retrying".


def test_a_page_whose_topic_is_deleted_says_so(server: RunningServer, tab: Tab) -> None:
    client, page = server.client, tab.page
    client.post("/v1/topics", json={"name": "doomed", "partitions": 1}).raise_for_status()
    client.post("/v1/topics/doomed/records", json={"partition": 0, "records": [{"value": "v"}]}).raise_for_status()
    client.post(
        "/v1/groups/doomed-readers/offsets/commit", json={"offsets": [{"topic": "doomed", "partition": 0, "offset": 1}]}
    ).raise_for_status()
    page.goto(f"{server.url}/console/topics/doomed/partitions/0")
    expect(page.locator("#live-status")).to_contain_text("Live")
    client.delete("/v1/topics/doomed").raise_for_status()
    expect(page.locator("h1")).to_have_text("Not found", timeout=10_000)
    expect(page.locator(".error-message")).to_contain_text("doomed")

    page.goto(f"{server.url}/console/groups/doomed-readers")
    expect(page.locator("#live-status")).to_contain_text("Live")
    client.delete("/v1/groups/doomed-readers").raise_for_status()
    expect(page.locator("h1")).to_have_text("Not found", timeout=10_000)
    tab.errors.clear()  # the browser logs the 404 of the live block


def test_a_revoked_key_signs_the_open_page_out(make_server, tab: Tab) -> None:
    server = make_server(auth="required", admin_token=ADMIN_TOKEN)
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    admin.post("/v1/principals", json={"name": "operator", "super_user": True}).raise_for_status()
    key = admin.post("/v1/principals/operator/keys").json()
    page = tab.page
    page.goto(f"{server.url}/console/transactions")
    page.fill("#api-key", key["token"])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/console/transactions$"))
    expect(page.locator("#live-status")).to_contain_text("Live")
    admin.delete(f"/v1/principals/operator/keys/{key['key_id']}").raise_for_status()
    page.wait_for_url(re.compile(r"/console/login\?next=%2Fconsole%2Ftransactions$"), timeout=10_000)
    tab.errors.clear()  # the browser logs the 401 of the live block
    admin.close()
