"""`txbroker serve --workers N`: N server processes accepting connections on one listening socket.

One Python process serves on one core; N processes on one port use N. The supervisor (the process
the user started) owns what must exist once per node: the embedded PostgreSQL (its flock and
pdeathsig tie it to this process) and the listening socket, which it binds (or is given with --fd)
and hands to each worker, a `txbroker serve --fd K --workers 1` child. The kernel spreads the
accepted connections over the workers.

Invariants:
- Workers share nothing but PostgreSQL, as separate `txbroker serve` processes on one database
  always could (DESIGN.md: no state that correctness depends on lives only in process memory).
  Per-process state stays per process: /metrics counters, long-poll slots, the null-key
  round-robin of the records endpoint.
- A worker never outlives the supervisor: it asks the kernel for SIGKILL when its parent dies
  (PR_SET_PDEATHSIG), then checks that its parent is still the supervisor (it may have died before
  the request took effect). So a SIGKILL of the supervisor takes down the workers and, through its
  own pdeathsig, the embedded PostgreSQL: no orphan keeps serving or holding the data dir.
- Worker 0 starts alone and does, as a single server would, what must happen once per node before
  serving: the migrations and the recovery of transactions left PrepareCommit/PrepareAbort,
  answering 503 meanwhile. Only once it is ready (it writes to a pipe) do the others start, and
  they accept only once ready themselves. Recovery claims transactions with SKIP LOCKED, so workers
  recovering at once could each skip what another is finishing and declare themselves ready too
  early: a client that has seen /v1/health answer 200 must find every decided transaction done.
- Workers run in their own process group, so a Ctrl-C in the terminal reaches the supervisor
  alone, which then stops them (SIGTERM: graceful) before it stops PostgreSQL.
- A worker that exits on its own stops the node: the supervisor stops the others and exits 1, and
  the service manager restarts the node as a whole (no half-sized node serving silently).
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

from app.settings import Settings

log = logging.getLogger("txbroker")

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
LISTEN_BACKLOG = 2048
# A worker has uvicorn's graceful shutdown (10 s) and its own clean-up to stop after SIGTERM.
WORKER_STOP_TIMEOUT_S = 20
WORKER_POLL_INTERVAL_S = 0.5


class ShutdownRequested(Exception):
    """Raised in the main thread by the SIGTERM/SIGINT handler."""


def die_with_supervisor(supervisor_pid: int) -> None:
    """Called first thing in a worker: SIGKILL when the supervisor dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed: a worker could outlive its supervisor")
    if os.getppid() != supervisor_pid:
        # The supervisor died before the request took effect: nothing would ever stop us.
        os._exit(1)


def bind_listening_socket(host: str, port: int) -> socket.socket:
    """The socket every worker accepts on. TCP_NODELAY is set here because accepted sockets inherit
    it on Linux, and uvicorn sets no option on a socket it is given by fd (see cli._disable_nagle)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.set_inheritable(True)
    return sock


def _worker_environment(settings: Settings, database_url: str) -> dict[str, str]:
    """The supervisor's settings, as the TXBROKER_* variables a worker reads them from, so a worker
    runs with exactly the settings the supervisor resolved from its environment and flags."""
    environment = dict(os.environ)
    for name, value in settings.model_dump(mode="json").items():
        key = f"TXBROKER_{name.upper()}"
        if value is None:
            environment.pop(key, None)
        elif isinstance(value, bool):
            environment[key] = "true" if value else "false"
        else:
            environment[key] = str(value)
    environment["TXBROKER_DATABASE_URL"] = database_url
    environment["TXBROKER_WORKERS"] = "1"
    return environment


def readiness_signal(ready_fd: int | None) -> Callable[[], None] | None:
    """In worker 0: what tells the supervisor that this worker is ready (one byte on a pipe)."""
    if ready_fd is None:
        return None

    def signal_ready() -> None:
        os.write(ready_fd, b"r")
        os.close(ready_fd)

    return signal_ready


def _start_worker(index: int, fd: int, environment: dict[str, str], ready_fd: int | None = None) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "app.cli",
        "serve",
        "--fd",
        str(fd),
        "--workers",
        "1",
        "--worker-of",
        str(os.getpid()),
        "--worker-index",
        str(index),
    ]
    if ready_fd is not None:
        command += ["--ready-fd", str(ready_fd)]
    return subprocess.Popen(
        command,
        pass_fds=[fd] if ready_fd is None else [fd, ready_fd],
        env=environment,
        stdin=subprocess.DEVNULL,
        process_group=0,
    )


def _wait_until_ready(first: subprocess.Popen, ready_read_fd: int) -> bool:
    """Until worker 0 signals ready (True) or exits (False). SIGTERM/SIGINT interrupt it."""
    while first.poll() is None:
        readable, _, _ = select.select([ready_read_fd], [], [], WORKER_POLL_INTERVAL_S)
        if readable:
            return os.read(ready_read_fd, 1) == b"r"
    return False


def _stop(workers: list[subprocess.Popen]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(WORKER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning(
                "worker pid %d did not stop within %d s of SIGTERM: killing it", worker.pid, WORKER_STOP_TIMEOUT_S
            )
            worker.kill()
            worker.wait()


def supervise(settings: Settings, database_url: str, fd: int, count: int) -> int:
    """Runs `count` workers on the listening socket `fd` until SIGTERM/SIGINT (returns 0, after
    stopping them gracefully) or until one exits on its own (returns 1, after stopping the others).
    The caller has installed signal handlers that raise ShutdownRequested."""
    environment = _worker_environment(settings, database_url)
    workers: list[subprocess.Popen] = []
    ready_read_fd, ready_write_fd = os.pipe()
    try:
        workers.append(_start_worker(0, fd, environment, ready_write_fd))
        os.close(ready_write_fd)  # worker 0 holds the only write end: its death ends the wait too
        if not _wait_until_ready(workers[0], ready_read_fd):
            log.error(
                "worker pid %d exited before it was ready (exit code %s): restart txbroker (its log above says why)",
                workers[0].pid,
                workers[0].poll(),
            )
            return 1
        for index in range(1, count):
            workers.append(_start_worker(index, fd, environment))
        log.info(
            "txbroker serves with %d worker processes (pids %s) on %s",
            count,
            ", ".join(str(worker.pid) for worker in workers),
            settings.public_url(),
        )
        # Polled, not os.wait(): that would also reap the embedded PostgreSQL, our child too.
        while (exited := next((worker for worker in workers if worker.poll() is not None), None)) is None:
            time.sleep(WORKER_POLL_INTERVAL_S)
        log.error(
            "worker pid %d exited on its own (exit code %d): stopping the other workers; restart "
            "txbroker (its log above says why the worker stopped)",
            exited.pid,
            exited.returncode,
        )
        return 1
    except ShutdownRequested:
        return 0
    finally:
        os.close(ready_read_fd)
        _stop(workers)
