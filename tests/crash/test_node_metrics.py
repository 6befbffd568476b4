"""/metrics of a node of several workers (`txbroker serve --workers N`; app/api/metrics.py,
app/runtime/metrics_folder.py): a scrape, whichever worker answers it, shows the node's counters (the
Kafka door's too), so they never go back; a node restarted after SIGKILL counts afresh, without its dead
workers' files; the request pools' gauges are the node's live workers' summed."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.api.metrics import SCRAPE_CONNECTION_WAIT_S
from app.kafka import api_table
from tests.concurrency.test_transaction_concurrency import _create_topic
from tests.conftest import free_ports_outside_the_ephemeral_range
from tests.crash.test_database_outage import pooled_connections_held
from tests.crash.test_worker_processes import wait_until_gone, worker_pids
from tests.kafka.raw import RawConnection, request_of

WORKERS = 2


def started_workers(supervisor_pid: int, timeout_s: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while len(pids := worker_pids(supervisor_pid)) < WORKERS:
        assert time.monotonic() < deadline, f"only workers {pids} started"
        time.sleep(0.05)
    return pids


def requests_served(url: str) -> tuple[int, int]:
    """The node's counts of GET /v1/topics and GET /metrics, from one scrape on a connection of its
    own (the kernel hands each new connection to one worker)."""
    with httpx.Client(base_url=url, timeout=30) as client:
        response = client.get("/metrics")
    assert response.status_code == 200, response.text
    counts = {"/v1/topics": 0, "/metrics": 0}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "txbroker_http_requests_total" and sample.labels["method"] == "GET":
                route = sample.labels["route"]
                counts[route] = counts.get(route, 0) + int(sample.value)
    return counts["/v1/topics"], counts["/metrics"]


def get_on_new_connections(url: str, count: int) -> None:
    for _ in range(count):
        with httpx.Client(base_url=url, timeout=30) as client:
            assert client.get("/v1/topics").status_code == 200


def metrics_folder(worker_pid: int) -> Path:
    """The folder the supervisor gave the worker (its environment, as the worker started with it)."""
    environment = Path(f"/proc/{worker_pid}/environ").read_bytes().split(b"\0")
    [folder] = [entry.split(b"=", 1)[1] for entry in environment if entry.startswith(b"PROMETHEUS_MULTIPROC_DIR=")]
    return Path(folder.decode())


def test_every_scrape_shows_the_node_and_a_restart_after_sigkill_counts_afresh(server_process, database_url):
    # Issue 22: each scrape reached one worker with counters of its own (seen: 84, 79, 84); Prometheus
    # reads every drop as a reset.
    server = server_process("--database-url", database_url, "--workers", str(WORKERS))
    workers = started_workers(server.pid)
    requests = 60  # on connections of their own, so that both workers serve some (each 1 in 2)
    get_on_new_connections(server.url, requests)
    scrapes = [requests_served(server.url) for _ in range(12)]
    # Each scrape counts every request made, and the scrapes before it (counted before their answer
    # ended), whichever worker served them and whichever answers.
    assert scrapes == [(requests, index) for index in range(12)]

    folder = metrics_folder(workers[0])
    assert metrics_folder(workers[1]) == folder
    assert {f"counter_{pid}.db" for pid in workers} <= {path.name for path in folder.iterdir()}
    server.kill()  # SIGKILL of the supervisor: its workers die with it (PR_SET_PDEATHSIG), leaving their files
    assert wait_until_gone(workers) == []

    server.process = None
    server.start()  # the same node: the same listening socket, so the same metrics folder
    try:
        restarted = started_workers(server.pid)
        assert metrics_folder(restarted[0]) == folder
        left = {path.name for path in folder.iterdir()}
        assert not any(f"_{pid}.db" in name for pid in workers if pid not in restarted for name in left), left
        assert requests_served(server.url) == (0, 0)
        get_on_new_connections(server.url, 10)
        assert [requests_served(server.url) for _ in range(4)] == [(10, index) for index in range(1, 5)]
        assert server.terminate() == 0
        assert not list(folder.glob("*.db"))  # a node that stops leaves no metric files
    finally:
        server.kill()
        shutil.rmtree(folder, ignore_errors=True)


def kafka_requests_served(url: str) -> dict[str, int]:
    with httpx.Client(base_url=url, timeout=30) as client:
        response = client.get("/metrics")
    assert response.status_code == 200, response.text
    return {
        sample.labels["api"]: int(sample.value)
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name == "txbroker_kafka_requests_total"
    }


def test_the_kafka_doors_requests_are_the_nodes_whichever_worker_served_them(server_process, database_url):
    (kafka_port,) = free_ports_outside_the_ephemeral_range()
    server = server_process(
        "--database-url", database_url, "--workers", str(WORKERS), "--kafka-listener", f"127.0.0.1:{kafka_port}"
    )
    started_workers(server.pid)
    connections = 40  # each accepted by one worker (SO_REUSEPORT), so both serve some
    api_versions = request_of(api_table.API_VERSIONS, 3, client_software_name="raw-test", client_software_version="1")
    for _ in range(connections):
        with RawConnection(f"127.0.0.1:{kafka_port}") as connection:
            connection.call(api_versions)
    assert [kafka_requests_served(server.url) for _ in range(6)] == [{"ApiVersions": connections}] * 6


def pool_gauges(text: str) -> dict[str, float]:
    """The request pools' gauges of a scrape: in_use, idle, max, waiting."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "txbroker_database_pool_connections":
                found[sample.labels["state"]] = sample.value
            elif sample.name == "txbroker_database_pool_max_connections":
                found["max"] = sample.value
            elif sample.name == "txbroker_database_pool_waiting_requests":
                found["waiting"] = sample.value
    return found


