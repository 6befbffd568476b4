"""Exactly-once consume-transform-produce under crashes, in the spirit of Kafka's
TransactionsBounceTest: a copier reads an input topic read_committed from its group's committed
offsets, writes transformed records to an output topic and commits the input offsets in the same
transaction (TxnOffsetCommit, KIP-447 generation-checked), aborting some transactions on purpose,
while the server is killed with SIGKILL several times. Every input record must appear in the
output exactly once under read_committed: no loss, no duplicate."""

from __future__ import annotations

import collections
import os
import random
import threading
import time
import zlib

import httpx

from tests.conftest import wait_until_healthy

RECORDS = 10_000
INPUT, OUTPUT = "eos-in", "eos-out"
INPUT_PARTITIONS, OUTPUT_PARTITIONS = 3, 2
GROUP, TRANSACTIONAL_ID = "eos-copier", "eos-copier-1"
BATCH = 250  # records fetched (and so copied) per transaction at most
ABORT_PROBABILITY = 0.2
KILLS = 3
# A bound for a copier that never finishes, not a timing assertion: beside other tests (the suite
# runs on two workers) the loop takes several times as long as alone, so the bound is generous.
DEADLINE_S = 300


def key_of(i: int) -> str:
    return f"key-{i % 257}"


def partition_of(key: str, partitions: int) -> int:
    return zlib.crc32(key.encode()) % partitions


class Crashed(Exception):
    """The server went away under a request (or answered 503): outcome unknown."""


