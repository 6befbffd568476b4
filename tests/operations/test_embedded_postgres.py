"""Tests of the embedded PostgreSQL launcher against real PostgreSQL servers.

Each test keeps its data dir under a fresh `tempfile.mkdtemp()` dir, which is
mode 0700: as root this proves the server user reaches its files through the
private mount namespace, not through the real path.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
import pytest

from app.runtime import embedded_postgres
from app.runtime.embedded_postgres import EmbeddedPostgres, EmbeddedPostgresError
from tests.conftest import free_ports_outside_the_ephemeral_range

REPO_ROOT = Path(__file__).resolve().parents[2]
DEBIAN_BINDIR = Path("/usr/lib/postgresql/15/bin")

# Runs in a child python: owns a server on the data dir argv[1] (with the bin
# dir argv[2] if given), prints the postmaster pid and the database URL, then
# stops the server when its stdin closes.
OWNER_SCRIPT = """
import sys
from app.runtime.embedded_postgres import EmbeddedPostgres
server = EmbeddedPostgres(*sys.argv[1:])
server.start()
print(server.pid, server.database_url, sep="\\n", flush=True)
sys.stdin.read()
server.stop()
"""


@pytest.fixture
def scratch_dir():
    path = Path(tempfile.mkdtemp(prefix="txbroker-pg-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _execute(url: str, statement: str) -> None:
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


async def _fetch_column(url: str, query: str) -> list:
    connection = await asyncpg.connect(url)
    try:
        return [row[0] for row in await connection.fetch(query)]
    finally:
        await connection.close()


def _is_running(pid: int) -> bool:
    """Alive and not a zombie (an orphan is reaped by init only eventually)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_until_exited(pid: int, timeout_s: float) -> bool:
    give_up_at = time.monotonic() + timeout_s
    while _is_running(pid):
        if time.monotonic() > give_up_at:
            return False
        time.sleep(0.05)
    return True


def _kill_if_running(pid: int | None) -> None:
    if pid is not None and _is_running(pid):
        os.kill(pid, signal.SIGKILL)


def _end_owner_process(owner: subprocess.Popen) -> None:
    if owner.poll() is None:
        owner.kill()
    owner.wait()
    for stream in (owner.stdin, owner.stdout, owner.stderr):
        stream.close()


