"""The processes a benchmark run owns: an embedded PostgreSQL, HTTP servers started as subprocesses on
loopback sockets we bound (passed by fd, as tests/conftest.py does), and the CPU time each one uses.

`BenchProcesses` is the harness every benchmark's main starts them with: whatever it started is stopped
by pid when the `with` block ends, however it ends.
"""

from __future__ import annotations

import os
import pstats
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

from app.runtime.embedded_postgres import EmbeddedPostgres
from app.runtime.listening_sockets import bound_accepting_socket

REPO_ROOT = Path(__file__).resolve().parents[1]
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def database_url_for(base_url: str, database: str) -> str:
    """The embedded server's URL pointing at another database of the same server."""
    return urlunsplit(urlsplit(base_url)._replace(path=f"/{database}"))


def loopback_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # As `serve` binds its own socket: the workers of `--workers N` after the first bind theirs
    # beside it, and the kernel spreads the connections over them (app/runtime/worker_processes.py).
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    # uvicorn opens a socket given by fd as AF_UNIX (uvicorn/config.py, socket.fromfd), so the event
    # loop never sets TCP_NODELAY on the connections it accepts, and Nagle's algorithm meets the
    # client's delayed ACK: every request waits for the delayed ACK's timer. Accepted
    # sockets inherit the option from the listening socket on Linux, so set it here to measure what
    # a server bound with --port does.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    return sock


