"""Test fixtures: one real PostgreSQL per test session (started by the same launcher the server uses),
a fresh database per test cloned from a migrated template, and servers reached over real HTTP.

- `server`: the app in this process, served by uvicorn on a loopback socket in a background thread.
- `server_process`: a factory for `txbroker serve` subprocesses, for tests that kill them by pid.

scripts/test runs the suite on two pytest-xdist workers (`-n 2`). Each worker is a test session of
its own: its own PostgreSQL, template and database names, so that nothing a test names (a database,
a module's server) can meet the other worker's. The heavy tests (HEAVY_TESTS below) all run on one
worker, one after the other, while the other worker runs the rest.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest
import uvicorn
import uvloop

from app.api.auth import proxy_header_options
from app.runtime.embedded_postgres import EmbeddedPostgres
from app.server import create_app
from app.settings import Settings
from app.storage.migrations import upgrade_to_head

TEMPLATE_DATABASE = "txbroker_template"
REPO_ROOT = Path(__file__).resolve().parents[1]
_database_numbers = itertools.count()

# The tests that kill servers or PostgreSQL and wait for their restarts, by node id prefix (a folder,
# a module or a test): their deadlines (a restart's, a transaction's timeout, a copier's) are sized
# for a machine where at most one of them runs. Under pytest-xdist they run on one worker, one after
# the other (HeavyTestsApart); they take less than half of the suite's time, so the other worker
# runs the rest meanwhile, and both finish about together. (Spark's other tests, the benchmarks
# and the browser are heavy on CPU, but kill nothing and have no deadline a slower run misses.)
HEAVY_TESTS = (
    "tests/crash/",
    "tests/spark/test_spark_streaming.py::",
    "tests/spark/test_spark_server_outages.py::",
    "tests/api/test_exactly_once_loop.py::",
    "tests/api/test_log_lifecycle.py::test_a_crash_in_the_middle_of_retention_and_compaction",
    "tests/kafka/test_transactions_exactly_once.py::test_sigkill_during_transactions_then_exactly_once",
    "tests/sdk/test_sdk_examples.py::test_consume_transform_produce_is_exactly_once_across_a_server_sigkill",
    "tests/sdk/test_sdk_faults.py::test_poll_keeps_its_timeout_while_the_server_is_down_and_goes_on_after_its_restart",
)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, called only when it runs the tests
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """The scheduler of `-n N` (whose --dist is load unless told otherwise): HeavyTestsApart."""
    if config.getvalue("dist") != "load":
        return None  # another --dist asked for: pytest-xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class HeavyTestsApart(LoadScopeScheduling):
        """The heavy tests are one unit of work, so one worker runs them, one after the other, while
        the others run the rest test by test. The largest unit is handed out first (pytest-xdist
        sorts them by their number of tests), so the heavy tests start at once, and the worker that
        ran them takes the others' tests once it is done. (pytest-xdist's own `--dist loadgroup`
        would do the same with xdist_group marks, but its marks are lost on pytest 9.2, which no
        longer reads the node id it rewrites.) _split_scope is how pytest-xdist's own schedulers
        (loadfile, loadgroup) subclass this one; the dev extra pins pytest-xdist below 4."""

        def _split_scope(self, nodeid: str) -> str:
            return "heavy" if nodeid.startswith(HEAVY_TESTS) else nodeid

    return HeavyTestsApart(config, log)


def database_url_for(base_url: str, database: str) -> str:
    parts = urlsplit(base_url)
    return urlunsplit(parts._replace(path=f"/{database}"))


@pytest.fixture(scope="session")
def postgres() -> Iterator[EmbeddedPostgres]:
    # One per pytest-xdist worker (a session each), not one shared: nothing to coordinate between
    # the workers (who creates the template, who stops it last), and the fixed names tests give
    # their databases stay unique per cluster. A second cluster costs one start and one migration.
    # Under /tmp (short: the socket path is limited to 107 bytes), removed afterwards.
    data_dir = Path(tempfile.mkdtemp(prefix="txb-test-"))
    # fsync off: this cluster is never crashed (the tests kill servers, and the PostgreSQL of data dirs of
    # their own, whose settings stay the defaults) and its data is deleted after the session; with fsync
    # on, every test database's DROP waited for its files to reach the disk.
    server = EmbeddedPostgres(
        data_dir / "pg", bindir=os.environ.get("TXBROKER_POSTGRES_BINDIR"), server_settings={"fsync": "off"}
    )
    server.start()
    try:
        server.create_database(TEMPLATE_DATABASE)
        upgrade_to_head(database_url_for(server.database_url, TEMPLATE_DATABASE))
        yield server
    finally:
        server.stop(immediate=True)  # its data is deleted next: no shutdown checkpoint needed
        shutil.rmtree(data_dir, ignore_errors=True)


class SpareDatabases:
    """Test databases cloned from the template one test ahead, and dropped after their test, on a thread
    of their own: a clone (8 MB written) and a drop take a few hundred ms that each test otherwise
    waited for, while its own server and clients mostly wait on the network. A test still gets a
    database nobody used, identical to the template."""

    def __init__(self, postgres: EmbeddedPostgres) -> None:
        self.postgres = postgres
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-databases")
        self.drops: list[concurrent.futures.Future] = []
        self.spare = self.executor.submit(self._clone)

    def _clone(self) -> str:
        name = f"test_{os.getpid()}_{next(_database_numbers)}"
        self.postgres.create_database(name, template=TEMPLATE_DATABASE)
        return name

    def take(self) -> str:
        name = self.spare.result()
        self.spare = self.executor.submit(self._clone)
        return name

    def drop_later(self, name: str) -> None:
        self.drops.append(self.executor.submit(drop_database, self.postgres, name))

    def close(self) -> None:
        """Drops the spare and waits for every drop, raising the first that failed."""
        self.drop_later(self.spare.result())
        self.executor.shutdown(wait=True)
        for drop in self.drops:
            drop.result()


@pytest.fixture(scope="session")
def spare_databases(postgres: EmbeddedPostgres) -> Iterator[SpareDatabases]:
    spares = SpareDatabases(postgres)
    yield spares
    spares.close()


@pytest.fixture
def database_url(postgres: EmbeddedPostgres, spare_databases: SpareDatabases) -> Iterator[str]:
    """A fresh, migrated database for this test, dropped after it."""
    name = spare_databases.take()
    yield database_url_for(postgres.database_url, name)
    spare_databases.drop_later(name)


def drop_database(postgres: EmbeddedPostgres, name: str) -> None:
    """Drops a test's database once the test is done with it (FORCE: whatever is still connected,
    e.g. a killed server's backends, is disconnected). Kept, the session's databases (hundreds,
    gigabytes with the WAL their copies wrote) were deleted with its data dir at its end, which
    took far longer than dropping each after its test."""

    async def drop() -> None:
        connection = await asyncpg.connect(database_url_for(postgres.database_url, "postgres"))
        try:
            await connection.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        finally:
            await connection.close()

    # On a thread of its own: the test's thread may run an event loop (Playwright's sync API does).
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as executor:
        executor.submit(asyncio.run, drop()).result()


def free_ports_outside_the_ephemeral_range(count: int = 1) -> list[int]:
    """Loopback ports nothing is bound to, for processes that bind them themselves (`serve --port`,
    a PostgreSQL's TCP port) some time after this returns, and again after a restart. Below the
    range the kernel hands out for port 0 and for outgoing connections
    (/proc/sys/net/ipv4/ip_local_port_range), so that no socket of another test (of this pytest-xdist
    worker or of the other) is given one meanwhile. Each probe is bound and closed unconnected: it
    leaves no TIME_WAIT behind."""
    lowest_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = []
    for port in random.sample(range(lowest_ephemeral // 2, lowest_ephemeral), 100):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"fewer than {count} free loopback ports below {lowest_ephemeral} in 100 tries")


def loopback_socket(reuse_port: bool = True) -> socket.socket:
    """`reuse_port`: as `serve` binds its own socket, so that the workers of `--workers N` after the
    first bind theirs beside it (app/runtime/worker_processes.py). Without it, every worker accepts on this one."""
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only for sockets
    # created with it; without, every keep-alive request waits ~40 ms for Nagle's algorithm.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


@dataclass
class RunningServer:
    url: str
    database_url: str
    client: httpx.Client
    settings: Settings
    extra: dict = field(default_factory=dict)


# httpx builds an SSL context per Client or per call of httpx.get (loading the CA bundle, a tenth of a
# second) unless given one; test clients never use TLS.
SHARED_SSL_CONTEXT = ssl.create_default_context()


def wait_until_healthy(url: str, timeout_s: float = 60, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before it was healthy")
        try:
            response = httpx.get(f"{url}/v1/health", timeout=2, verify=SHARED_SSL_CONTEXT)
            if response.status_code == 200:
                return
            last = response.text
        except httpx.HTTPError as error:
            last = repr(error)
        time.sleep(0.05)
    raise RuntimeError(f"the server at {url} was not healthy within {timeout_s}s: {last}")


def start_in_process_server(database_url: str, **setting_overrides) -> RunningServer:
    """The app served by uvicorn in a background thread, over real HTTP on a loopback socket."""
    sock = loopback_socket()
    port = sock.getsockname()[1]
    # No Kafka listener unless a test asks for one (the `kafka_server` fixture): not every server may take 9092.
    setting_overrides.setdefault("kafka_listener", "off")
    # Kafka groups complete their first rebalance at once unless a test wants Kafka's wait.
    setting_overrides.setdefault("group_initial_rebalance_delay_ms", 0)
    settings = Settings(database_url=database_url, port=port, **setting_overrides)
    app = create_app(settings, database_url)
    config = uvicorn.Config(
        app, log_level="warning", loop="uvloop", http="httptools", lifespan="on", **proxy_header_options(settings)
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: uvloop.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_until_healthy(url)
    client = httpx.Client(base_url=url, timeout=60, verify=SHARED_SSL_CONTEXT)
    extra = {"uvicorn": server, "thread": thread}
    if app.state.kafka_listeners is not None:
        extra["kafka_bootstrap"] = "{}:{}".format(*app.state.kafka_listeners.advertised[:2])
        extra["kafka_listeners"] = {
            listener.security_protocol: "{}:{}".format(*listener.advertised[:2])
            for listener in app.state.kafka_listeners.listeners
        }
    return RunningServer(url, database_url, client, settings, extra=extra)


def start_server_on_fresh_database(postgres: EmbeddedPostgres, name: str, **setting_overrides) -> RunningServer:
    """A server on a database of its own, which stop_in_process_server drops."""
    postgres.create_database(name, template=TEMPLATE_DATABASE)
    running = start_in_process_server(database_url_for(postgres.database_url, name), **setting_overrides)
    running.extra["drop_database"] = functools.partial(drop_database, postgres, name)
    return running


def stop_in_process_server(running: RunningServer) -> None:
    running.client.close()
    running.extra["uvicorn"].should_exit = True
    running.extra["thread"].join(timeout=30)
    if "drop_database" in running.extra:
        running.extra["drop_database"]()


@contextlib.contextmanager
def restarted_after(running: RunningServer, down_s: float, **setting_overrides) -> Iterator[RunningServer]:
    """Stops `running` (a server on a fresh database of its own: start_server_on_fresh_database),
    leaves the database without any server for `down_s` seconds, then starts one on it again with
    `setting_overrides`; that one is stopped, and the database dropped, on exit."""
    drop = running.extra.pop("drop_database")
    stop_in_process_server(running)
    time.sleep(down_s)
    restarted = start_in_process_server(running.database_url, **setting_overrides)
    try:
        yield restarted
    finally:
        restarted.extra["drop_database"] = drop
        stop_in_process_server(restarted)


@pytest.fixture
def make_server(database_url: str):
    """Starts in-process servers (uvicorn in a thread, real HTTP on loopback) with custom settings."""
    started: list[RunningServer] = []

    def start(**setting_overrides) -> RunningServer:
        running = start_in_process_server(database_url, **setting_overrides)
        started.append(running)
        return running

    yield start
    for running in started:
        stop_in_process_server(running)


@pytest.fixture
def server(make_server) -> RunningServer:
    return make_server()


@pytest.fixture
def kafka_server(make_server) -> RunningServer:
    """A server with a Kafka listener on a free loopback port, advertised as bound:
    `kafka_server.extra["kafka_bootstrap"]` is its HOST:PORT."""
    return make_server(kafka_listener="127.0.0.1:0")


@pytest.fixture(scope="module")
def module_server(request, postgres: EmbeddedPostgres):
    """One server (and database) for a whole test module, for modules with many cases that do not
    need fresh state (a fresh server per test costs ~0.5 s); their tests use names of their own."""
    name = "module_" + re.sub(r"\W", "_", request.module.__name__.rsplit(".", 1)[-1])
    running = start_server_on_fresh_database(postgres, name)
    yield running
    stop_in_process_server(running)


@pytest.fixture
def module_client(module_server):
    """A client of its own per test on the module's server, so a connection one test breaks cannot
    fail the next."""
    with httpx.Client(base_url=module_server.url, timeout=60, verify=SHARED_SSL_CONTEXT) as client:
        yield client


@pytest.fixture
def data_dir():
    """A fresh directory for a server's embedded PostgreSQL, under /tmp (short socket paths)."""
    path = Path(tempfile.mkdtemp(prefix="txb-data-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def process_alive(pid: int) -> bool:
    """True while the process runs (a zombie awaiting its reaper counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


class ServerProcess:
    """A `txbroker serve` subprocess on a loopback socket we bound (passed by fd, so no port race)."""

    def __init__(self, *args: str, env: dict | None = None, reuse_port: bool = True) -> None:
        self.sock = loopback_socket(reuse_port)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.args = args
        # No Kafka listener on 9092 unless the test's env asks for one (several servers run at once);
        # Kafka groups complete their first rebalance at once unless the test's env wants the delay.
        # One worker unless the test asks for more (`--workers N`, which overrides the environment):
        # serve's default, one per core, would make each start import and ready the app once per
        # core, one worker after the other (tests/crash/test_worker_processes.py and the others that
        # pass --workers are where several workers are tested).
        self.env = {
            **os.environ,
            "TXBROKER_KAFKA_LISTENER": "off",
            "TXBROKER_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
            "TXBROKER_WORKERS": "1",
            **(env or {}),
        }
        self.process: subprocess.Popen | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="txb-server-", suffix=".log")[1])

    def start(self, timeout_s: float = 90) -> ServerProcess:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "serve", "--fd", str(self.sock.fileno()), *self.args],
                pass_fds=[self.sock.fileno()],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env=self.env,
            )
        try:
            wait_until_healthy(self.url, timeout_s, self.process)
        except RuntimeError as error:
            raise RuntimeError(f"{error}\n--- server log ---\n{self.log_path.read_text()[-4000:]}") from None
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL, as a crash would: no shutdown code runs."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def terminate(self, timeout_s: float = 30) -> int:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            return self.process.wait(timeout=timeout_s)
        return self.process.returncode if self.process else 0

    def close(self) -> None:
        self.kill()
        self.sock.close()
        self.log_path.unlink(missing_ok=True)


@pytest.fixture
def server_process():
    """Factory: server_process("--database-url", url) -> a started ServerProcess; all stopped after."""
    processes: list[ServerProcess] = []

    def start(*args: str, env: dict | None = None, reuse_port: bool = True) -> ServerProcess:
        process = ServerProcess(*args, env=env, reuse_port=reuse_port)
        processes.append(process)
        return process.start()

    yield start
    for process in processes:
        process.close()
