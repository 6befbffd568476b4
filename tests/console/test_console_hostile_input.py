"""The console against unusual input, over real HTTP on real PostgreSQL: query strings and ids a
page cannot take answer the console's error page (HTML with the error's status, never the API's
JSON nor a 500), a record's headers are shown bounded, and a transactional id that is a dot segment
("." or "..") can be aborted from its page like any other."""

from __future__ import annotations

import base64
import re
from html import escape, unescape
from urllib.parse import parse_qs, quote, unquote

import pytest

from tests.api.test_transactions import TxnProducer
from tests.conftest import RunningServer


@pytest.mark.parametrize(
    "path",
    [
        "/console/topics/t/partitions/0?offset=-1",
        "/console/topics/t/partitions/0?offset=abc",
        "/console/topics/t/partitions/0?offset=99999999999999999999999",
        "/console/topics/t/partitions/-1",
        "/console/topics/t/partitions/0?markers_before=-1",
        "/console/topics/t?after=x",
        "/console/transactions/x?before=-3",
        "/console/transactions/" + quote("nul\x00id", safe=""),
        "/console/transactions?prefix=%00",
        "/console/transactions?after=%00",
        "/console/groups/" + quote("nul\x00id", safe=""),
        "/console/groups?after=%00",
        "/console?after=%00",
    ],
)
def test_a_value_a_page_cannot_take_answers_an_error_page(module_server: RunningServer, path: str) -> None:
    client = module_server.client
    if client.get("/v1/topics/t").status_code == 404:
        client.post("/v1/topics", json={"name": "t", "partitions": 1}).raise_for_status()
    response = client.get(path)
    assert response.status_code == 400, (path, response.text[:300])
    assert response.headers["content-type"].startswith("text/html"), (path, response.text[:300])
    assert "INVALID_REQUEST" in response.text and "« Back" in response.text


def test_a_records_headers_are_shown_bounded(module_server: RunningServer) -> None:
    client = module_server.client
    client.post(
        "/v1/topics", json={"name": "headers-heavy", "partitions": 1, "config": {"max_message_bytes": 20_000_000}}
    ).raise_for_status()
    headers = [{"key": f"h{i}", "value": "x" * 200_000} for i in range(30)]
    client.post(
        "/v1/topics/headers-heavy/records",
        json={"partition": 0, "records": [{"key": "k", "value": "y" * 10_000_000, "headers": headers}]},
    ).raise_for_status()
    page = client.get("/console/topics/headers-heavy/partitions/0")
    assert page.status_code == 200
    # A 10 MB value and 6 MB of headers: the page shows the start of each.
    assert len(page.text) < 100_000, len(page.text)
    assert "30 headers" in page.text and "h0=xxx" in page.text and "h29=" not in page.text


