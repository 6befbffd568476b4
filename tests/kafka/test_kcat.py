"""The README's kcat walk, its very lines, against a real server: Metadata (-L), produce with keys
and headers (-P), consume (-C) and a read_committed consume; the records come back byte for byte,
over kcat and over HTTP, and an aborted transaction's never. Skipped without kcat (scripts/test
installs Debian's package when it may)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import REPO_ROOT
from tests.kafka import http_side
from tests.kafka.clients import WAIT_S, bootstrap

pytestmark = pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed (apt-get install kcat)")

README_BOOTSTRAP = "127.0.0.1:9092"
TOPIC = "walk"  # the README's


def readme_kcat_lines() -> list[str]:
    """The README's kcat commands, in order (its comment lines are not commands)."""
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    return [line.split("  #")[0].strip() for line in lines if f"kcat -b {README_BOOTSTRAP}" in line]


def run(line: str, server) -> bytes:
    done = subprocess.run(
        ["bash", "-c", line.replace(README_BOOTSTRAP, bootstrap(server))],
        capture_output=True,
        timeout=WAIT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout


def test_the_readme_kcat_walk(module_kafka_server):
    server = module_kafka_server
    metadata, produce, consume, consume_committed = readme_kcat_lines()

    listed = run(metadata, server).decode()
    assert f"broker 0 at {bootstrap(server)}" in listed

    run(produce, server)
    # An aborted transaction after kcat's records: neither consume may show it.
    aborted = http_side.HttpTransaction(server, "kcat-walk-aborted")
    aborted.produce(TOPIC, 0, ["aborted"])
    aborted.end(committed=False)

    expected_values = ["hello".encode(), "wörld".encode()]
    assert run(consume, server) == (b"0 0 k1=hello app=readme,lang=en\n" + "0 1 k2=wörld app=readme,lang=en\n".encode())
    assert run(consume_committed, server) == b"".join(value + b"\n" for value in expected_values)

    over_http = http_side.fetch(server, TOPIC, 0)
    assert [http_side.unb64(r["value"]) for r in over_http] == [*expected_values, b"aborted"]
    assert [http_side.unb64(r["key"]) for r in over_http][:2] == [b"k1", b"k2"]
    assert [(h["key"], http_side.unb64(h["value"])) for h in over_http[0]["headers"]] == [
        ("app", b"readme"),
        ("lang", b"en"),
    ]
