"""The `txbroker` command as a user runs it: real `.venv/bin/txbroker ...` subprocesses against a real
server, checking output, exit codes (0 ok, 1 error, 2 usage) and error messages."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.storage.groups.group_offsets import MARKERS_READ
from tests.many_transactions import HIGH_WATERMARK, write_many_transactions
from txbroker import Producer

TXBROKER = Path(sys.executable).parent / "txbroker"


def txbroker(
    url: str | None, *args: str, stdin: str | bytes | None = None, env: dict | None = None, timeout: float = 30
) -> subprocess.CompletedProcess:
    command = [str(TXBROKER), *args] if url is None else [str(TXBROKER), "--url", url, *args]
    return subprocess.run(
        command,
        input=stdin.encode() if isinstance(stdin, str) else stdin,
        capture_output=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, (result.returncode, result.stderr.decode())
    return result.stdout.decode()


def test_topics_create_list_describe_delete(server):
    assert (
        ok(txbroker(server.url, "topics", "create", "orders", "--partitions", "3", "--config", "retention_ms=60000"))
        == "created topic orders with 3 partition(s)\n"
    )
    created = json.loads(ok(txbroker(server.url, "topics", "create", "audit", "--json")))
    assert created["name"] == "audit" and len(created["partitions"]) == 1
    listing = ok(txbroker(server.url, "topics", "list"))
    assert listing.splitlines()[0].split() == ["TOPIC", "PARTITIONS", "OFFSETS", "CONFIG"]
    assert any(line.split()[:2] == ["orders", "3"] and "retention_ms=60000" in line for line in listing.splitlines())
    described = ok(txbroker(server.url, "topics", "describe", "orders"))
    assert "topic orders: 3 partition(s)" in described and len(described.strip().splitlines()) == 5
    assert ok(txbroker(server.url, "topics", "delete", "audit")) == "deleted topic audit\n"

    missing = txbroker(server.url, "topics", "describe", "audit")
    assert missing.returncode == 1 and missing.stdout == b""
    assert missing.stderr.decode().startswith("error: UNKNOWN_TOPIC_OR_PARTITION: ")
    again = txbroker(server.url, "topics", "create", "orders")
    assert again.returncode == 1 and b"error: TOPIC_ALREADY_EXISTS: " in again.stderr
    grown = ok(txbroker(server.url, "topics", "create-partitions", "orders", "--partitions", "5"))
    assert grown == "topic orders now has 5 partition(s)\n"
    fewer = txbroker(server.url, "topics", "create-partitions", "orders", "--partitions", "2")
    assert fewer.returncode == 1 and b"error: INVALID_PARTITIONS: " in fewer.stderr


def test_produce_and_consume_lines_keys_and_json(server):
    ok(txbroker(server.url, "topics", "create", "t", "--partitions", "2"))
    produced = txbroker(
        server.url,
        "produce",
        "t",
        "--key-separator",
        ":",
        stdin=b"alice:hello\nbob:world\nalice:again\n:\xff\xfe binary\n",
    )
    assert ok(produced) == "" and produced.stderr == b"produced 4 record(s) to t\n"
    lines = txbroker(
        server.url, "consume", "t", "--from-beginning", "--max-records", "4", "--print-key", "--key-separator", "="
    )
    assert sorted(lines.stdout.splitlines()) == [b"=\xff\xfe binary", b"alice=again", b"alice=hello", b"bob=world"]
    assert lines.returncode == 0 and lines.stderr == b"consumed 4 record(s)\n"
    records = [
        json.loads(line)
        for line in ok(
            txbroker(server.url, "consume", "t", "--from-beginning", "--timeout-ms", "500", "--json")
        ).splitlines()
    ]
    assert sorted((r["key"], r["value"]) for r in records if "encoding" not in r) == [
        ("alice", "again"),
        ("alice", "hello"),
        ("bob", "world"),
    ]
    assert len({r["partition"] for r in records if r["key"] == "alice"}) == 1, "one key, one partition"
    [binary] = [r for r in records if "encoding" in r]
    assert (binary["encoding"], binary["key"], binary["value"]) == ("base64", "", "//4gYmluYXJ5")
    empty = txbroker(server.url, "consume", "t", "--timeout-ms", "300")
    assert ok(empty) == "" and empty.stderr == b"consumed 0 record(s)\n", "without --from-beginning: from the end"


def test_transactional_produce_and_the_transactions_commands(server):
    ok(txbroker(server.url, "topics", "create", "tx"))
    summary = json.loads(
        ok(
            txbroker(
                server.url,
                "produce",
                "tx",
                "--transactional-id",
                "cli-tx",
                "--commit-every",
                "2",
                "--json",
                stdin="a\nb\nc\nd\ne\n",
            )
        )
    )
    assert summary == {"topic": "tx", "records": 5, "transactions": 3}
    markers = json.loads(ok(txbroker(server.url, "markers", "tx", "0", "--json")))
    assert [m["type"] for m in markers] == ["COMMIT"] * 3
    described = ok(txbroker(server.url, "transactions", "describe", "cli-tx"))
    assert "state             CompleteCommit" in described
    assert "txn version       2" in described  # HTTP's EndTxn bumps the epoch per transaction
    listed = json.loads(
        ok(txbroker(server.url, "transactions", "list", "--json", "--state", "CompleteCommit", "--prefix", "cli-"))
    )
    assert [t["transactional_id"] for t in listed] == ["cli-tx"]

    with Producer(server.url, transactional_id="stuck") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("tx", value="pending")
        producer.flush()
        hanging = ok(txbroker(server.url, "transactions", "find-hanging", "--min-duration-ms", "0"))
        assert hanging.splitlines()[0].startswith("TRANSACTIONAL ID")
        assert "stuck" in hanging and "Ongoing" in hanging and "cli-tx" not in hanging
        assert ok(txbroker(server.url, "transactions", "find-hanging")) == (
            "no transaction open for longer than 900000 ms\n"
        )
        producers = ok(txbroker(server.url, "producers", "tx", "0"))
        assert str(producer.producer_id) in producers and "OPEN TXN START OFFSET" in producers
        aborted = ok(txbroker(server.url, "transactions", "abort", "stuck"))
        assert aborted.startswith("aborted the transaction of stuck (CompleteAbort)")
        again = txbroker(server.url, "transactions", "abort", "stuck")
        assert again.returncode == 1 and again.stderr.startswith(b"error: INVALID_TXN_STATE: ")
        # An operator's abort is no EndTxn: the id has ended none of its transactions yet.
        assert "txn version       none yet" in ok(txbroker(server.url, "transactions", "describe", "stuck"))
    unknown = txbroker(server.url, "transactions", "describe", "nobody")
    assert unknown.returncode == 1 and unknown.stderr.startswith(b"error: TRANSACTIONAL_ID_NOT_FOUND: ")


def test_a_transactional_produce_stopped_by_a_bad_line_aborts_its_open_transaction(server):
    ok(txbroker(server.url, "topics", "create", "tx"))
    stopped = txbroker(
        server.url,
        "produce",
        "tx",
        "--transactional-id",
        "cli-bad",
        "--key-separator",
        ":",
        "--commit-every",
        "2",
        stdin="a:1\nb:2\nc:3\nno separator\n",
    )
    assert stopped.returncode == 2
    # Not left Ongoing until the transaction timeout, holding back read_committed readers (line 3
    # is dropped unsent, or sent and aborted).
    described = ok(txbroker(server.url, "transactions", "describe", "cli-bad"))
    assert "state             Ongoing" not in described and "state             Complete" in described
    [partition] = json.loads(ok(txbroker(server.url, "topics", "describe", "tx", "--json")))["partitions"]
    assert partition["last_stable_offset"] == partition["high_watermark"]
    read = txbroker(server.url, "consume", "tx", "--from-beginning", "--timeout-ms", "500")
    assert ok(read) == "1\n2\n"
    assert "line 4 has no key separator ':' (expected KEY:VALUE); 2 line(s) before it were committed" in (
        stopped.stderr.decode()
    )


def test_consume_with_a_group_commits_and_groups_commands_show_lag(server):
    ok(txbroker(server.url, "topics", "create", "g", "--partitions", "2"))
    ok(txbroker(server.url, "produce", "g", stdin="".join(f"line-{i}\n" for i in range(6))))
    first = ok(txbroker(server.url, "consume", "g", "--group", "readers", "--from-beginning", "--max-records", "4"))
    assert len(first.splitlines()) == 4
    rest = ok(txbroker(server.url, "consume", "g", "--group", "readers", "--from-beginning", "--timeout-ms", "1000"))
    assert sorted(first.splitlines() + rest.splitlines()) == sorted(f"line-{i}" for i in range(6)), "resumes"
    listed = ok(txbroker(server.url, "groups", "list"))
    assert listed.splitlines()[0].split() == ["GROUP", "STATE", "GENERATION", "MEMBERS"]
    assert listed.splitlines()[1].split()[:2] == ["readers", "Empty"]
    described = ok(txbroker(server.url, "groups", "describe", "readers"))
    assert "group readers: Empty" in described and "LAG" in described
    offsets = json.loads(ok(txbroker(server.url, "groups", "describe", "readers", "--json")))["offsets"]
    assert {o["lag"] for o in offsets} == {0}
    assert ok(txbroker(server.url, "groups", "delete", "readers")) == "deleted group readers\n"
    gone = txbroker(server.url, "groups", "describe", "readers")
    assert gone.returncode == 1 and gone.stderr.startswith(b"error: GROUP_ID_NOT_FOUND: ")


def test_groups_describe_shows_a_bounded_lag_as_a_bound(server):
    """Past the markers the server counts, the lag is an upper bound (`lag_exact` false), shown as the
    console shows it: "≤ N". A plain number would claim an exact count."""
    ok(txbroker(server.url, "topics", "create", "many-transactions"))
    asyncio.run(write_many_transactions(server.database_url, "many-transactions"))
    committed = httpx.post(
        f"{server.url}/v1/groups/far-behind/offsets/commit",
        json={"offsets": [{"topic": "many-transactions", "partition": 0, "offset": 0}]},
    )
    assert committed.status_code == 200 and committed.json()["offsets"][0]["error"] is None, committed.text
    [row] = [
        line
        for line in ok(txbroker(server.url, "groups", "describe", "far-behind")).splitlines()
        if line.startswith("many")
    ]
    assert row.split()[:4] == ["many-transactions", "0", "0", str(HIGH_WATERMARK)]
    assert f"≤ {HIGH_WATERMARK - MARKERS_READ}" in row, row


def test_url_from_the_environment_and_the_server_commands_still_dispatch(server):
    assert "TOPIC" in ok(txbroker(None, "topics", "list", env={"TXBROKER_URL": server.url}))
    assert "--data-dir" in ok(txbroker(None, "serve", "--help")), "serve and db stay the server's"


@pytest.mark.parametrize(
    "args",
    [
        ("topics",),
        ("produce", "t", "--commit-every", "3"),
        ("topics", "create", "x", "--partitions", "many"),
    ],
)
def test_usage_errors_exit_2(args):
    result = txbroker("http://127.0.0.1:9", *args)
    assert result.returncode == 2 and b"usage: txbroker" in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("produce", "t", "--partition", "-1"), "argument --partition: expected a partition number from 0, not -1"),
        (("produce", "t", "--key-separator", ""), "--key-separator must not be empty"),
        (("produce", "t", "--transactional-id", ""), "argument --transactional-id: must not be empty"),
        (("consume", "t", "--group", ""), "argument --group: must not be empty"),
        (("topics", "describe", ""), "argument name: must not be empty"),
        (("groups", "describe", ""), "argument group: must not be empty"),
        (("principals", "delete", ""), "argument name: must not be empty"),
        (("--token", "clé", "topics", "list"), "token must be printable ASCII"),
        (("--token", "key\nX-Injected: 1", "topics", "list"), "token must be printable ASCII"),
        (("--url", "http://[::1", "topics", "list"), "url 'http://[::1' is not a URL"),
        (("--url", "127.0.0.1:8080", "topics", "list"), "url '127.0.0.1:8080' is not a server's URL"),
    ],
)
def test_bad_input_is_a_clear_usage_error_never_a_traceback(args, message):
    """Before, each of these ended in a Python traceback (exit 1) or a misleading server answer."""
    result = txbroker("http://127.0.0.1:9" if "--url" not in args else None, *args, stdin="k:v\n")
    stderr = result.stderr.decode()
    assert result.returncode == 2 and "Traceback" not in stderr, stderr
    assert message in stderr, stderr


def test_an_unreachable_server_is_a_clear_error_exit_1():
    result = txbroker("http://127.0.0.1:9", "topics", "list", "--retry-timeout-ms", "200")
    assert result.returncode == 1
    assert result.stderr.decode().startswith("error: cannot reach txbroker at http://127.0.0.1:9: ConnectError")


def test_topics_delete_records(server):
    ok(
        txbroker(
            server.url, "topics", "create", "trim", "--partitions", "2", "--config", "cleanup_policy=compact,delete"
        )
    )
    # Keyed: a compacted topic refuses records without a key.
    ok(txbroker(server.url, "produce", "trim", "--partition", "0", "--key-separator", ":", stdin="1:a\n2:b\n3:c\n"))
    table = ok(txbroker(server.url, "topics", "delete-records", "trim", "--offset", "0=2", "--offset", "1=-1"))
    assert [line.split() for line in table.splitlines()] == [["PARTITION", "LOG", "START"], ["0", "2"], ["1", "0"]]
    assert "cleanup_policy=compact,delete" in ok(txbroker(server.url, "topics", "describe", "trim"))
    # Kafka's other topic configs, each as its JSON type.
    ok(
        txbroker(
            server.url,
            *("topics", "create", "typed", "--config", "compression_type=gzip", "--config", "preallocate=true"),
            *("--config", "min_cleanable_dirty_ratio=0.1", "--config", "segment_bytes=1048576"),
        )
    )
    typed = server.client.get("/v1/topics/typed").json()["config"]
    assert (typed["compression_type"], typed["preallocate"], typed["min_cleanable_dirty_ratio"]) == ("gzip", True, 0.1)
    assert typed["segment_bytes"] == 1048576
    past = txbroker(server.url, "topics", "delete-records", "trim", "--offset", "0=9")
    assert past.returncode == 1 and b"error: OFFSET_OUT_OF_RANGE: " in past.stderr
    usage = txbroker(server.url, "topics", "delete-records", "trim", "--offset", "zero")
    assert usage.returncode == 2 and b"PARTITION=OFFSET" in usage.stderr
