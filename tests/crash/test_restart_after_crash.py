"""A node killed with SIGKILL while clients are connected restarts at once on the same port, as a
service manager restarts it; a second node started on a port a live node serves refuses to start.

The nodes here bind their port themselves (`serve --port`, not `--fd`): the bind under test is
serve's own. The connections open at a kill are left by the dead node's sockets (orphaned, then
TIME_WAIT, for 60 s); the restart's first bind must pass them, whichever worker had accepted them.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO_ROOT, free_ports_outside_the_ephemeral_range, process_alive, wait_until_healthy
from tests.crash.test_durability import _read_all
from tests.crash.test_worker_processes import (
    established_sockets,
    socket_inodes,
    sockets_in_state,
    wait_until_gone,
    worker_pids,
)

WORKERS = 2  # several: worker 0 and one started after it prove what more would
WRITERS = 4
# /proc/net/tcp states of a dead node's connections: FIN_WAIT1, FIN_WAIT2, TIME_WAIT, CLOSE, LAST_ACK.
LEFT_BY_THE_DEAD = ("04", "05", "06", "07", "09")


class PortNode:
    """A `txbroker serve --port P` process, in a process group of its own (its group id is its pid),
    so a crash is SIGKILL to the node's process group, as the OOM killer or a service manager sends."""

    def __init__(self, port: int, data_dir: Path, workers: int = WORKERS) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.command = [
            sys.executable,
            *("-m", "app.cli", "serve", "--port", str(port), "--workers", str(workers)),
            *("--data-dir", str(data_dir), "--log-level", "warning"),
            # No Kafka listener: on serve's default port (9092) it would fail the node whenever
            # anything else on the machine holds that port (a server of another test, scripts/run).
            *("--kafka-listener", "off"),
        ]
        self.worker_count = workers
        self.process: subprocess.Popen | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="txb-node-", suffix=".log")[1])

    def launch(self) -> subprocess.Popen:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, process_group=0
            )
        return self.process

    def start(self) -> PortNode:
        """Launches the node once (no retry) and waits until it serves."""
        process = self.launch()
        try:
            wait_until_healthy(self.url, 90, process)
        except RuntimeError as error:
            raise AssertionError(f"{error}\n--- node log ---\n{self.log_path.read_text()[-4000:]}") from None
        return self

    def workers(self) -> dict[int, int]:
        """Worker index -> pid, for the processes that serve (a node of one worker serves itself)."""
        assert self.process is not None
        if self.worker_count == 1:
            return {0: self.process.pid}
        indexes = {}
        for pid in worker_pids(self.process.pid):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            indexes[int(command[command.index(b"--worker-index") + 1])] = pid
        return indexes

    def crash(self) -> None:
        """SIGKILL to the node's process group; returns once its workers and PostgreSQL are gone (they
        die with the supervisor: parent-death signal), so only its connections are left."""
        assert self.process is not None
        dependants = [pid for pid in self.workers().values() if pid != self.process.pid] + [self.postmaster_pid()]
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        assert wait_until_gone(dependants) == [], "a worker or the embedded PostgreSQL outlived the crash"

    def postmaster_pid(self) -> int:
        data_dir = Path(self.command[self.command.index("--data-dir") + 1])
        return int((data_dir / "postgres" / "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        """By pid: the supervisor (SIGTERM stops its workers and PostgreSQL), then any worker left."""
        if self.process is None:
            return
        workers = (
            [pid for pid in self.workers().values() if pid != self.process.pid] if self.process.poll() is None else []
        )
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid in wait_until_gone(workers):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def port_nodes() -> Iterator[list[PortNode]]:
    """The nodes a test starts; each stopped by pid afterwards."""
    nodes: list[PortNode] = []
    yield nodes
    for node in nodes:
        node.stop()
        node.log_path.unlink(missing_ok=True)


def connections_by_worker(node: PortNode) -> dict[int, int]:
    """Worker index -> how many established connections on the node's port it serves."""
    established = established_sockets(node.port)
    return {index: len(socket_inodes(pid) & established) for index, pid in node.workers().items()}


def served_beyond_worker_0(node: PortNode) -> bool:
    """Whether a worker other than worker 0 serves a connection (vacuously, for a node of one)."""
    return node.worker_count == 1 or any(count for index, count in connections_by_worker(node).items() if index)


def write_until_killed(
    url: str,
    writer: str,
    acknowledged: dict[int, str],
    errors: list[str],
    killed: threading.Event,
    done: threading.Event,
) -> None:
    """Plain writes on one keep-alive connection until the node dies under it; what was acknowledged
    is recorded by offset, any answer other than an acknowledgement, or a failure before the kill, in
    `errors`."""
    with httpx.Client(base_url=url, timeout=60) as client:
        for sequence in itertools.count():
            if done.is_set():  # the round ended without a kill (it failed): stop
                return
            values = [f"{writer}-{sequence}-{i}" for i in range(3)]
            try:
                response = client.post(
                    "/v1/produce",
                    json={"partitions": [{"topic": "kept", "partition": 0, "records": [{"value": v} for v in values]}]},
                )
            except httpx.HTTPError as error:
                if not killed.is_set():
                    errors.append(f"{writer}: {error!r} before the kill")
                return  # the node died under this request: not acknowledged
            if response.status_code != 200 or response.json()["partitions"][0]["error"] is not None:
                errors.append(f"{writer}: {response.status_code} {response.text}")
                return
            base_offset = response.json()["partitions"][0]["base_offset"]
            acknowledged.update({base_offset + i: value for i, value in enumerate(values)})


def crash_with_clients_connected(node: PortNode, round_number: int, acknowledged: dict[int, str]) -> None:
    """Writers on keep-alive connections, and idle keep-alive clients until one is served by a worker
    other than worker 0 (the kernel spreads connections over the workers' sockets by hash); then
    SIGKILL while every one of those connections is open."""
    errors: list[str] = []
    killed, done = threading.Event(), threading.Event()
    writers = [
        threading.Thread(
            target=write_until_killed, args=(node.url, f"r{round_number}-w{n}", acknowledged, errors, killed, done)
        )
        for n in range(WRITERS)
    ]
    for writer in writers:
        writer.start()
    idle: list[httpx.Client] = []
    try:
        deadline = time.monotonic() + 60  # a bound for a broken node, not a timing assertion
        while True:
            assert time.monotonic() < deadline and all(w.is_alive() for w in writers), (errors, len(idle))
            # A request on each: the server closes a keep-alive connection idle for 5 s (uvicorn).
            for client in idle:
                client.get("/v1/health").raise_for_status()
            if len(acknowledged) >= 30 * (round_number + 1) and idle and served_beyond_worker_0(node):
                break
            if len(idle) < 50:
                idle.append(httpx.Client(base_url=node.url, timeout=60))
                idle[-1].get("/v1/health").raise_for_status()
            time.sleep(0.02)
        served = connections_by_worker(node)
        assert sum(served.values()) > 0 and served_beyond_worker_0(node), (served, errors)
        killed.set()
        node.crash()
    finally:
        done.set()
        for writer in writers:
            writer.join(timeout=60)
        for client in idle:
            client.close()
    assert not errors, errors[:3]


def assert_all_acknowledged_there(node: PortNode, acknowledged: dict[int, str]) -> None:
    stored = dict(_read_all(node.url, "kept", 0))
    assert sorted(stored) == list(range(len(stored))), "offsets must stay dense after a crash"
    missing = {offset: value for offset, value in acknowledged.items() if stored.get(offset) != value}
    assert not missing, f"{len(missing)} of {len(acknowledged)} acknowledged records lost or changed"


# Two crashes in a row with several workers (the case that failed), one with a single worker.
@pytest.mark.parametrize("workers, crashes", [(WORKERS, 2), (1, 1)], ids=[f"{WORKERS}-workers", "1-worker"])
def test_a_node_killed_with_clients_connected_restarts_at_once_on_its_port(port_nodes, data_dir, workers, crashes):
    """Crashes in a row, each with writers and idle keep-alive clients connected (some served by
    workers other than worker 0); each restart is launched once, at once, on the same port, and must
    serve, with every acknowledged record there. The claim socket used to fail with EADDRINUSE until
    the connections the other workers had accepted left TIME_WAIT (60 s): only worker 0's socket
    allowed address reuse, and the dead connections inherit their listening socket's options."""
    [port] = free_ports_outside_the_ephemeral_range()
    node = PortNode(port, data_dir, workers)
    port_nodes.append(node)
    node.start()
    httpx.post(f"{node.url}/v1/topics", json={"name": "kept", "partitions": 1}).raise_for_status()
    acknowledged: dict[int, str] = {}
    for round_number in range(crashes):
        crash_with_clients_connected(node, round_number, acknowledged)
        left = {state for state in LEFT_BY_THE_DEAD if sockets_in_state(port, state)}
        assert left, "the dead node's connections should still hold the port (else this proves nothing)"
        node = PortNode(port, data_dir, workers)
        port_nodes.append(node)
        node.start()
        assert_all_acknowledged_there(node, acknowledged)
    assert len(acknowledged) >= 30 * crashes


def test_a_second_node_on_a_port_a_live_node_serves_refuses_to_start(port_nodes, data_dir):
    """With clients connected to the live node; it keeps serving them. The second node is refused
    whatever its number of workers (a node of one binds its port with the same function)."""
    [port] = free_ports_outside_the_ephemeral_range()
    live = PortNode(port, data_dir / "live")
    port_nodes.append(live)
    live.start()
    with httpx.Client(base_url=live.url, timeout=30) as client:
        client.get("/v1/health").raise_for_status()
        for workers in (WORKERS, 1):
            second = PortNode(port, data_dir / f"second-{workers}", workers)
            port_nodes.append(second)
            assert second.launch().wait(timeout=60) == 2
            message = second.log_path.read_text()
            assert f"port {port} on 127.0.0.1 is already served by a live process" in message, message
            assert "--port" in message and "Traceback" not in message, message
            assert not (data_dir / f"second-{workers}").exists(), "refused before starting its PostgreSQL"
        assert client.get("/v1/health").status_code == 200
        assert process_alive(live.process.pid)
