"""`txbroker serve --workers N`: N server processes accepting connections on one port.

One Python process serves on one core; N processes on one port use N. The supervisor (the process
the user started) owns what must exist once per node: the embedded PostgreSQL (its flock and
pdeathsig tie it to this process) and the listening socket, which it binds (or is given with --fd)
and hands to each worker, a `txbroker serve --fd K --workers 1` child. Worker 0 accepts on it. When
it allows port reuse (SO_REUSEPORT, as the supervisor binds it), each other worker binds a socket
of its own to the same address and listens once ready (`worker_listening_socket`): the kernel then
hashes each new connection to one of the workers' sockets. On one shared socket, whichever worker
accepts first takes every connection waiting, so the connections a load client opens together
can all land on one worker while the others idle (`python -m bench.transactions --workers 2` shows
it). A socket given without SO_REUSEPORT is shared by every worker, as before.

Invariants:
- Workers share nothing but PostgreSQL, as separate `txbroker serve` processes on one database
  always could (docs/design.md, "Storage model": no state that correctness depends on lives only in
  process memory). Per-process state stays per process: long-poll slots, the null-key round-robin
  of the records endpoint. The /metrics counters are the node's: each worker writes its own to
  files in the node's metrics folder, set and wiped here before any worker starts
  (app/runtime/metrics_folder.py).
- A worker never outlives the supervisor: it asks the kernel for SIGKILL when its parent dies
  (PR_SET_PDEATHSIG), then checks that its parent is still the supervisor (it may have died before
  the request took effect). So a SIGKILL of the supervisor takes down the workers and, through its
  own pdeathsig, the embedded PostgreSQL: no orphan keeps serving or holding the data dir.
- Worker 0 does, as a single server would, what must happen once per node before serving: the
  migrations and the recovery of transactions left PrepareCommit/PrepareAbort, answering 503
  meanwhile. The others are started with it, but only import the server's code (the bulk of a
  start, done side by side on the node's cores) and then wait, touching neither PostgreSQL nor
  their sockets, until worker 0 is ready (it writes to a pipe, and the supervisor then to theirs);
  they accept only once ready themselves. Recovery claims transactions with SKIP LOCKED, so workers
  recovering at once could each skip what another is finishing and declare themselves ready too
  early: a client that has seen /v1/health answer 200 must find every decided transaction done.
- /v1/health answers 200 only once every worker is ready (node_ready_waiter), so the clients that
  connect as soon as it does are spread over all of them, not left on the workers started first.
- Workers run in their own process group, so a Ctrl-C in the terminal reaches the supervisor
  alone, which then stops them (SIGTERM: graceful) before it stops PostgreSQL.
- A worker that exits on its own stops the node: the supervisor stops the others and exits 1, and
  the service manager restarts the node as a whole (no half-sized node serving silently).
- A worker that hangs is killed, which then stops the node as above: a ready worker writes a byte to
  its readiness pipe every WORKER_BEAT_INTERVAL_S from its event loop, and the supervisor kills one
  it has not heard for `worker_hang_timeout_ms` (a stopped process, an event loop blocked, a
  deadlock). Before, a hung worker kept the node listed (its live workers announce it) while the
  connections the kernel handed it waited, its Kafka clients until their own timeouts; gunicorn's
  `--timeout` kills its workers for the same reason. Time in which the supervisor itself did not run
  (the whole node stopped, the machine frozen) counts against no worker (SilenceWatch).
- A node restarted at once after a crash binds its ports at the first try, whatever connections the
  dead node left on them; a node started on a port a live node serves is refused (PortInUse): the
  rules of app/runtime/listening_sockets.py, for the HTTP port and the Kafka listener's alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

from app.runtime.metrics_folder import (
    MULTIPROCESS_DIR_VARIABLE,
    empty_metrics_folder,
    forget_dead_worker,
    node_metrics_folder,
)
from app.settings import Settings

log = logging.getLogger("txbroker")

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
# A worker has uvicorn's graceful shutdown (10 s) and its own clean-up to stop after SIGTERM.
WORKER_STOP_TIMEOUT_S = 20
WORKER_POLL_INTERVAL_S = 0.5
# How often a ready worker's event loop tells the supervisor it runs (a byte on its readiness pipe).
WORKER_BEAT_INTERVAL_S = 1.0
# A look of the supervisor's that comes this much later than its poll interval means that the
# supervisor did not run meanwhile: that time counts against no worker (SilenceWatch).
SUPERVISOR_LATE_S = 2.0
READY = b"r"
BEAT = b"b"
# The exit code of a `serve` that refused to start with a message saying why (invalid settings, a port
# in use, a database a newer txbroker migrated): restarting it changes nothing until that is fixed.
REFUSED_TO_START = 2


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
    """In a worker: what tells the supervisor that this worker is ready (one byte on a pipe), called
    on the worker's event loop, and from then on that the loop runs (a byte every
    WORKER_BEAT_INTERVAL_S on the same pipe: the supervisor kills a worker that goes silent)."""
    if ready_fd is None:
        return None

    def signal_ready() -> None:
        os.set_blocking(ready_fd, False)
        os.write(ready_fd, READY)  # the pipe is empty: it fits
        _beat(asyncio.get_running_loop(), ready_fd)

    return signal_ready


def _beat(loop: asyncio.AbstractEventLoop, ready_fd: int) -> None:
    try:
        os.write(ready_fd, BEAT)
    except BlockingIOError:
        pass  # the pipe is full: the supervisor has not read it (stopped); it does not judge by that time
    except OSError:
        return  # its end closed: the supervisor is gone (pdeathsig ends us) or stopping the node
    loop.call_later(WORKER_BEAT_INTERVAL_S, _beat, loop, ready_fd)


class SilenceWatch:
    """The supervisor's ear on its ready workers' beats (readiness_signal): `listen` waits for them
    up to a poll interval, and kills a worker not heard for `timeout_s` (0: never)."""

    def __init__(self, timeout_s: float, started: list[tuple[subprocess.Popen, int]]) -> None:
        now = time.monotonic()
        self.timeout_s = timeout_s
        self.workers = {ready_read_fd: worker for worker, ready_read_fd in started}
        self.last_heard = {ready_read_fd: now for _, ready_read_fd in started}
        self.last_listened = now
        self.killed: set[int] = set()  # their pids

    def listen(self, wait_s: float) -> None:
        if self.last_heard:
            readable, _, _ = select.select(list(self.last_heard), [], [], wait_s)
        else:
            readable = []
            time.sleep(wait_s)
        now = time.monotonic()
        if now - self.last_listened > wait_s + SUPERVISOR_LATE_S:
            # The supervisor did not run meanwhile (the node stopped, the machine frozen or swapping):
            # the workers' silence then is not theirs; each is judged from now.
            self.last_heard = dict.fromkeys(self.last_heard, now)
        self.last_listened = now
        for ready_read_fd in readable:
            if os.read(ready_read_fd, 4096):
                self.last_heard[ready_read_fd] = now
            else:  # its end closed: the worker is exiting, which the supervisor sees
                del self.last_heard[ready_read_fd]
        if not self.timeout_s:
            return
        for ready_read_fd, heard in list(self.last_heard.items()):
            if now - heard > self.timeout_s:
                worker = self.workers[ready_read_fd]
                log.error(
                    "worker pid %d has not answered for %.0f s (worker_hang_timeout_ms %d: its event loop is "
                    "blocked, or the process is stopped or deadlocked): killing it, which stops the node",
                    worker.pid,
                    now - heard,
                    round(self.timeout_s * 1000),
                )
                worker.kill()
                self.killed.add(worker.pid)
                del self.last_heard[ready_read_fd]


def wait_for_worker_0(start_fd: int | None) -> bool:
    """In a worker after the first, its code imported: blocks until worker 0 is ready (one byte on a
    pipe from the supervisor). False if the supervisor closed the pipe instead: worker 0 failed to
    start, and the supervisor is stopping the node."""
    if start_fd is None:
        return True
    try:
        return os.read(start_fd, 1) == b"r"
    finally:
        os.close(start_fd)


def node_ready_waiter(node_ready_fd: int | None) -> Callable[[], Awaitable[None]] | None:
    """In a worker: what awaits the supervisor's word that every worker is ready (one byte on a
    pipe). Until then the worker's /v1/health answers 503, although it serves once ready itself:
    worker 0 starts first (it migrates and recovers) and the others once it is ready, and a client
    that connected as soon as /v1/health said 200 would land on the workers started so far --
    clients that start with the service (a pool, a benchmark) all landed on worker 0, and kept
    their keep-alive connections there while the other cores idled."""
    if node_ready_fd is None:
        return None

    async def wait_for_node() -> None:
        loop = asyncio.get_running_loop()
        word = loop.create_future()

        def read_word() -> None:
            if not word.done():  # b"" if the supervisor died: never ready (pdeathsig ends us anyway)
                word.set_result(os.read(node_ready_fd, 1))

        loop.add_reader(node_ready_fd, read_word)
        try:
            if await word != b"r":
                await asyncio.Future()  # stay "starting" until stopped
        finally:
            loop.remove_reader(node_ready_fd)
            os.close(node_ready_fd)

    return wait_for_node


def _start_worker(
    index: int, fd: int, environment: dict[str, str], ready_fd: int, node_ready_fd: int, start_fd: int | None
) -> subprocess.Popen:
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
    command += ["--ready-fd", str(ready_fd), "--node-ready-fd", str(node_ready_fd)]
    passed = [fd, ready_fd, node_ready_fd]
    if start_fd is not None:
        command += ["--start-fd", str(start_fd)]
        passed.append(start_fd)
    return subprocess.Popen(
        command,
        pass_fds=passed,
        env=environment,
        stdin=subprocess.DEVNULL,
        process_group=0,
    )


def _wait_until_ready(first: subprocess.Popen, ready_read_fd: int) -> bool:
    """Until worker 0 signals ready (True) or exits (False). SIGTERM/SIGINT interrupt it."""
    while first.poll() is None:
        readable, _, _ = select.select([ready_read_fd], [], [], WORKER_POLL_INTERVAL_S)
        if readable:
            return os.read(ready_read_fd, 1) == READY
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
    stopping them gracefully) or until one exits on its own (returns 1, after stopping the others;
    REFUSED_TO_START if it refused to start, as `serve` does).
    The caller has installed signal handlers that raise ShutdownRequested."""
    environment = _worker_environment(settings, database_url)
    metrics_folder = node_metrics_folder(settings.host, settings.port)
    environment[MULTIPROCESS_DIR_VARIABLE] = str(metrics_folder)
    workers: list[subprocess.Popen] = []
    pipes: list[int] = []  # our ends, closed when we return

    def pipe() -> tuple[int, int]:
        read_fd, write_fd = os.pipe()
        pipes.extend((read_fd, write_fd))
        return read_fd, write_fd

    node_ready_write_fds: list[int] = []

    start_write_fds: list[int] = []

    def start(index: int) -> tuple[subprocess.Popen, int]:
        """Starts worker `index`: it, and the pipe end it writes one byte to once ready. A worker
        after the first also gets a pipe that tells it worker 0 is ready."""
        ready_read_fd, ready_write_fd = pipe()
        node_ready_read_fd, node_ready_write_fd = pipe()
        node_ready_write_fds.append(node_ready_write_fd)
        passed = [ready_write_fd, node_ready_read_fd]
        start_read_fd = None
        if index > 0:
            start_read_fd, start_write_fd = pipe()
            start_write_fds.append(start_write_fd)
            passed.append(start_read_fd)
        worker = _start_worker(index, fd, environment, ready_write_fd, node_ready_read_fd, start_read_fd)
        workers.append(worker)
        for worker_end in passed:  # the worker's ends: its death ends the wait
            os.close(worker_end)
            pipes.remove(worker_end)
        return worker, ready_read_fd

    def exit_code_if_not_ready(started: list[tuple[subprocess.Popen, int]]) -> int | None:
        """None once every worker of `started` is ready; else, having said why, the node's exit code:
        REFUSED_TO_START for a worker that refused to start (a restart would refuse again), else 1."""
        for worker, ready_read_fd in started:
            if _wait_until_ready(worker, ready_read_fd):
                continue
            # Its end of the pipe closed without a word: it is exiting, if its exit was not seen yet.
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(WORKER_STOP_TIMEOUT_S)
            if worker.returncode == REFUSED_TO_START:
                log.error("worker pid %d refused to start: its message above says why, and what to do", worker.pid)
                return REFUSED_TO_START
            log.error(
                "worker pid %d exited before it was ready (exit code %s): restart txbroker (its log above says why)",
                worker.pid,
                worker.returncode,
            )
            return 1
        return None

    try:
        # All at once; the others go on once worker 0 is ready (the migrations and the recovery).
        first = start(0)
        others = [start(index) for index in range(1, count)]
        if (exit_code := exit_code_if_not_ready([first])) is not None:
            return exit_code
        for start_write_fd in start_write_fds:
            with contextlib.suppress(BrokenPipeError):  # a worker that died since: exit_code_if_not_ready sees it
                os.write(start_write_fd, b"r")
        if (exit_code := exit_code_if_not_ready(others)) is not None:
            return exit_code
        for node_ready_write_fd in node_ready_write_fds:  # every worker is ready: /v1/health may say 200
            with contextlib.suppress(BrokenPipeError):  # a worker that died since: the loop below sees it
                os.write(node_ready_write_fd, b"r")
        log.info(
            "txbroker serves with %d worker processes (pids %s) on %s",
            count,
            ", ".join(str(worker.pid) for worker in workers),
            settings.public_url(),
        )
        watch = SilenceWatch(settings.worker_hang_timeout_ms / 1000, [first, *others])
        # Polled, not os.wait(): that would also reap the embedded PostgreSQL, our child too.
        while (exited := next((worker for worker in workers if worker.poll() is not None), None)) is None:
            watch.listen(WORKER_POLL_INTERVAL_S)
        forget_dead_worker(metrics_folder, exited.pid)  # the others may answer scrapes until they stop
        how = "was killed as hung" if exited.pid in watch.killed else "exited on its own"
        log.error(
            "worker pid %d %s (exit code %d): stopping the other workers; restart "
            "txbroker (its log above says why the worker stopped)",
            exited.pid,
            how,
            exited.returncode,
        )
        return 1
    except ShutdownRequested:
        return 0
    finally:
        for our_end in pipes:
            os.close(our_end)
        _stop(workers)
        empty_metrics_folder(metrics_folder)
