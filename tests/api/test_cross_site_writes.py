"""Writes a browser sends for a page of another site are refused on every route, over real HTTP
on real PostgreSQL: with `--auth off` (the loopback default) nothing else would stop any page the
operator opens from aborting transactions, creating topics or producing through the API (a form
post, or a text/plain fetch with a JSON body, needs no CORS preflight). Programs send no Origin;
the server's own pages send its own. And without authentication, a page whose DNS name was made to
resolve to this machine (DNS rebinding: then its own origin) is refused by the name it was sent to."""

from __future__ import annotations

from tests.api.test_security import ADMIN_TOKEN
from tests.api.test_transactions import TxnProducer
from tests.conftest import RunningServer

FORM = {"Origin": "http://evil.example", "Content-Type": "application/x-www-form-urlencoded"}


def test_a_page_of_another_site_cannot_write_through_the_api(server: RunningServer) -> None:
    client = server.client
    client.post("/v1/topics", json={"name": "guarded", "partitions": 1}).raise_for_status()
    producer = TxnProducer(client, "victim", timeout_ms=300_000)
    producer.init()
    producer.send("guarded", 0, "v")

    for origin in ("http://evil.example", "null", f"{server.url}.evil.example"):
        refused = client.post("/v1/transactions/victim/abort", content="a=b", headers={**FORM, "Origin": origin})
        assert refused.status_code == 400, origin
        assert refused.json()["error"]["code"] == "INVALID_REQUEST" and "another site" in refused.text
    created = client.post(
        "/v1/topics",
        content='{"name": "planted", "partitions": 1}',
        headers={"Origin": "http://evil.example", "Content-Type": "text/plain"},
    )
    assert created.status_code == 400
    produced = client.post(
        "/v1/topics/guarded/records",
        content='{"partition": 0, "records": [{"value": "planted"}]}',
        headers={"Origin": "http://evil.example", "Content-Type": "text/plain"},
    )
    assert produced.status_code == 400
    # The routes with a fast path (produce, EndTxn) answer before FastAPI's dependencies: refused too.
    for path, body in (
        ("/v1/produce", '{"producer_id": -1, "partitions": [{"topic": "guarded", "partition": 0, "records": [{}]}]}'),
        ("/v1/txn/end", '{"transactional_id": "victim", "producer_id": 0, "producer_epoch": 0, "committed": false}'),
    ):
        fast = client.post(path, content=body, headers={"Origin": "http://evil.example", "Content-Type": "text/plain"})
        assert fast.status_code == 400 and "another site" in fast.text, (path, fast.text)
    assert client.get("/v1/transactions/victim").json()["state"] == "Ongoing"
    assert client.get("/v1/topics/planted").status_code == 404
    assert client.get("/v1/topics/guarded").json()["partitions"][0]["high_watermark"] == 1

    # Reads from anywhere, and writes from this server's own pages or from programs, go through.
    assert client.get("/v1/topics/guarded", headers={"Origin": "http://evil.example"}).status_code == 200
    same_site = client.post("/v1/topics", json={"name": "own", "partitions": 1}, headers={"Origin": server.url})
    assert same_site.status_code == 201
    assert client.post("/v1/transactions/victim/abort").json()["state"] == "CompleteAbort"


def test_the_console_refuses_them_with_a_page(server: RunningServer) -> None:
    for path in ("/console/transactions/x/abort", "/console/login", "/console/logout"):
        refused = server.client.post(path, content="a=b", headers=FORM)
        assert refused.status_code == 400 and refused.headers["content-type"].startswith("text/html"), path
        assert "another site" in refused.text, path


def test_without_authentication_only_requests_to_a_loopback_name_are_answered(server: RunningServer, make_server):
    """Regression: with --auth off a page of another site whose name then resolved to 127.0.0.1 (DNS
    rebinding) read and wrote everything as its own origin (Origin and Host both its name: not
    cross-site). Without authentication only requests sent to a loopback name are answered; with
    authentication (or --allow-anonymous, which waives the loopback rule) any name is."""
    port = server.url.rsplit(":", 1)[1]
    client = server.client
    for host in (f"rebound.example:{port}", "rebound.example", f"10.0.0.1:{port}", f"127.0.0.1.nip.io:{port}"):
        read = client.get("/v1/topics", headers={"Host": host})
        assert read.status_code == 400, (host, read.text)
        assert read.json()["error"]["code"] == "INVALID_REQUEST" and "loopback name" in read.text
        written = client.post(
            "/v1/topics",
            json={"name": "rebound", "partitions": 1},
            headers={"Host": host, "Origin": f"http://{host}"},
        )
        assert written.status_code == 400, (host, written.text)
        assert client.get("/console", headers={"Host": host}).status_code == 400
    assert client.get("/v1/topics/rebound").status_code == 404
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"app.localhost:{port}", "127.1.2.3"):
        assert client.get("/v1/topics", headers={"Host": host}).status_code == 200, host

    required = make_server(auth="required", admin_token=ADMIN_TOKEN)
    answered = required.client.get(
        "/v1/topics", headers={"Host": "broker.example", "Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert answered.status_code == 200, answered.text
    anonymous = make_server(allow_anonymous=True)
    assert anonymous.client.get("/v1/topics", headers={"Host": "broker.example"}).status_code == 200