def _start_owner_process(data_dir: Path, *, user: str | None = None) -> tuple[subprocess.Popen, int, str]:
    """Starts OWNER_SCRIPT (as `user` if given) and returns it with the
    postmaster pid and database URL it printed."""
    command = [sys.executable, "-c", OWNER_SCRIPT, str(data_dir)]
    if user is not None:
        command = ["setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}", "--clear-groups", *command]
    owner = subprocess.Popen(
        command, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    pid_line, url_line = owner.stdout.readline(), owner.stdout.readline()
    if not url_line:
        owner.kill()
        pytest.fail(f"the owner process printed {pid_line!r} and exited with stderr:\n{owner.communicate()[1]}")
    return owner, int(pid_line), url_line.strip()


def test_data_survives_a_restart(scratch_dir):
    server = EmbeddedPostgres(scratch_dir / "data")
    try:
        server.start()
        first_pid = server.pid
        versions = asyncio.run(_fetch_column(server.database_url, "SHOW server_version"))
        assert versions[0].startswith("18.")
        asyncio.run(_execute(server.database_url, "CREATE TABLE kept (value text); INSERT INTO kept VALUES ('hello')"))

        server.stop()
        assert server.pid is None
        assert not _is_running(first_pid)

        server.start()
        assert server.pid != first_pid
        assert asyncio.run(_fetch_column(server.database_url, "SELECT value FROM kept")) == ["hello"]
        server.start()  # idempotent while running
    finally:
        server.stop()


def test_second_owner_of_a_data_dir_is_refused(scratch_dir):
    first = EmbeddedPostgres(scratch_dir / "data")
    second = EmbeddedPostgres(scratch_dir / "data")
    try:
        first.start()
        with pytest.raises(EmbeddedPostgresError, match=rf"already in use by process {os.getpid()}"):
            second.start()
        assert second.pid is None
        first.create_database("from_template", template="txbroker")
        databases = asyncio.run(_fetch_column(first.database_url, "SELECT datname FROM pg_database"))
        assert {"txbroker", "from_template"} <= set(databases)
    finally:
        second.stop()
        first.stop()


def test_server_of_a_killed_owner_exits_and_the_data_dir_restarts(scratch_dir):
    data_dir = scratch_dir / "data"
    owner, postmaster_pid, url = _start_owner_process(data_dir)
    server = EmbeddedPostgres(data_dir)
    try:
        asyncio.run(_execute(url, "CREATE TABLE kept (value text); INSERT INTO kept VALUES ('committed')"))

        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        assert _wait_until_exited(postmaster_pid, timeout_s=10), "postgres outlived its killed owner"
        assert "received fast shutdown request" in (data_dir / "postgres.log").read_text()

        server.start()
        assert asyncio.run(_fetch_column(server.database_url, "SELECT value FROM kept")) == ["committed"]
    finally:
        server.stop()
        _end_owner_process(owner)
        _kill_if_running(postmaster_pid)


def test_orphan_that_ignores_shutdown_requests_is_killed(scratch_dir, monkeypatch):
    # The orphan ignores the parent-death request whatever its grace: a short one proves the same
    # escalation (wait, SIGQUIT, SIGKILL) without waiting out the five seconds a real postmaster gets.
    monkeypatch.setattr(embedded_postgres, "ORPHAN_SHUTDOWN_GRACE_S", 0.5)
    server = EmbeddedPostgres(scratch_dir / "data")
    orphan = None
    try:
        server.start()
        server.stop()
        # Stands in for a postmaster of a killed owner that does not shut down:
        # listed in postmaster.pid, working in PGDATA, deaf to SIGINT and SIGQUIT.
        orphan = subprocess.Popen(["sh", "-c", 'trap "" INT QUIT; exec sleep 60'], cwd=server.pgdata)
        (server.pgdata / "postmaster.pid").write_text(f"{orphan.pid}\n")

        server.start()
        assert orphan.wait(timeout=1) == -signal.SIGKILL
        assert server.pid is not None
    finally:
        server.stop()
        if orphan is not None:
            orphan.kill()
            orphan.wait()


def test_start_restarts_a_server_that_died(scratch_dir):
    server = EmbeddedPostgres(scratch_dir / "data")
    try:
        server.start()
        crashed_pid = server.pid
        os.kill(crashed_pid, signal.SIGKILL)  # as by the OOM killer: its backends linger a moment
        assert _wait_until_exited(crashed_pid, timeout_s=10)
        assert server.pid is None

        server.start()
        assert server.pid not in (None, crashed_pid)
    finally:
        server.stop()


@pytest.mark.skipif(not DEBIAN_BINDIR.is_dir(), reason=f"{DEBIAN_BINDIR} is not installed")
def test_debian_bindir(scratch_dir):
    server = EmbeddedPostgres(scratch_dir / "data", bindir=DEBIAN_BINDIR)
    try:
        server.start()
        versions = asyncio.run(_fetch_column(server.database_url, "SHOW server_version"))
        assert versions[0].startswith("15.")
    finally:
        server.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_unprivileged_owner_runs_postgres_as_itself(scratch_dir):
    # The owner must be able to run this venv's python AND import the project: neither holds when the
    # checkout sits under a directory nobody cannot enter (a `mktemp -d` clone, /root).
    probe = subprocess.run(
        [
            "setpriv",
            "--reuid=nobody",
            f"--regid={pwd.getpwnam('nobody').pw_gid}",
            "--clear-groups",
            sys.executable,
            "-c",
            "import app.runtime.embedded_postgres",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"user nobody cannot run {sys.executable} with this checkout (a parent directory is private)")
    os.chown(scratch_dir, pwd.getpwnam("nobody").pw_uid, -1)
    owner, postmaster_pid, url = _start_owner_process(scratch_dir / "data", user="nobody")
    try:
        assert Path(f"/proc/{postmaster_pid}").stat().st_uid == pwd.getpwnam("nobody").pw_uid
        assert asyncio.run(_fetch_column(url, "SELECT current_database()")) == ["txbroker"]
        owner.stdin.close()  # asks the owner to stop its server
        assert owner.wait(timeout=30) == 0, owner.stderr.read()
        assert not _is_running(postmaster_pid)
    finally:
        _end_owner_process(owner)
        _kill_if_running(postmaster_pid)


def test_too_long_socket_path_is_refused_clearly(scratch_dir):
    data_dir = scratch_dir / ("d" * 100)
    with pytest.raises(EmbeddedPostgresError) as raised:
        EmbeddedPostgres(data_dir)
    message = str(raised.value)
    assert str(data_dir / "run" / ".s.PGSQL.5432") in message
    assert "at most 107" in message
    assert "shorter --data-dir" in message
    assert not data_dir.exists()


def test_a_node_announcement_ends_by_keepalive_when_the_node_goes_silent(scratch_dir):
    """Regression: a node whose machine dies or is cut off closes no socket, so PostgreSQL kept its
    announcing session, and Metadata listed the dead node (leading partitions) until the kernel's
    default keepalive, about two hours. The announcement now sets PostgreSQL's keepalives on its
    side of the connection, as txbroker's side of every connection has them: checked over TCP,
    where they apply."""
    from app.storage import database, node_presence

    [port] = free_ports_outside_the_ephemeral_range()
    server = EmbeddedPostgres(scratch_dir / "data", port=port, server_settings={"listen_addresses": "127.0.0.1"})
    server.start()
    try:

        async def announced_settings() -> list[str]:
            conn = await database.connect(f"postgresql://txbroker@127.0.0.1:{port}/txbroker")
            try:
                assert await node_presence.announce(conn, node_presence.LiveNode(7, "127.0.0.1", 9092))
                return [
                    await conn.fetchval(f"SHOW {name}")
                    for name in (
                        "tcp_keepalives_idle",
                        "tcp_keepalives_interval",
                        "tcp_keepalives_count",
                        "tcp_user_timeout",
                    )
                ]
            finally:
                await conn.close()

        assert asyncio.run(announced_settings()) == [
            str(database.KEEPALIVE_IDLE_S),
            str(database.KEEPALIVE_INTERVAL_S),
            str(database.KEEPALIVE_COUNT),
            str(database.TCP_USER_TIMEOUT_MS),
        ]
    finally:
        server.stop(immediate=True)
