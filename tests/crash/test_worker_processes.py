"""`txbroker serve --workers N` (app/runtime/worker_processes.py): N processes on one socket, correct together,
and none outliving the supervisor: SIGKILL of the supervisor leaves no worker and no PostgreSQL."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import threading
import time
from pathlib import Path

import asyncpg
import httpx
import pytest

from app.settings import Settings
from app.storage.migrations import SchemaNewerThanCode
from tests.conftest import ServerProcess, process_alive

WORKERS = 2  # several: worker 0 and one waiting for it prove what more would


def all_workers(supervisor_pid: int, timeout_s: float = 60) -> list[int]:
    """The workers, once all have started (the supervisor starts them together; /v1/health answers
    200 once every one is ready)."""
    deadline = time.monotonic() + timeout_s
    while len(pids := worker_pids(supervisor_pid)) < WORKERS and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


def worker_pids(supervisor_pid: int) -> list[int]:
    """The supervisor's children that are workers (the embedded PostgreSQL is a child too)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError):
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        if parent == supervisor_pid and b"--worker-of" in command:
            pids.append(int(entry.name))
    return sorted(pids)


def wait_until_gone(pids: list[int], timeout_s: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while any(process_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if process_alive(pid)]


def postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "postgres" / "postmaster.pid").read_text().split()[0])