@pytest.mark.parametrize("odd", [".", ".."])
def test_a_dot_segment_transactional_id_is_aborted_from_its_page(module_server: RunningServer, odd: str) -> None:
    client = module_server.client
    if client.get("/v1/topics/dots").status_code == 404:
        client.post("/v1/topics", json={"name": "dots", "partitions": 1}).raise_for_status()
    producer = TxnProducer(client, odd, timeout_ms=300_000)
    producer.init()
    producer.send("dots", 0, "v")
    page = client.get(f"/console/transactions/?id={quote(odd, safe='')}")
    link = unescape(re.search(r'href="([^"]*)">Abort transaction…', page.text).group(1))
    confirmation = client.get(link)
    assert confirmation.status_code == 200 and "Abort the Ongoing transaction of" in confirmation.text, link
    form = re.search(r'<form method="post" action="([^"]*)"[^>]*>(.*?)</form>', confirmation.text, re.S)
    fields = dict(re.findall(r'name="(\w+)" value="([^"]*)"', form.group(2)))
    aborted = client.post(
        unescape(form.group(1)),
        content="&".join(f"{name}={value}" for name, value in fields.items()),
        headers={"Origin": module_server.url, "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert aborted.status_code == 303
    listed = client.get("/v1/transactions", params={"transactional_id_prefix": odd}).json()["transactions"]
    assert [t["state"] for t in listed if t["transactional_id"] == odd] == ["CompleteAbort"]
    shown = client.get(aborted.headers["location"])
    assert shown.status_code == 200 and "Transaction aborted." in shown.text


def _post_form(server: RunningServer, path: str, fields: dict[str, str]):
    return server.client.post(
        path,
        content="&".join(f"{name}={quote(value, safe='')}" for name, value in fields.items()),
        headers={"Origin": server.url, "Content-Type": "application/x-www-form-urlencoded"},
    )


def test_an_abort_whose_confirmation_is_incomplete_aborts_nothing(module_server: RunningServer) -> None:
    """The confirmation's hidden fields name the transaction the operator saw: a form without one,
    or with one that is not a number, would abort whatever is open now (the producer's next
    transaction), so it aborts nothing; the confirmed abort sent twice aborts once."""
    client = module_server.client
    client.post("/v1/topics", json={"name": "confirmed", "partitions": 1}).raise_for_status()
    producer = TxnProducer(client, "confirm-me", timeout_ms=300_000)
    producer.init()
    producer.send("confirmed", 0, "v")
    shown = client.get("/console/transactions/confirm-me?confirm=abort").text
    fields = dict(re.findall(r'name="(\w+)" value="([^"]*)"', shown))
    assert set(fields) == {"producer_id", "producer_epoch", "start_time_ms"}
    for tampered in (
        {name: value for name, value in fields.items() if name != "start_time_ms"},
        {name: value for name, value in fields.items() if name != "producer_epoch"},
        {},
        {**fields, "producer_id": "abc"},
        {**fields, "start_time_ms": ""},
    ):
        refused = _post_form(module_server, "/console/transactions/confirm-me/abort", tampered)
        assert refused.status_code == 400 and "nothing was aborted" in unescape(refused.text), tampered
        assert client.get("/v1/transactions/confirm-me").json()["state"] == "Ongoing", tampered
    first = _post_form(module_server, "/console/transactions/confirm-me/abort", fields)
    assert first.status_code == 303
    again = _post_form(module_server, "/console/transactions/confirm-me/abort", fields)
    assert again.status_code == 409 and "INVALID_TXN_STATE" in again.text and "moved on" in again.text
    described = client.get("/v1/transactions/confirm-me").json()
    assert described["state"] == "CompleteAbort" and described["producer_epoch"] == int(fields["producer_epoch"]) + 1


ODD_IDS = ["a/b", "50%?x=1#top", "ünï/cødé ✓", "/leading", "trailing/", "x/abort", "%2F", " spaced "]


def test_ids_with_url_characters_link_to_their_own_pages(module_server: RunningServer) -> None:
    """Transactional and group ids with '/', '%', '?', '#', spaces and non-ASCII: the lists link to
    each one's page, which names it, and its abort confirmation is reachable."""
    client = module_server.client
    client.post("/v1/topics", json={"name": "odd", "partitions": 1}).raise_for_status()
    for odd in ODD_IDS:
        producer = TxnProducer(client, odd, timeout_ms=300_000)
        producer.init()
        producer.send("odd", 0, "v")
        client.post(
            "/v1/txn/offset-commit",
            json={**producer.ids(), "group_id": odd, "offsets": [{"topic": "odd", "partition": 0, "offset": 1}]},
        ).raise_for_status()
    for listing, heading in (("/console/transactions?prefix=", "Transactional id"), ("/console/groups?prefix=", None)):
        for odd in ODD_IDS:
            listed = client.get(listing + quote(odd, safe=""))
            kind = "transactions" if "transactions" in listing else "groups"
            links = {unescape(href) for href in re.findall(rf'href="(/console/{kind}/[^"]*)"', listed.text)}
            page_links = [href for href in links if "confirm=abort" not in href and unquote_id(href, kind) == odd]
            assert len(page_links) == 1, (odd, links)
            page = client.get(page_links[0])
            assert page.status_code == 200, (odd, page_links[0])
            assert f'<h1 class="mono id-title">{escape(odd)}</h1>' in page.text, odd
            if heading:
                confirm = unescape(re.search(r'href="([^"]*)">Abort transaction…', page.text).group(1))
                assert "Abort the Ongoing transaction of" in client.get(confirm).text, (odd, confirm)


def unquote_id(href: str, kind: str) -> str:
    path, _, query = href.partition("?")
    rest = path[len(f"/console/{kind}/") :]
    return unquote(rest) if rest else parse_qs(query).get("id", [""])[0]


def test_a_record_timestamped_after_the_year_9999_is_shown_as_its_number(module_server: RunningServer) -> None:
    """A producer's timestamp is any 64-bit number of ms (as in Kafka): one no date can name made
    the partition's page fail for every reader (a 500, in JSON)."""
    client = module_server.client
    client.post("/v1/topics", json={"name": "far-future", "partitions": 1}).raise_for_status()
    for timestamp_ms in (253_402_300_800_000, 2**63 - 1, 0):
        client.post(
            "/v1/topics/far-future/records",
            json={"partition": 0, "records": [{"value": f"at {timestamp_ms}", "timestamp_ms": timestamp_ms}]},
        ).raise_for_status()
    page = client.get("/console/topics/far-future/partitions/0")
    assert page.status_code == 200, page.text[:300]
    assert f"{2**63 - 1:,} ms since the epoch (after the year 9999)" in page.text
    assert "1970-01-01 00:00:00 UTC" in page.text


def test_a_record_stored_as_bytes_shows_each_field_that_is_text_as_text(module_server: RunningServer) -> None:
    """Regression: a record with one field that is not UTF-8 is stored base64 whole, and the page
    showed every field of it base64 ("YzE=" for a value "c1", tagged "the bytes are not UTF-8") when
    only its binary header was. Each field is now shown as the text it is; only bytes that are not
    UTF-8 are shown base64, and tagged so."""
    client = module_server.client
    client.post("/v1/topics", json={"name": "mixed-bytes", "partitions": 1}).raise_for_status()
    b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
    client.post(
        "/v1/topics/mixed-bytes/records",
        json={
            "encoding": "base64",
            "partition": 0,
            "records": [
                {
                    "key": b64(b"order-1"),
                    "value": b64("ünïcode".encode()),
                    "headers": [{"key": "bin", "value": b64(b"\xff\xfe")}, {"key": "txt", "value": b64(b"plain")}],
                },
                {"key": b64(b"\xc3\x28"), "value": b64(b"text"), "headers": []},
            ],
        },
    ).raise_for_status()
    page = client.get("/console/topics/mixed-bytes/partitions/0").text

    def key_and_value(offset: int) -> list[str]:
        row = page.split(f'<tr id="o-{offset}"')[1].split("</tr>")[0]
        cells = re.findall(r'<td class="mono cell-text">(.*?)</td>', row, re.S)
        return [
            re.sub(r"\s+", " ", unescape(re.sub(r'<span class="tag" title="([^"]*)">', r"[\1] ", cell)))
            for cell in cells
        ]

    key, value = key_and_value(0)
    assert re.sub(r"<[^>]+>", "", key).strip() == "order-1"
    assert re.sub(r"<[^>]+>", "", value).strip() == "ünïcode[bin=//4= (base64); txt=plain; ] 2 headers"
    key, value = key_and_value(1)
    assert re.sub(r"<[^>]+>", "", key).strip() == "wyg= [the bytes are not UTF-8: shown base64-encoded] base64"
    assert re.sub(r"<[^>]+>", "", value).strip() == "text"
