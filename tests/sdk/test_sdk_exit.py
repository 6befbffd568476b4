"""SDK clients left unclosed at interpreter exit exit quietly: nothing on stderr about the tasks of
the client's event loop (the producer's sender, the consumer's heartbeats), which asyncio reports
as "Task was destroyed but it is pending!" when the interpreter drops them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import REPO_ROOT


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
    )


def test_unclosed_sync_clients_exit_quietly(server):
    result = run_python(
        f"""
        from txbroker import Admin, Consumer, Producer
        with Admin({server.url!r}) as admin:
            admin.create_topic("unclosed", partitions=1)
        producer = Producer({server.url!r})
        producer.send("unclosed", value="sent and flushed")
        producer.flush()
        producer.send("unclosed", value="never sent: the producer is not closed")
        consumer = Consumer({server.url!r}, group_id="unclosed")
        consumer.subscribe(["unclosed"])
        consumer.poll(timeout_ms=500)
        print("done")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"
    assert result.stderr == ""