class Copier:
    """A transactional consume-transform-produce loop over raw HTTP. Its only durable state is
    the group's committed offsets: after an abort or a crash it rewinds to them."""

    def __init__(self, url: str, rng: random.Random) -> None:
        self.url = url
        self.rng = rng
        # Short timeouts: after a SIGKILL the test still holds the listening socket, so
        # connections are accepted by the kernel and then never answered.
        self.http = httpx.Client(base_url=url, timeout=httpx.Timeout(5.0))
        self.member_id = ""
        self.generation_id = -1
        self.assignment: list[int] = []
        self.producer_id = self.producer_epoch = -1
        self.sequences: dict[int, int] = {}
        self.positions: dict[int, int] = {}
        self.stats = collections.Counter()
        self.committed_records = 0  # input records whose transaction committed (progress, for the killer)
        self.done = threading.Event()
        self.failure: BaseException | None = None

    # -- one request, mapping "the server is gone" to Crashed

    def call(self, path: str, body: dict, ok=(200,)) -> dict:
        try:
            response = self.http.post(path, json=body)
        except httpx.TransportError as error:
            raise Crashed(repr(error)) from error
        if response.status_code == 503:
            raise Crashed(response.text)
        if response.status_code not in ok:
            raise AssertionError(f"{path} answered {response.status_code}: {response.text[:500]}")
        return response.json()

    def ids(self) -> dict:
        return {
            "transactional_id": TRANSACTIONAL_ID,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
        }

    def adopt(self, body: dict) -> None:
        if (body["producer_id"], body["producer_epoch"]) != (self.producer_id, self.producer_epoch):
            self.sequences.clear()
        self.producer_id, self.producer_epoch = body["producer_id"], body["producer_epoch"]

    # -- protocol steps

    def init_producer(self) -> None:
        """InitProducerId fences the previous instance and aborts (or completes) its transaction."""
        self.adopt(
            self.call("/v1/producers/init", {"transactional_id": TRANSACTIONAL_ID, "transaction_timeout_ms": 60_000})
        )
        self.stats["init_producer_id"] += 1

    def heartbeat(self) -> None:
        response = self.http.post(
            f"/v1/groups/{GROUP}/heartbeat",
            json={
                "member_id": self.member_id,
                "generation_id": self.generation_id,
                "topics": [INPUT],
                "session_timeout_ms": 120_000,
            },
        )
        if response.status_code == 409 and response.json()["error"]["code"] == "UNKNOWN_MEMBER_ID":
            self.member_id = ""
            self.stats["rejoins"] += 1
            return self.heartbeat()
        if response.status_code == 503:
            raise Crashed(response.text)
        assert response.status_code == 200, response.text
        body = response.json()
        if body["generation_id"] != self.generation_id:
            self.stats["generations_seen"] += 1
        self.member_id, self.generation_id = body["member_id"], body["generation_id"]
        self.assignment = sorted(p for a in body["assignment"] if a["topic"] == INPUT for p in a["partitions"])

    def rewind(self) -> None:
        """Positions := the group's committed offsets, waiting out pending transactional ones."""
        while True:
            body = self.call(
                f"/v1/groups/{GROUP}/offsets/fetch",
                {"partitions": [{"topic": INPUT, "partition": p} for p in self.assignment], "require_stable": True},
            )
            unstable = [o for o in body["offsets"] if o["error"] is not None]
            if not unstable:
                break
            assert all(o["error"]["code"] == "UNSTABLE_OFFSET_COMMIT" for o in unstable), unstable
            assert all(o["error"]["retriable"] for o in unstable)
            self.stats["unstable_offset_retries"] += 1
            time.sleep(0.05)
        self.positions = {o["partition"]: max(o["offset"], 0) for o in body["offsets"]}
        self.stats["rewinds"] += 1

    def recover(self) -> None:
        """After a crash: wait for the restarted server, fence our previous self, rewind."""
        self.http.close()
        wait_until_healthy(self.url, timeout_s=120)
        self.http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(5.0))
        self.init_producer()
        self.heartbeat()
        self.rewind()

    def cycle(self) -> bool:
        """One transaction. Returns False once every input record is committed."""
        self.heartbeat()
        if set(self.positions) != set(self.assignment):
            self.rewind()
        order = self.rng.sample(self.assignment, len(self.assignment))  # fairness: max_records is for all
        fetched = self.call(
            "/v1/fetch",
            {
                "isolation_level": "read_committed",
                "max_records": BATCH,
                "partitions": [{"topic": INPUT, "partition": p, "offset": self.positions[p]} for p in order],
            },
        )
        records, next_offsets = [], {}
        for entry in fetched["partitions"]:
            assert entry["error"] is None, entry
            records += entry["records"]
            next_offsets[entry["partition"]] = entry["next_offset"]
        if not records:
            ends = {e["partition"]: e["last_stable_offset"] for e in fetched["partitions"]}
            if all(self.positions[p] >= ends[p] for p in self.assignment):
                return False
            return True
        by_partition: dict[int, list[dict]] = collections.defaultdict(list)
        for record in records:
            by_partition[partition_of(record["key"], OUTPUT_PARTITIONS)].append(
                {"key": record["key"], "value": "out-" + record["value"]}
            )
        produced = self.call(
            "/v1/produce",
            {
                **self.ids(),
                "partitions": [
                    {"topic": OUTPUT, "partition": p, "base_sequence": self.sequences.get(p, 0), "records": rs}
                    for p, rs in sorted(by_partition.items())
                ],
            },
        )
        for entry in produced["partitions"]:
            assert entry["error"] is None and not entry["duplicate"], entry
        for p, rs in by_partition.items():
            self.sequences[p] = self.sequences.get(p, 0) + len(rs)
        offsets = self.call(
            "/v1/txn/offset-commit",
            {
                **self.ids(),
                "group_id": GROUP,
                "member_id": self.member_id,
                "generation_id": self.generation_id,
                "offsets": [
                    {"topic": INPUT, "partition": p, "offset": o, "metadata": f"cycle {self.stats['cycles']}"}
                    for p, o in sorted(next_offsets.items())
                ],
            },
        )
        fenced = [o["error"]["code"] for o in offsets["offsets"] if o["error"] is not None]
        self.stats["cycles"] += 1
        if fenced:  # a rebalance we did not see yet: abort, adopt the new generation, start over
            assert set(fenced) <= {"ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID"}, fenced
            self.stats["fenced_offset_commits"] += 1
            self.end(commit=False)
            self.heartbeat()
            self.rewind()
            return True
        if self.rng.random() < ABORT_PROBABILITY:
            self.end(commit=False)
            self.stats["aborts"] += 1
            self.rewind()
            return True
        self.end(commit=True)
        self.stats["commits"] += 1
        self.committed_records += len(records)
        self.positions.update(next_offsets)
        return True

    def end(self, commit: bool) -> None:
        body = self.call("/v1/txn/end", {**self.ids(), "committed": commit})
        assert body["state"] == ("CompleteCommit" if commit else "CompleteAbort"), body
        self.adopt(body)

    def run(self) -> None:
        deadline = time.monotonic() + DEADLINE_S
        try:
            self.init_producer()
            self.heartbeat()
            self.rewind()
            while time.monotonic() < deadline:
                try:
                    if not self.cycle():
                        return
                except (Crashed, httpx.TransportError):
                    self.stats["crashes_seen"] += 1
                    while True:
                        try:
                            self.recover()
                            break
                        except (Crashed, httpx.TransportError):
                            time.sleep(0.1)
            raise AssertionError(f"the copier did not finish within {DEADLINE_S}s: {dict(self.stats)}")
        except BaseException as error:  # noqa: BLE001 - reported by the test thread
            self.failure = error
        finally:
            self.done.set()
            self.http.close()


def read_values(url: str, topic: str, partitions: int, isolation_level: str) -> list[str]:
    values: list[str] = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for partition in range(partitions):
            offset = 0
            while True:
                entry = client.post(
                    "/v1/fetch",
                    json={
                        "isolation_level": isolation_level,
                        "max_records": 10_000,
                        "partitions": [{"topic": topic, "partition": partition, "offset": offset}],
                    },
                ).json()["partitions"][0]
                assert entry["error"] is None, entry
                values += [record["value"] for record in entry["records"]]
                end = entry["last_stable_offset"] if isolation_level == "read_committed" else entry["high_watermark"]
                if entry["next_offset"] >= end:
                    break
                offset = entry["next_offset"]
    return values