class ServerSubprocess:
    """An HTTP server subprocess serving on a socket we bound, so its port is known before it starts
    and no other process can take it. `command` gets the socket's fd number appended."""

    def __init__(self, name: str, command: list[str], cwd: Path = REPO_ROOT, env: dict | None = None) -> None:
        self.name = name
        self.sock = loopback_socket()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.log_path = Path(tempfile.mkstemp(prefix=f"txb-bench-{name}-", suffix=".log")[1])
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [*command, str(self.sock.fileno())],
                pass_fds=[self.sock.fileno()],
                cwd=cwd,
                env=None if env is None else {**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_until_answering(self, path: str, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                response = httpx.get(self.url + path, timeout=2)
                if response.status_code == 200:
                    return
                last = f"{response.status_code} {response.text[:200]}"
            except httpx.HTTPError as error:
                last = repr(error)
            time.sleep(0.1)
        raise RuntimeError(
            f"{self.name} ({' '.join(self.process.args)}) did not answer 200 on {path} "
            f"within {timeout_s}s: {last}\n--- its log ---\n{self.log_text()}"
        )

    def log_text(self, max_chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-max_chars:]

    def stop(self, timeout_s: float = 20) -> None:
        """SIGTERM (graceful), then SIGKILL if it does not exit in time."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self.sock.close()
        self.log_path.unlink(missing_ok=True)


def start_txbroker(
    database_url: str,
    profile_to: Path | None = None,
    workers: int = 1,
    checkout: Path | None = None,
    kafka_listener: str = "off",
) -> ServerSubprocess:
    """`txbroker serve` with `workers` worker processes, under cProfile when `profile_to` is given (the
    stats are written there when it exits, on stop(); profiling needs one worker, so that the profiled
    process serves). `checkout`: serve the code of another checkout (e.g. an older commit, extracted
    with `git archive`) with this environment, to compare versions in one run; the worker count goes
    by TXBROKER_WORKERS, which versions without workers ignore. `kafka_listener`: HOST:PORT of its
    Kafka listener (BenchProcesses.kafka_address holds a port for it), off by default."""
    if profile_to is not None and workers != 1:
        raise ValueError(f"--profile-server profiles one process: expected 1 worker, received {workers}")
    profiler = [] if profile_to is None else ["-m", "cProfile", "-o", str(profile_to)]
    server = ServerSubprocess(
        "txbroker",
        [
            sys.executable,
            *profiler,
            "-m",
            "app.cli",
            "serve",
            "--database-url",
            database_url,
            "--log-level",
            "warning",
            "--fd",
        ],
        cwd=checkout or REPO_ROOT,
        # No Kafka listener unless asked: the HTTP benches measure HTTP, and 9092 may be taken.
        env={"TXBROKER_WORKERS": str(workers), "TXBROKER_KAFKA_LISTENER": kafka_listener},
    )
    return _answering(server, "/v1/health")


def start_naive_app(database_url: str, workers: int = 1) -> ServerSubprocess:
    """The naive FastAPI + asyncpg produce app (bench/naive_app.py), the produce ceiling."""
    server = ServerSubprocess("naive", [sys.executable, "-m", "bench.naive_app", database_url, str(workers)])
    return _answering(server, "/v1/health")


def start_empty_post_server() -> ServerSubprocess:
    server = ServerSubprocess("empty-post", [sys.executable, "-m", "bench.empty_post_app"])
    return _answering(server, "/ready")


def _answering(server: ServerSubprocess, path: str) -> ServerSubprocess:
    """`server` once it answers 200 on `path`; stopped (by pid) if it never does."""
    try:
        server.wait_until_answering(path)
    except BaseException:
        server.stop()
        raise
    return server


def print_profile(path: Path, top: int = 30) -> None:
    """Where the server's CPU went: functions by own time, and the request paths by cumulative time."""
    stats = pstats.Stats(str(path))
    print(f"\n--- txbroker under cProfile ({path}): by own time ---")
    stats.sort_stats("tottime").print_stats(top)
    print("--- by cumulative time, txbroker's code ---")
    stats.sort_stats("cumulative").print_stats(r"/app/", top)


class BenchProcesses:
    """One benchmark run's processes: an embedded PostgreSQL in a fresh folder under /tmp (the unix
    socket path of PostgreSQL is limited to 107 bytes), its databases, and the servers started
    through it. On leaving the `with` block, however it is left, everything is stopped in the reverse
    order of its start, each step even when an earlier one failed: what `stop_on_exit` was given
    (client processes, Spark), the servers (by pid), PostgreSQL; then the folder is removed."""

    def __init__(self, prefix: str = "txb-bench-") -> None:
        self._stops = ExitStack()
        self.work_dir = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        self._stops.callback(shutil.rmtree, self.work_dir, ignore_errors=True)
        self.postgres = EmbeddedPostgres(self.work_dir / "pg")

    def __enter__(self) -> BenchProcesses:
        self._stops.callback(self.postgres.stop)
        try:
            self.postgres.start()
        except BaseException:
            self._stops.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stops.close()

    def database(self, name: str) -> str:
        """A new database of the embedded server, by URL."""
        self.postgres.create_database(name)
        return database_url_for(self.postgres.database_url, name)

    def txbroker(self, database_url: str, **options) -> ServerSubprocess:
        """`txbroker serve` on `database_url` (options: those of `start_txbroker`)."""
        return self._stopped_on_exit(start_txbroker(database_url, **options))

    def kafka_address(self) -> str:
        """HOST:PORT of a free loopback port for a server's Kafka listener, held until the run ends as
        `serve` holds its ports (a socket bound beside the listener's, never listening), so that no
        other process takes it meanwhile."""
        holder = bound_accepting_socket("127.0.0.1", 0)
        self._stops.callback(holder.close)
        return "127.0.0.1:{}".format(holder.getsockname()[1])

    def naive_app(self, database_url: str, workers: int = 1) -> ServerSubprocess:
        return self._stopped_on_exit(start_naive_app(database_url, workers))

    def empty_post_server(self) -> ServerSubprocess:
        return self._stopped_on_exit(start_empty_post_server())

    def stop_on_exit(self, stop: Callable[[], object]) -> None:
        """Calls `stop` (client processes' close, Spark's stop) when the run ends."""
        self._stops.callback(stop)

    def _stopped_on_exit(self, server: ServerSubprocess) -> ServerSubprocess:
        self._stops.callback(server.stop)
        return server


# ---- CPU accounting, from /proc


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (which may contain spaces)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2 :].split()


def process_cpu_s(pid: int, include_reaped_children: bool = False) -> float:
    """CPU seconds (user + system) used by a process so far."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    # After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
    ticks = int(fields[11]) + int(fields[12])
    if include_reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / CLOCK_TICKS_PER_S


def process_tree_cpu_s(root_pid: int) -> float:
    """CPU seconds of a process and its direct children (a postmaster and its backends), counting
    children that already exited through the parent's cutime/cstime."""
    total = process_cpu_s(root_pid, include_reaped_children=True)
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and int(fields[1]) == root_pid:
                total += process_cpu_s(int(entry.name))
    return total


def machine_busy_cpu_s() -> float:
    """CPU seconds all cores of the machine spent on anything but idling (from /proc/stat)."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()  # cpu user nice system idle iowait irq softirq steal ...
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS_PER_S


@dataclass(frozen=True)
class CpuSnapshot:
    """Cumulative CPU seconds of the HTTP server, of PostgreSQL and of the whole machine, at a
    time.monotonic() instant."""

    server_s: float
    postgres_s: float
    machine_s: float
    at: float


class CpuMeter:
    """Snapshots the CPU time of one server (or none) and of the postmaster's tree. A server is its
    process and its direct children: the worker processes of `serve --workers N`."""

    def __init__(self, postmaster_pid: int, server_pid: int | None) -> None:
        self.postmaster_pid = postmaster_pid
        self.server_pid = server_pid

    def snapshot(self) -> CpuSnapshot:
        return CpuSnapshot(
            server_s=process_tree_cpu_s(self.server_pid) if self.server_pid else 0.0,
            postgres_s=process_tree_cpu_s(self.postmaster_pid),
            machine_s=machine_busy_cpu_s(),
            at=time.monotonic(),
        )