@pytest.mark.parametrize("workers", [1, WORKERS])
def test_the_pool_gauges_show_every_connection_in_use_and_requests_waiting_then_free_again(
    server_process, database_url, workers
):
    """Requests that hold every pooled connection of every worker (DeleteRecords waiting on a
    partition's row lock, taken from outside) and more that wait for one: a scrape, whichever worker
    answers it, shows the node's pools in use to their max and the requests waiting (each worker's
    summed), and answers at once without the partitions' gauges (no pooled connection for them);
    once the lock is let go, the pools are idle and nobody waits. Before, /metrics had no gauge of
    the pool, and a scrape waited for a pooled connection like every request."""
    pool_size = 2
    server = server_process(
        "--database-url",
        database_url,
        "--workers",
        str(workers),
        env={"TXBROKER_DATABASE_POOL_SIZE": str(pool_size)},
    )
    if workers > 1:
        started_workers(server.pid)
    capacity = workers * pool_size
    # On connections of their own, which the kernel spreads over the workers: enough that every
    # worker gets more than its pool holds (20 over 2 workers: fewer than 3 on one is 1 in 2500).
    requests = 10 * workers
    with httpx.Client(base_url=server.url, timeout=30) as client:
        _create_topic(client, "poolbusy", 1)

    def scrape(client: httpx.Client) -> tuple[dict[str, float], str]:
        response = client.get("/metrics")
        assert response.status_code == 200, response.text
        return pool_gauges(response.text), response.text

    def scrape_until(client: httpx.Client, expected, what: str) -> tuple[dict[str, float], str]:
        deadline = time.monotonic() + 20  # the other workers' values are a second old at most
        while True:
            gauges, text = scrape(client)
            if expected(gauges):
                return gauges, text
            assert time.monotonic() < deadline, f"{what}: the scrape says {gauges}"

    async def busy_then_free() -> None:
        limits = httpx.Limits(max_connections=requests, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as http:
            async with pooled_connections_held(database_url, http, "poolbusy", requests, capacity) as (waiting, _):
                await asyncio.to_thread(saturated_then_scraped_at_once, waiting)
            for answer in await asyncio.gather(*waiting):
                assert answer.status_code == 200, answer.text

    def saturated_then_scraped_at_once(waiting: list[asyncio.Task]) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            gauges, text = scrape_until(
                client,
                # A scrape waiting for a connection meanwhile (each waits 1 s) may be among them.
                lambda found: found.get("waiting", 0) >= requests - capacity and found.get("in_use") == capacity,
                "every pooled connection in use and the other requests waiting",
            )
            assert gauges["in_use"] == gauges["max"] == capacity and gauges["idle"] == 0, gauges
            assert requests - capacity <= gauges["waiting"] <= requests - capacity + workers, gauges
            assert "txbroker_partition_high_watermark{" not in text  # no pooled connection for them
        with httpx.Client(base_url=server.url, timeout=30) as client:
            started = time.monotonic()
            scrape(client)
            assert time.monotonic() - started < SCRAPE_CONNECTION_WAIT_S + 2, "the scrape waited for a connection"
        assert not any(request.done() for request in waiting), "the pools were not busy all along"

    asyncio.run(busy_then_free())
    with httpx.Client(base_url=server.url, timeout=30) as client:
        gauges, text = scrape_until(
            client, lambda found: found.get("in_use") == 0 and found.get("waiting") == 0, "the pools free again"
        )
    assert gauges["max"] == capacity and 0 < gauges["idle"] <= capacity, gauges
    assert 'txbroker_partition_high_watermark{partition="0",topic="poolbusy"} 0.0' in text
    assert "failed with a bug" not in server.log_path.read_text()
