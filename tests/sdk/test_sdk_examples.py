"""The examples, run as a user would (`python examples/...py URL`), against real servers; the
consume-transform-produce app keeps exactly-once output across a SIGKILL of the server."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter

from tests.conftest import REPO_ROOT
from txbroker import Admin, Consumer, Producer, TopicPartition

EXAMPLES = REPO_ROOT / "examples"


def run_example(name: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT
    )


def committed_values(url: str, topic: str, partitions: int) -> list[bytes]:
    with Consumer(url, isolation_level="read_committed") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        values = []
        while batch := consumer.poll(timeout_ms=300):
            values += [r.value for r in batch]
        return values


def test_transactional_producer_example(server):
    result = run_example(
        "transactional_producer.py", server.url, "--transactions", "3", "--records-per-transaction", "4"
    )
    assert result.returncode == 0, result.stderr
    assert "transaction 2: committed" in result.stdout and "aborted on purpose" in result.stdout
    assert "a read_committed consumer sees 12 records in transactional-example; aborted ones: 0" in result.stdout


def test_consume_transform_produce_is_exactly_once_across_a_server_sigkill(server_process, tmp_path):
    server = server_process("--data-dir", str(tmp_path / "data"))
    inputs = [f"order-{i}" for i in range(400)]
    with Admin(server.url) as admin:
        admin.create_topic("orders", partitions=3)
        admin.create_topic("orders-upper", partitions=3)
    with Producer(server.url) as producer:
        for value in inputs:
            producer.send("orders", value=value, key=value[-1:])
    app = subprocess.Popen(
        [
            sys.executable,
            str(EXAMPLES / "consume_transform_produce.py"),
            server.url,
            "--input",
            "orders",
            "--output",
            "orders-upper",
            "--group",
            "upper",
            "--transactional-id",
            "upper-0",
            "--max-records",
            str(len(inputs)),
            "--max-poll-records",
            "10",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    try:
        deadline = time.monotonic() + 30
        with Admin(server.url) as admin:
            while sum(p["last_stable_offset"] for p in admin.describe_topic("orders-upper")["partitions"]) < 60:
                assert time.monotonic() < deadline and app.poll() is None, "the app made no progress"
                time.sleep(0.02)
        server.kill()  # mid-stream: a transaction is open or committing
        server.start()
        stdout, stderr = app.communicate(timeout=90)
    finally:
        if app.poll() is None:
            app.kill()
    assert app.returncode == 0, stderr[-3000:]
    assert f"(total {len(inputs)})" in stdout, "it got through every record after the crash"
    output = committed_values(server.url, "orders-upper", 3)
    assert Counter(output) == Counter(value.upper().encode() for value in inputs), "each exactly once"
    with Admin(server.url) as admin:
        assert {o["lag"] for o in admin.describe_group("upper")["offsets"]} == {0}


def test_consume_transform_produce_says_what_it_waits_for_on_an_empty_topic(server):
    with Admin(server.url) as admin:
        admin.create_topic("empty-input", partitions=1)
        admin.create_topic("empty-output", partitions=1)
    result = run_example(
        "consume_transform_produce.py",
        server.url,
        "--input",
        "empty-input",
        "--output",
        "empty-output",
        "--idle-exit-ms",
        "1500",
    )
    assert result.returncode == 0, result.stderr
    assert "waiting for records in 'empty-input' (group 'orders-upper', committed so far: 0)" in result.stdout


def test_consume_transform_produce_stops_on_a_missing_output_topic_saying_what_to_fix(server):
    """An error that redoing the work cannot cure ends the loop with what to fix (it aborted and
    redid the same work for ever), its transaction aborted: nothing reaches the output."""
    with Admin(server.url) as admin:
        admin.create_topic("lonely-input", partitions=1)
    with Producer(server.url) as producer:
        producer.send("lonely-input", value=b"a").result(10)
    result = run_example(
        "consume_transform_produce.py", server.url, "--input", "lonely-input", "--output", "nowhere", timeout=30
    )
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "stopping: redoing the work would meet UNKNOWN_TOPIC_OR_PARTITION again" in result.stderr
    assert result.stderr.count("aborting: ") == 1
