"""The README's walks, their very lines, run in order against a real server (real HTTP, real
PostgreSQL, Kafka's listener for the Kafka client's lines), as a newcomer copies them: every curl line
answers without an error, and what a `# -> ` line shows; every CLI line exits 0; the confluent-kafka
lines print what their comments say. A README line that stops working, or stops printing what the
README says, fails here. (The kcat lines: tests/kafka/test_kcat.py.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.conftest import REPO_ROOT, RunningServer

README = REPO_ROOT / "README.md"
README_URL = "http://127.0.0.1:8080"
README_BOOTSTRAP = "127.0.0.1:9092"
README_TXBROKER = ".venv/bin/txbroker"
TXBROKER = Path(sys.executable).parent / "txbroker"  # the `txbroker` command of this environment
EXPECTED = "# -> "


def readme_section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README.read_text(), re.M | re.S)
    assert match, f"README.md has no section '## {title}'"
    return match.group(1)


def fenced_blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", section, re.M | re.S)


def shell_commands(block: str) -> list[tuple[str, str | None]]:
    """A shell block's commands, each with the answer the README shows for it (the `# -> ` line
    after it, if any). A command goes on over lines that end in a backslash or inside a quote."""
    commands: list[tuple[str, str | None]] = []
    pending = ""
    for line in block.splitlines():
        if not pending and line.startswith(EXPECTED):
            command, _ = commands[-1]
            commands[-1] = (command, line.removeprefix(EXPECTED))
            continue
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending = f"{pending}\n{line}" if pending else line
        if pending.count("'") % 2 == 0 and not pending.rstrip().endswith("\\"):
            commands.append((pending, None))
            pending = ""
    assert not pending, f"README.md: a command is not closed: {pending!r}"
    return commands


def errors_in(answer) -> list:
    """Every non-null `error` of an answer, at any depth (a request's, or a partition's)."""
    if isinstance(answer, dict):
        own = [answer["error"]] if answer.get("error") is not None else []
        return own + [error for value in answer.values() for error in errors_in(value)]
    if isinstance(answer, list):
        return [error for value in answer for error in errors_in(value)]
    return []


def write_to_orders_2_soon(server: RunningServer) -> threading.Thread:
    """What the README's long poll waits for: a record written to orders-2 a moment after it began."""

    def write() -> None:
        time.sleep(0.5)
        server.client.post("/v1/topics/orders/records", json={"partition": 2, "records": [{"value": "woken"}]})

    writer = threading.Thread(target=write)
    writer.start()
    return writer


def test_the_readme_curl_walk_and_transaction_answer_as_shown(server: RunningServer):
    blocks = fenced_blocks(readme_section("A walk with curl"), "sh")
    assert len(blocks) == 2, "the walk, then the transaction by hand"
    for command, shown in (entry for block in blocks for entry in shell_commands(block)):
        long_poll = '"max_wait_ms"' in command
        writer = write_to_orders_2_soon(server) if long_poll else None
        started = time.monotonic()
        done = subprocess.run(
            ["bash", "-c", command.replace(README_URL, server.url)], capture_output=True, text=True, timeout=60
        )
        elapsed = time.monotonic() - started
        if writer is not None:
            writer.join()
        assert done.returncode == 0, f"{command}\n{done.stderr}"
        if "-X DELETE" in command:
            assert done.stdout == "", f"{command}: a 204 has no body, got {done.stdout!r}"
            continue
        answer = json.loads(done.stdout)
        assert not errors_in(answer), f"README.md's line answered an error:\n{command}\n{done.stdout}"
        if shown is not None:
            expected, _ = json.JSONDecoder().raw_decode(shown)
            assert answer == expected, f"README.md shows {expected} for\n{command}\nbut the server answered {answer}"
        if long_poll:
            assert [r["value"] for r in answer["partitions"][0]["records"]] == ["woken"]
            assert elapsed < 5, f"the long poll answered after {elapsed:.1f} s, not when the record came"
    assert server.client.get("/v1/topics/orders").status_code == 404, "the walk ends with the topic deleted"


def test_the_readme_cli_lines_succeed_in_order(server: RunningServer):
    (block,) = fenced_blocks(readme_section("From the shell: the CLI"), "sh")
    lines = shell_commands(block)
    assert len(lines) >= 10
    environment = {**os.environ, "TXBROKER_URL": server.url}
    for line, _ in lines:
        assert README_TXBROKER in line
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", line.replace(README_TXBROKER, str(TXBROKER))],
            capture_output=True,
            text=True,
            timeout=60,
            env=environment,
        )
        assert done.returncode == 0, f"README.md's CLI line exited {done.returncode}:\n{line}\n{done.stderr}"
        if " consume " in line:
            assert len(done.stdout.splitlines()) == 100, "it consumes the 100 lines produced before it"


def test_the_readme_confluent_kafka_lines_print_what_they_say(kafka_server: RunningServer):
    bootstrap = kafka_server.extra["kafka_bootstrap"]
    program = "\n".join(fenced_blocks(readme_section("From Kafka clients"), "python"))
    assert "transactional.id" in program, "the plain produce and consume, then a transaction"
    printed = [comment for line in program.splitlines() if "print(" in line for comment in [line.split("# ", 1)[1]]]
    done = subprocess.run(
        [sys.executable, "-c", program.replace(README_BOOTSTRAP, bootstrap)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == printed

    # What the README says of them afterwards: both records over HTTP, the COMMIT marker after them.
    records = kafka_server.client.get("/v1/topics/greetings/partitions/0/records", params={"offset": 0}).json()
    assert [(r["offset"], r["key"], r["value"]) for r in records["records"]] == [
        (0, "k1", "hello over Kafka"),
        (1, "k2", "hello in a transaction"),
    ]
    markers = kafka_server.client.get("/v1/topics/greetings/partitions/0/markers").json()["markers"]
    assert [(m["offset"], m["type"]) for m in markers] == [(2, "COMMIT")]
    assert kafka_server.client.get("/v1/transactions/greeter").json()["state"] == "CompleteCommit"
    logged = kafka_server.client.get("/v1/topics/greetings-log/partitions/0/records").json()["records"]
    assert [r["value"] for r in logged] == ["greeted k2"]
