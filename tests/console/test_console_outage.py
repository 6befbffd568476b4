"""The console while PostgreSQL is away, over real HTTP: every page is the console's 503 page
(never a 500 or the API's JSON), says the server is unavailable for now, and loads itself again
until PostgreSQL is back, when the same pages answer. The PostgreSQL is the test's own (it stops
it), not the session's."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from app.runtime.embedded_postgres import EmbeddedPostgres
from tests.api.test_transactions import TxnProducer
from tests.conftest import start_in_process_server, stop_in_process_server

PAGES = [
    "/console",
    "/console/topics/outage",
    "/console/topics/outage/partitions/0",
    "/console/transactions",
    "/console/transactions/outage-writer",
    "/console/groups",
    "/console/groups/outage-readers",
    "/console/audit",
]


def test_pages_while_postgresql_is_away_say_so_and_load_again_until_it_is_back() -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="txb-console-outage-"))
    postgres = EmbeddedPostgres(data_dir / "pg")
    postgres.start()
    server = None
    try:
        server = start_in_process_server(postgres.database_url)
        client = server.client
        client.post("/v1/topics", json={"name": "outage", "partitions": 1}).raise_for_status()
        producer = TxnProducer(client, "outage-writer")
        producer.init()
        producer.send("outage", 0, "v")
        client.post(
            "/v1/groups/outage-readers/offsets/commit",
            json={"offsets": [{"topic": "outage", "partition": 0, "offset": 0}]},
        ).raise_for_status()
        assert all(client.get(path).status_code == 200 for path in PAGES)

        postgres.stop()
        for path in PAGES:
            page = client.get(path)
            assert page.status_code == 503, (path, page.text[:300])
            assert page.headers["content-type"].startswith("text/html")
            assert "COORDINATOR_NOT_AVAILABLE" in page.text and "Unavailable for now" in page.text
            # Regression: the page stayed as it was until someone reloaded it.
            assert re.search(r'<meta http-equiv="refresh" content="\d+">', page.text), path
        # A POST's answer never sends it again.
        abort = client.post(
            "/console/transactions/outage-writer/abort",
            data={"producer_id": "1", "producer_epoch": "0", "start_time_ms": "1"},
        )
        assert abort.status_code == 503 and 'http-equiv="refresh"' not in abort.text

        postgres.start()
        for path in PAGES:
            assert client.get(path).status_code == 200, path
    finally:
        if server is not None:
            stop_in_process_server(server)
        postgres.stop(immediate=True)
        shutil.rmtree(data_dir, ignore_errors=True)