def test_consume_transform_produce_is_exactly_once_across_sigkills(server_process, data_dir):
    started = time.monotonic()
    seed = int(os.environ.get("TXB_EOS_SEED", random.randrange(2**32)))  # printed, to replay a run
    rng = random.Random(seed)  # the killer's; the copier has its own (threads)
    server = server_process("--data-dir", str(data_dir / "data"))
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for name, partitions in ((INPUT, INPUT_PARTITIONS), (OUTPUT, OUTPUT_PARTITIONS)):
            client.post("/v1/topics", json={"name": name, "partitions": partitions}).raise_for_status()
        # 10,000 records in 4 produce calls, spread over the input partitions by key
        for chunk in range(4):
            by_partition: dict[int, list[dict]] = collections.defaultdict(list)
            for i in range(chunk * RECORDS // 4, (chunk + 1) * RECORDS // 4):
                by_partition[partition_of(key_of(i), INPUT_PARTITIONS)].append({"key": key_of(i), "value": str(i)})
            response = client.post(
                "/v1/produce",
                json={
                    "producer_id": -1,
                    "partitions": [
                        {"topic": INPUT, "partition": p, "records": rs} for p, rs in sorted(by_partition.items())
                    ],
                },
            )
            assert response.status_code == 200, response.text
            assert all(entry["error"] is None for entry in response.json()["partitions"])
        input_ends = [p["high_watermark"] for p in client.get(f"/v1/topics/{INPUT}").json()["partitions"]]
        assert sum(input_ends) == RECORDS and all(input_ends), input_ends

    copier = Copier(server.url, random.Random(seed + 1))
    thread = threading.Thread(target=copier.run, name="copier", daemon=True)
    thread.start()
    kills = 0
    for fraction in (0.2, 0.45, 0.7)[:KILLS]:
        while copier.committed_records < fraction * RECORDS and not copier.done.is_set():
            time.sleep(0.005)
        if copier.done.is_set():
            break
        time.sleep(rng.uniform(0, 0.05))  # land anywhere inside a cycle
        server.kill()
        kills += 1
        server.start()
    thread.join(timeout=DEADLINE_S + 30)
    assert not thread.is_alive(), "the copier hung"
    if copier.failure is not None:
        raise AssertionError(f"the copier failed (seed {seed}, {dict(copier.stats)})") from copier.failure
    assert kills == KILLS, f"the copier finished before all kills ({kills}): make the run longer"
    assert copier.stats["crashes_seen"] >= 1

    committed_values = read_values(server.url, OUTPUT, OUTPUT_PARTITIONS, "read_committed")
    counts = collections.Counter(committed_values)
    expected = {f"out-{i}" for i in range(RECORDS)}
    duplicates = {value: n for value, n in counts.items() if n > 1}
    missing = expected - set(counts)
    unexpected = set(counts) - expected
    assert not duplicates, f"{len(duplicates)} values copied more than once, e.g. {sorted(duplicates)[:5]}"
    assert not missing, f"{len(missing)} values lost, e.g. {sorted(missing)[:5]}"
    assert not unexpected, f"unexpected values: {sorted(unexpected)[:5]}"
    assert len(committed_values) == RECORDS

    uncommitted_values = read_values(server.url, OUTPUT, OUTPUT_PARTITIONS, "read_uncommitted")
    assert set(uncommitted_values) == expected
    assert len(uncommitted_values) >= RECORDS
    if copier.stats["aborts"]:
        assert len(uncommitted_values) > RECORDS, "aborted transactions' records are in the log"

    with httpx.Client(base_url=server.url, timeout=60) as client:
        described = client.get(f"/v1/groups/{GROUP}").json()
        final = {o["partition"]: (o["offset"], o["lag"]) for o in described["offsets"] if o["topic"] == INPUT}
        assert final == {p: (end, 0) for p, end in enumerate(input_ends)}, described
        stable = client.post(
            f"/v1/groups/{GROUP}/offsets/fetch", json={"partitions": None, "require_stable": True}
        ).json()
        assert all(o["error"] is None for o in stable["offsets"])

    print(
        f"\nexactly-once loop (seed {seed}): {copier.stats['cycles']} cycles, {copier.stats['commits']} commits, "
        f"{copier.stats['aborts']} random aborts, {kills} kills ({copier.stats['crashes_seen']} seen by the copier, "
        f"{copier.stats['init_producer_id']} InitProducerId), {copier.stats['unstable_offset_retries']} "
        f"UNSTABLE_OFFSET_COMMIT retries, {len(uncommitted_values) - RECORDS} aborted records in the log, "
        f"{time.monotonic() - started:.1f}s"
    )
