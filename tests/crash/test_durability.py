"""Crash tests: acknowledged writes survive SIGKILL of the server (and with it its embedded
PostgreSQL), a PostgreSQL crash under a running server loses nothing and yields 503s, not 500s, and
an embedded PostgreSQL killed on its own is started again by its server."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx

from app.runtime.embedded_postgres import EmbeddedPostgres
from tests.conftest import database_url_for, process_alive


def _produce(url: str, topic: str, partition: int, values: list[str], timeout_s: float = 30) -> dict:
    response = httpx.post(
        f"{url}/v1/produce",
        timeout=timeout_s,
        json={
            "producer_id": -1,
            "partitions": [{"topic": topic, "partition": partition, "records": [{"value": value} for value in values]}],
        },
    )
    response.raise_for_status()
    entry = response.json()["partitions"][0]
    assert entry["error"] is None, entry
    return entry


def _read_all(url: str, topic: str, partition: int) -> list[tuple[int, str]]:
    records, offset = [], 0
    while True:
        body = httpx.post(
            f"{url}/v1/fetch",
            timeout=30,
            json={
                "isolation_level": "read_uncommitted",
                "max_records": 10_000,
                "partitions": [{"topic": topic, "partition": partition, "offset": offset}],
            },
        ).json()
        entry = body["partitions"][0]
        assert entry["error"] is None, entry
        records += [(record["offset"], record["value"]) for record in entry["records"]]
        if entry["next_offset"] >= entry["high_watermark"]:
            return records
        offset = entry["next_offset"]


def test_acknowledged_writes_survive_sigkill_of_server_and_its_embedded_postgres(server_process, data_dir):
    """Writers keep writing while the server is killed with SIGKILL; every acknowledged record is
    there after a restart, at the offset it was acknowledged with, and the log has no holes."""
    server = server_process("--data-dir", str(data_dir / "data"))
    httpx.post(f"{server.url}/v1/topics", json={"name": "crash", "partitions": 2}).raise_for_status()
    acknowledged: dict[int, str] = {}
    for round_number in range(2):  # a second crash: recovery of a log that recovered once
        postmaster_pid = int((data_dir / "data" / "postgres" / "postmaster.pid").read_text().split()[0])
        stop = threading.Event()

        def write_until_killed(writer: int, stop=stop, round_number=round_number) -> None:
            sequence = 0
            while not stop.is_set():
                values = [f"r{round_number}-w{writer}-{sequence}-{i}" for i in range(5)]
                try:
                    # Short timeout: after the kill, the listening socket (held by this test
                    # for the restart) still accepts connections that nobody serves.
                    entry = _produce(server.url, "crash", 0, values, timeout_s=2)
                except (httpx.HTTPError, AssertionError):
                    return  # the server died under this request: not acknowledged
                for i, value in enumerate(values):
                    acknowledged[entry["base_offset"] + i] = value
                sequence += 1

        writers = [threading.Thread(target=write_until_killed, args=(n,)) for n in range(3)]
        for writer in writers:
            writer.start()
        time.sleep(1.0)
        server.kill()
        stop.set()
        for writer in writers:
            writer.join(timeout=30)
        # The embedded PostgreSQL dies with its owner (parent-death signal), leaving no orphan.
        deadline = time.monotonic() + 20
        while process_alive(postmaster_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not process_alive(postmaster_pid), "the embedded PostgreSQL outlived its server"
        server.start()
        records = _read_all(server.url, "crash", 0)
        offsets = [offset for offset, _ in records]
        assert offsets == list(range(len(records))), "offsets must stay dense after a crash"
        stored = dict(records)
        missing = {offset: value for offset, value in acknowledged.items() if stored.get(offset) != value}
        assert not missing, f"{len(missing)} acknowledged records lost or changed after SIGKILL"
    assert len(acknowledged) > 50, "the writers should have had records acknowledged before each kill"


def test_sigterm_shuts_down_cleanly_and_keeps_data(server_process, data_dir):
    server = server_process("--data-dir", str(data_dir / "data"))
    httpx.post(f"{server.url}/v1/topics", json={"name": "calm", "partitions": 1}).raise_for_status()
    entry = _produce(server.url, "calm", 0, ["a", "b", "c"])
    assert server.terminate() == 0
    server.start()
    assert _read_all(server.url, "calm", 0) == [(entry["base_offset"] + i, v) for i, v in enumerate("abc")]


def test_postgres_crash_gives_503_then_recovers_without_loss(server_process, data_dir):
    """PostgreSQL (not the server) is killed with SIGKILL: requests answer 503
    COORDINATOR_NOT_AVAILABLE (retriable) while it is down, and once it is back the server serves
    again with every acknowledged record intact."""
    postgres = EmbeddedPostgres(data_dir / "pg")
    postgres.start()
    try:
        postgres.create_database("crashdb")
        server = server_process("--database-url", database_url_for(postgres.database_url, "crashdb"))
        httpx.post(f"{server.url}/v1/topics", json={"name": "pgcrash", "partitions": 1}).raise_for_status()
        before = _produce(server.url, "pgcrash", 0, [f"v{i}" for i in range(10)])

        postmaster_pid = postgres.pid
        os.kill(postmaster_pid, 9)
        deadline = time.monotonic() + 20
        while process_alive(postmaster_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        response = httpx.post(
            f"{server.url}/v1/produce",
            timeout=30,
            json={"producer_id": -1, "partitions": [{"topic": "pgcrash", "partition": 0, "records": [{"value": "x"}]}]},
        )
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "COORDINATOR_NOT_AVAILABLE"
        assert response.json()["error"]["retriable"] is True
        assert httpx.get(f"{server.url}/v1/health").status_code == 503

        postgres.stop()
        postgres.start()
        deadline = time.monotonic() + 30
        while httpx.get(f"{server.url}/v1/health").status_code != 200:
            assert time.monotonic() < deadline, "the server did not recover once PostgreSQL was back"
            time.sleep(0.2)
        after = _produce(server.url, "pgcrash", 0, ["after"])
        records = _read_all(server.url, "pgcrash", 0)
        assert records[:10] == [(before["base_offset"] + i, f"v{i}") for i in range(10)]
        assert records[-1] == (after["base_offset"], "after")
        assert [offset for offset, _ in records] == list(range(len(records)))
    finally:
        postgres.stop()


def test_embedded_postgres_killed_alone_is_restarted_and_loses_nothing(server_process, data_dir):
    """The embedded PostgreSQL's postmaster is SIGKILLed, its server left running: the server starts
    it again at once (crash recovery), serves again with every acknowledged record intact, and
    the PostgreSQL it started still dies with it when it is SIGKILLed in turn."""
    server = server_process("--data-dir", str(data_dir))
    httpx.post(f"{server.url}/v1/topics", json={"name": "pgalone", "partitions": 1}).raise_for_status()
    before = _produce(server.url, "pgalone", 0, [f"v{i}" for i in range(10)])

    killed = _postmaster_pid(data_dir)
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while httpx.get(f"{server.url}/v1/health", timeout=10).status_code != 200 or _postmaster_pid(data_dir) == killed:
        assert time.monotonic() < deadline, "the server did not start its PostgreSQL again"
        assert server.process.poll() is None, "the server exited when its PostgreSQL died"
        time.sleep(0.1)
    after = _produce(server.url, "pgalone", 0, ["after"])
    records = _read_all(server.url, "pgalone", 0)
    assert records[:10] == [(before["base_offset"] + i, f"v{i}") for i in range(10)]
    assert records[-1] == (after["base_offset"], "after")

    restarted = _postmaster_pid(data_dir)
    server.kill()
    deadline = time.monotonic() + 20
    while process_alive(restarted):
        assert time.monotonic() < deadline, "the PostgreSQL the server restarted outlived the server"
        time.sleep(0.05)


def _postmaster_pid(data_dir) -> int | None:
    try:
        return int((data_dir / "postgres" / "postmaster.pid").read_text().split()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None
