"""Server behaviour the SDK work found wrong once, kept as regression tests.

The SDK does not follow /v1/coordinators/find (every node coordinates every key today, and the URL
it answers can be wrong): NOT_COORDINATOR is simply retried against the same URL.
"""

from __future__ import annotations

import httpx


def test_find_coordinator_names_the_url_the_server_is_reached_at(server_process, database_url):
    server = server_process("--database-url", database_url)  # `txbroker serve --fd N`, as the tests run it
    found = httpx.post(f"{server.url}/v1/coordinators/find", json={"key_type": "transaction", "key": "x"}).json()
    nodes = httpx.get(f"{server.url}/v1/cluster").json()["nodes"]
    assert found["url"] == server.url and nodes[0]["url"] == server.url