def test_workers_share_the_port_and_appends_stay_dense_and_exactly_once(server_process, data_dir):
    """Idempotent producers on connections of their own (spread over the workers by the kernel) write
    one partition at once; every retry of a batch is recognised, whichever worker gets it."""
    server = server_process("--data-dir", str(data_dir), "--workers", str(WORKERS))
    assert len(all_workers(server.pid)) == WORKERS
    httpx.post(f"{server.url}/v1/topics", json={"name": "shared", "partitions": 1}).raise_for_status()
    errors: list[str] = []
    producers, batches = 6, 15

    def produce(index: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            init = client.post("/v1/producers/init", json={}).json()
            for batch in range(batches):
                body = {
                    "producer_id": init["producer_id"],
                    "producer_epoch": init["producer_epoch"],
                    "partitions": [
                        {
                            "topic": "shared",
                            "partition": 0,
                            "base_sequence": 2 * batch,
                            "records": [{"value": f"p{index}-b{batch}-{i}"} for i in range(2)],
                        }
                    ],
                }
                answers = []
                for _attempt in range(2):  # each batch sent twice, on a new connection the second time
                    with httpx.Client(base_url=server.url, timeout=30) as fresh:
                        answers.append(fresh.post("/v1/produce", json=body).json()["partitions"][0])
                first, retry = answers
                if first["error"] or not retry["duplicate"] or retry["base_offset"] != first["base_offset"]:
                    errors.append(f"producer {index} batch {batch}: {first} then {retry}")

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors[:3]
    fetched = httpx.post(
        f"{server.url}/v1/fetch",
        json={"max_records": 10_000, "partitions": [{"topic": "shared", "partition": 0, "offset": 0}]},
    ).json()
    records = fetched["partitions"][0]["records"]
    assert [r["offset"] for r in records] == list(range(producers * batches * 2)), "dense, each batch once"
    assert len({r["value"] for r in records}) == len(records)


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def sockets_in_state(port: int, state: str) -> set[str]:
    """The inodes of the IPv4 TCP sockets in this state (01 established, 0A listening) on this local
    port (/proc/net/tcp)."""
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return {row[9] for row in rows if row[1].endswith(f":{port:04X}") and row[3] == state}


def established_sockets(port: int) -> set[str]:
    return sockets_in_state(port, "01")


@pytest.mark.parametrize("reuse_port", [True, False], ids=["socket-per-worker", "one-shared-socket"])
def test_clients_that_connect_once_health_says_200_reach_every_worker(server_process, data_dir, reuse_port):
    """/v1/health answers 200 only once every worker accepts: clients that start with the service (a
    pool connecting together) are spread over the workers. Worker 0 used to say 200 as soon as it was
    ready, before the others had started, so such clients all landed on it and stayed (keep-alive).
    With port reuse each worker listens on a socket of its own (the kernel hashes connections over
    them); a socket given without it is shared by every worker."""
    server = server_process("--data-dir", str(data_dir), "--workers", str(WORKERS), reuse_port=reuse_port)
    workers = worker_pids(server.pid)
    listening = sockets_in_state(int(server.url.rsplit(":", 1)[1]), "0A")
    assert len(listening) == (WORKERS if reuse_port else 1), f"listening sockets on the port: {listening}"
    clients = [httpx.Client(base_url=server.url, timeout=30) for _ in range(30)]
    try:
        barrier = threading.Barrier(len(clients))

        def connect(client: httpx.Client) -> None:
            barrier.wait()
            client.get("/v1/health").raise_for_status()

        threads = [threading.Thread(target=connect, args=(client,)) for client in clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        established = established_sockets(int(server.url.rsplit(":", 1)[1]))
        served = {pid: len(socket_inodes(pid) & established) for pid in workers}
        assert len(workers) == WORKERS and sum(served.values()) == len(clients), served
        assert all(count > 0 for count in served.values()), f"connections per worker pid: {served}"
    finally:
        for client in clients:
            client.close()


def test_sigkill_of_the_supervisor_leaves_no_worker_and_no_postgres(server_process, data_dir):
    server = server_process("--data-dir", str(data_dir), "--workers", str(WORKERS))
    workers = all_workers(server.pid)
    postgres = postmaster_pid(data_dir)
    assert len(workers) == WORKERS and process_alive(postgres)
    server.kill()
    assert wait_until_gone([*workers, postgres]) == [], "a worker or the embedded PostgreSQL outlived a SIGKILL"
    server.start()  # the data dir is free again: its lock died with the supervisor
    assert httpx.get(f"{server.url}/v1/health").status_code == 200


def test_sigterm_stops_the_workers_then_postgres_and_exits_0(server_process, data_dir):
    server = server_process("--data-dir", str(data_dir), "--workers", str(WORKERS))
    workers = all_workers(server.pid)
    postgres = postmaster_pid(data_dir)
    assert server.terminate() == 0
    assert wait_until_gone([*workers, postgres]) == []


def test_a_worker_that_dies_stops_the_node(server_process, data_dir):
    """No half-sized node serving silently: the supervisor stops the others and exits 1, for the
    service manager to restart the node."""
    server = server_process("--data-dir", str(data_dir), "--workers", str(WORKERS))
    workers = all_workers(server.pid)
    postgres = postmaster_pid(data_dir)
    os.kill(workers[0], signal.SIGKILL)
    assert server.process.wait(timeout=60) == 1
    assert wait_until_gone([*workers, postgres]) == []


def test_a_hung_worker_is_killed_and_stops_the_node(server_process, data_dir):
    """A worker that stops answering (SIGSTOP here; a blocked event loop, a deadlock) is killed after
    `worker_hang_timeout_ms`, which stops the node as a worker's death does. Before, it kept the node
    listed while the connections the kernel handed it waited."""
    env = {"TXBROKER_WORKER_HANG_TIMEOUT_MS": "3000"}
    server = server_process("--data-dir", str(data_dir), "--workers", str(WORKERS), env=env)
    workers = all_workers(server.pid)
    postgres = postmaster_pid(data_dir)
    os.kill(workers[1], signal.SIGSTOP)
    assert server.process.wait(timeout=60) == 1
    assert wait_until_gone([*workers, postgres]) == []
    log = server.log_path.read_text()
    assert f"worker pid {workers[1]} has not answered for" in log, log[-3000:]
    assert f"worker pid {workers[1]} was killed as hung" in log, log[-3000:]


def test_a_node_stopped_as_a_whole_is_not_taken_for_hung_workers(server_process, data_dir):
    """The supervisor stopped with its workers (SIGSTOP of the node, a frozen machine) for longer than
    `worker_hang_timeout_ms`: once resumed, no worker is judged by that time, and the node serves on."""
    env = {"TXBROKER_WORKER_HANG_TIMEOUT_MS": "3000"}
    server = server_process("--data-dir", str(data_dir), "--workers", str(WORKERS), env=env)
    workers = all_workers(server.pid)
    for pid in [server.pid, *workers]:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(5)  # longer than the timeout: the time under test, not a bound on the server
    # The supervisor first: it then looks at its workers before they can have beaten again.
    os.kill(server.pid, signal.SIGCONT)
    time.sleep(0.5)
    for pid in workers:
        os.kill(pid, signal.SIGCONT)
    time.sleep(5)  # as long again: a worker wrongly judged would be killed meanwhile
    assert server.process.poll() is None, server.log_path.read_text()[-3000:]
    assert worker_pids(server.pid) == workers
    assert httpx.get(f"{server.url}/v1/health", timeout=30).status_code == 200


def test_a_hang_timeout_as_short_as_the_beats_is_refused(database_url):
    """A worker beats once a second and the supervisor reads its beats every half second: 900 ms
    killed the workers of an idle, healthy node within seconds (the node stopped, exit 1). The server
    refuses to start with a timeout under three beats instead, saying which values it takes."""
    with pytest.raises(ValueError, match="worker_hang_timeout_ms 900 is shorter than 3000"):
        Settings(worker_hang_timeout_ms=900)
    assert Settings(worker_hang_timeout_ms=3000).worker_hang_timeout_ms == 3000
    assert Settings(worker_hang_timeout_ms=0).worker_hang_timeout_ms == 0  # never
    server = ServerProcess(
        "--database-url", database_url, "--workers", str(WORKERS), env={"TXBROKER_WORKER_HANG_TIMEOUT_MS": "900"}
    )
    try:
        with pytest.raises(RuntimeError, match="exited with 2 before it was healthy") as refused:
            server.start(timeout_s=30)
        assert "worker_hang_timeout_ms 900 is shorter than 3000" in str(refused.value)
        assert "Traceback" not in str(refused.value)
    finally:
        server.close()


def workers_of(supervisor_pid: int) -> list[int]:
    """The live workers started by that supervisor, its children or orphans."""
    marker = [b"--worker-of", str(supervisor_pid).encode()]
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except (FileNotFoundError, ProcessLookupError):
            continue
        if any(command[i : i + 2] == marker for i in range(len(command))) and process_alive(int(entry.name)):
            pids.append(int(entry.name))
    return pids


def test_a_worker_0_that_cannot_start_stops_the_node_and_the_workers_waiting_for_it(database_url):
    """The other workers start with worker 0 and wait for it to be ready: when it fails instead (here
    it refuses a database a newer version migrated), the node exits (2, as worker 0 refused) and none
    of them is left waiting."""

    async def migrated_by_a_newer_version() -> None:
        connection = await asyncpg.connect(database_url)
        try:
            await connection.execute("UPDATE alembic_version SET version_num = '9999'")
        finally:
            await connection.close()

    asyncio.run(migrated_by_a_newer_version())
    server = ServerProcess("--database-url", database_url, "--workers", str(WORKERS))
    try:
        with pytest.raises(RuntimeError, match="exited with 2 before it was healthy") as failed:
            server.start()
        assert str(SchemaNewerThanCode(["9999"])) in str(failed.value)
        assert workers_of(server.pid) == []
    finally:
        server.close()


# ---- what one worker changes, the others apply at their next request (nothing cached per process)


class WorkerConnection:
    """A keep-alive HTTP connection to one worker: the kernel gave it to whichever worker, and it
    stays with that one."""

    def __init__(self, connection: http.client.HTTPConnection, worker_pid: int) -> None:
        self.connection = connection
        self.worker_pid = worker_pid

    def call(self, method: str, path: str, token: str, body: dict | None = None) -> tuple[int, dict | None]:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.connection.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        response = self.connection.getresponse()
        content = response.read()
        return response.status, json.loads(content) if content else None


def server_side_socket(port: int, client_port: int) -> str:
    """The inode of the server's end of our connection from client_port (/proc/net/tcp). The kernel
    writes that table while it is read, so one read may list a socket twice, or miss it while the
    table changes: read until the one socket is found once (its inode; 0 is a socket no process
    holds)."""
    local, remote = f"0100007F:{port:04X}", f"0100007F:{client_port:04X}"
    for _ in range(50):
        rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
        inodes = {row[9] for row in rows if row[1] == local and row[2] == remote and row[3] == "01"} - {"0"}
        if len(inodes) == 1:
            return inodes.pop()
        time.sleep(0.01)
    raise AssertionError(f"the server's end of 127.0.0.1:{client_port} -> :{port} is not in /proc/net/tcp once")


def a_connection_to_each_worker(url: str, workers: list[int], attempts: int = 200) -> list[WorkerConnection]:
    """Connects until each worker has accepted one of our connections (the kernel spreads them)."""
    port = int(url.rsplit(":", 1)[1])
    found: dict[int, WorkerConnection] = {}
    for _ in range(attempts):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("GET", "/v1/health")
        connection.getresponse().read()  # answered: a worker has accepted it
        inode = server_side_socket(port, connection.sock.getsockname()[1])
        [worker] = [pid for pid in workers if inode in socket_inodes(pid)]
        if worker in found:
            connection.close()
            continue
        found[worker] = WorkerConnection(connection, worker)
        if len(found) == len(workers):
            return list(found.values())
    raise AssertionError(f"{attempts} connections reached only workers {sorted(found)} of {workers}")


def test_what_one_worker_changes_the_other_applies_at_its_next_request(server_process, data_dir):
    """The workers share nothing but PostgreSQL (docs/design.md, "Workers and several servers"): a
    removed ACL, a revoked key, a deleted principal, a topic deleted and created again with other
    partitions and another max_message_bytes, all changed through one worker, apply to the very next
    request another worker serves, on a connection it already had. A per-process cache of
    principals, ACLs or topics would fail this."""
    admin_token = "coherence-admin-token"
    env = {"TXBROKER_AUTH": "required", "TXBROKER_ADMIN_TOKEN": admin_token}
    server = server_process("--data-dir", str(data_dir), "--workers", str(WORKERS), env=env)
    changer, other = a_connection_to_each_worker(server.url, all_workers(server.pid))
    assert changer.worker_pid != other.worker_pid

    def admin(method, path, body=None):
        status, answer = changer.call(method, path, admin_token, body)
        assert status < 300, (method, path, status, answer)
        return answer

    admin("POST", "/v1/topics", {"name": "coherent", "partitions": 1})
    admin("POST", "/v1/principals", {"name": "reader"})
    token = admin("POST", "/v1/principals/reader/keys")["token"]
    rule = {"principal": "reader", "resource_type": "Topic", "resource_name": "coherent", "operation": "Read"}
    acl_id = admin("POST", "/v1/acls", rule)["acl_id"]
    records = "/v1/topics/coherent/partitions/0/records"
    assert other.call("GET", records, token)[0] == 200

    admin("DELETE", f"/v1/acls/{acl_id}")
    status, answer = other.call("GET", records, token)
    assert (status, answer["error"]["code"]) == (403, "TOPIC_AUTHORIZATION_FAILED"), "a removed ACL"
    admin("POST", "/v1/acls", rule)
    assert other.call("GET", records, token)[0] == 200
    [key] = admin("GET", "/v1/principals/reader/keys")["keys"]
    admin("DELETE", f"/v1/principals/reader/keys/{key['key_id']}")
    status, answer = other.call("GET", records, token)
    assert (status, answer["error"]["code"]) == (401, "UNAUTHORIZED"), "a revoked key"
    second = admin("POST", "/v1/principals/reader/keys")["token"]
    assert other.call("GET", records, second)[0] == 200
    admin("DELETE", "/v1/principals/reader")
    assert other.call("GET", records, second)[0] == 401, "a deleted principal"

    def produce(partition: int, value: str):
        body = {"partitions": [{"topic": "coherent", "partition": partition, "records": [{"value": value}]}]}
        status, answer = other.call("POST", "/v1/produce", admin_token, body)
        assert status == 200, answer
        return answer["partitions"][0]

    assert produce(0, "x" * 2000)["error"] is None
    admin("DELETE", "/v1/topics/coherent")
    admin("POST", "/v1/topics", {"name": "coherent", "partitions": 2, "config": {"max_message_bytes": 1000}})
    assert produce(0, "x" * 2000)["error"]["code"] == "RECORD_TOO_LARGE", "the re-created topic's config"
    assert produce(1, "new")["base_offset"] == 0, "the re-created topic's partitions"
    fetch = {"partitions": [{"topic": "coherent", "partition": p, "offset": 0} for p in (0, 1)]}
    status, answer = other.call("POST", "/v1/fetch", admin_token, fetch)
    assert status == 200 and [[r["value"] for r in p["records"]] for p in answer["partitions"]] == [[], ["new"]]
    admin("POST", "/v1/topics/coherent/partitions", {"partitions": 3})
    assert produce(2, "grown")["base_offset"] == 0, "a partition added"


def test_the_embedded_postgresql_takes_every_connection_the_workers_may_hold(server_process, data_dir):
    """Each worker may hold its pool and three connections beside it. A fixed max_connections of
    200 was fewer than that from about 12 workers with the default pool, so a busy node's requests
    failed on PostgreSQL's "too many clients"; here 2 workers of 150 pooled connections ask for 306."""
    pool_size = 150
    server_process(
        "--data-dir", str(data_dir), "--workers", str(WORKERS), env={"TXBROKER_DATABASE_POOL_SIZE": str(pool_size)}
    )

    async def max_connections() -> int:
        conn = await asyncpg.connect(host=str(data_dir / "run"), user="txbroker", database="txbroker")
        try:
            return int(await conn.fetchval("SHOW max_connections"))
        finally:
            await conn.close()

    assert asyncio.run(max_connections()) >= WORKERS * (pool_size + 3)
