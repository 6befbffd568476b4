"""Concurrency of the transaction coordinator, with real HTTP requests (and so real PostgreSQL
connections) interleaved: racing InitProducerIds, EndTxn racing the timeout worker and the admin
abort, many idempotent and transactional producers on shared partitions, several server processes
(and their background workers) on one database.

Every scenario checks the contract's outcome (docs/api.md, "Producing", "Transactions", "Consuming"):
exactly one outcome per transaction, exactly one marker per partition for its (producer id, epoch),
read_committed never shows an aborted record, and the LSO reaches the high watermark once nothing is
open.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from txbroker.wire import partition_for_key

REFUSALS = {"PRODUCER_FENCED", "INVALID_TXN_STATE", "CONCURRENT_TRANSACTIONS"}


# ---- helpers (plain HTTP, as any client would speak it)

# A new connection per request: on a kept-alive connection to the test servers every response waits
# ~40 ms (the server writes headers and body apart without TCP_NODELAY, and the client delays its
# ACK), which would slow these tests tenfold and space the racing requests out.
NO_KEEPALIVE = httpx.Limits(max_keepalive_connections=0)


def _http(url: str, timeout_s: float = 60) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=timeout_s, limits=NO_KEEPALIVE)


def _ahttp(url: str, timeout_s: float = 60, max_connections: int = 100) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=url,
        timeout=timeout_s,
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=0),
    )


def _create_topic(client: httpx.Client, name: str, partitions: int) -> None:
    client.post("/v1/topics", json={"name": name, "partitions": partitions}).raise_for_status()


def _init(client: httpx.Client, transactional_id: str | None, timeout_ms: int = 60_000, **extra) -> tuple[int, int]:
    response = client.post(
        "/v1/producers/init",
        json={
            "transactional_id": transactional_id,
            "transaction_timeout_ms": timeout_ms,
            "producer_id": -1,
            "producer_epoch": -1,
            **extra,
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    return body["producer_id"], body["producer_epoch"]


def _produce(
    client: httpx.Client,
    producer_id: int,
    producer_epoch: int,
    batches: list[tuple[str, int, int, list[str]]],
    transactional_id: str | None = None,
) -> httpx.Response:
    """batches: (topic, partition, base_sequence, values)."""
    return client.post(
        "/v1/produce",
        json={
            "transactional_id": transactional_id,
            "producer_id": producer_id,
            "producer_epoch": producer_epoch,
            "partitions": [
                {
                    "topic": topic,
                    "partition": partition,
                    "base_sequence": sequence,
                    "records": [{"value": value} for value in values],
                }
                for topic, partition, sequence, values in batches
            ],
        },
    )


def _produce_ok(client, producer_id, producer_epoch, batches, transactional_id=None) -> list[dict]:
    response = _produce(client, producer_id, producer_epoch, batches, transactional_id)
    assert response.status_code == 200, response.text
    entries = response.json()["partitions"]
    assert all(entry["error"] is None for entry in entries), entries
    return entries


def _end(
    client: httpx.Client, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
) -> httpx.Response:
    return client.post(
        "/v1/txn/end",
        json={
            "transactional_id": transactional_id,
            "producer_id": producer_id,
            "producer_epoch": producer_epoch,
            "committed": commit,
        },
    )


def _code(response: httpx.Response) -> str | None:
    if response.status_code == 200:
        return None
    return response.json()["error"]["code"]


def _describe(client: httpx.Client, transactional_id: str) -> dict:
    response = client.get(f"/v1/transactions/{transactional_id}")
    assert response.status_code == 200, response.text
    return response.json()


def _wait_for_state(client: httpx.Client, transactional_id: str, states: set[str], timeout_s: float = 15) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        described = _describe(client, transactional_id)
        if described["state"] in states:
            return described
        assert time.monotonic() < deadline, f"{transactional_id} stayed {described['state']}, expected {states}"
        time.sleep(0.02)


def _read(
    client: httpx.Client, topic: str, partition: int, isolation_level: str, offset: int = 0
) -> tuple[list[tuple[int, str]], dict]:
    """Every record from `offset` up to the isolation level's bound, and the last fetch entry."""
    records = []
    while True:
        response = client.post(
            "/v1/fetch",
            json={
                "isolation_level": isolation_level,
                "max_records": 10_000,
                "partitions": [{"topic": topic, "partition": partition, "offset": offset}],
            },
        )
        assert response.status_code == 200, response.text
        entry = response.json()["partitions"][0]
        assert entry["error"] is None, entry
        records += [(record["offset"], record["value"]) for record in entry["records"]]
        bound = entry["last_stable_offset"] if isolation_level == "read_committed" else entry["high_watermark"]
        if entry["next_offset"] >= bound or entry["next_offset"] == offset:
            return records, entry
        offset = entry["next_offset"]


def _values(client, topic, partition, isolation_level) -> list[str]:
    return [value for _, value in _read(client, topic, partition, isolation_level)[0]]


def _markers(client: httpx.Client, topic: str, partition: int) -> list[dict]:
    response = client.get(f"/v1/topics/{topic}/partitions/{partition}/markers", params={"offset": 0, "limit": 10_000})
    assert response.status_code == 200, response.text
    return response.json()["markers"]


def _markers_of(client, topic, partition, producer_id, producer_epoch) -> list[dict]:
    return [
        m
        for m in _markers(client, topic, partition)
        if (m["producer_id"], m["producer_epoch"]) == (producer_id, producer_epoch)
    ]


def _assert_stable(client: httpx.Client, topic: str) -> None:
    """Nothing is open on the topic: every partition's LSO is its high watermark."""
    body = client.get(f"/v1/topics/{topic}").json()
    for partition in body["partitions"]:
        assert partition["last_stable_offset"] == partition["high_watermark"], body


def _transaction_log(client: httpx.Client, transactional_id: str) -> list[dict]:
    """The __transaction_state records of one transactional id (admin read of the internal topic)."""
    topic = client.get("/v1/topics/__transaction_state").json()
    partition = partition_for_key(transactional_id.encode(), len(topic["partitions"]))
    found, offset = [], 0
    while True:
        response = client.post(
            "/v1/fetch",
            json={
                "isolation_level": "read_uncommitted",
                "max_records": 10_000,
                "partitions": [{"topic": "__transaction_state", "partition": partition, "offset": offset}],
            },
        )
        assert response.status_code == 200, response.text
        entry = response.json()["partitions"][0]
        assert entry["error"] is None, entry
        found += [json.loads(r["value"]) for r in entry["records"] if r["key"] == transactional_id]
        if entry["next_offset"] >= entry["high_watermark"]:
            return found
        offset = entry["next_offset"]


def _together(*calls):
    """Runs the calls in threads released at once by a barrier; returns their results in order."""
    barrier = threading.Barrier(len(calls))

    def run(call):
        barrier.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(run, call) for call in calls]
        return [future.result() for future in futures]


# ---- InitProducerId races


@pytest.mark.parametrize("existing", [False, True], ids=["new-id", "existing-id"])
def test_racing_init_producer_id_leaves_exactly_one_instance(server, existing):
    """Two instances call InitProducerId at once, ten times over: both get an answer, the epochs
    differ, and only the higher one can write and commit; the lower one is PRODUCER_FENCED. With an
    existing id whose transaction is Ongoing, that transaction is aborted exactly once."""
    client = _http(server.url)
    _create_topic(client, "race", 1)
    clients = [_http(server.url) for _ in range(2)]
    try:
        for round_number in range(10):
            tid = f"race-{existing}-{round_number}"
            old = None
            if existing:
                old = _init(client, tid)
                _produce_ok(client, *old, [("race", 0, 0, [f"{tid}-zombie"])], tid)
            answers = _together(
                *[
                    lambda c=c, tid=tid: c.post(
                        "/v1/producers/init", json={"transactional_id": tid, "transaction_timeout_ms": 60_000}
                    )
                    for c in clients
                ]
            )
            assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
            ids = sorted((a.json()["producer_epoch"], a.json()["producer_id"]) for a in answers)
            (low_epoch, low_pid), (high_epoch, high_pid) = ids
            assert low_epoch != high_epoch or low_pid != high_pid, f"both instances got {ids}"
            assert low_pid == high_pid, "one transactional id keeps one producer id (epochs far from exhausted)"
            assert low_epoch < high_epoch
            if old is not None:
                assert low_epoch > old[1]
                markers = _markers_of(client, "race", 0, *old)
                assert [m["type"] for m in markers] == ["ABORT"], "the zombie's transaction is aborted once"

            fenced = _produce(client, low_pid, low_epoch, [("race", 0, 0, [f"{tid}-low"])], tid)
            assert _code(fenced) == "PRODUCER_FENCED", fenced.text
            fenced_end = _end(client, tid, low_pid, low_epoch, True)
            assert _code(fenced_end) == "PRODUCER_FENCED", fenced_end.text

            _produce_ok(client, high_pid, high_epoch, [("race", 0, 0, [f"{tid}-high"])], tid)
            committed = _end(client, tid, high_pid, high_epoch, True)
            assert committed.status_code == 200, committed.text
            assert committed.json()["state"] == "CompleteCommit"
        visible = _values(client, "race", 0, "read_committed")
        assert visible == [f"race-{existing}-{n}-high" for n in range(10)]
        _assert_stable(client, "race")
    finally:
        for each in clients:
            each.close()


def test_many_instances_racing_init_on_one_id_get_distinct_epochs(server):
    """Eight instances at once on one new id: eight distinct (producer id, epoch); only the highest
    can commit."""
    client = _http(server.url)
    _create_topic(client, "crowd", 1)
    clients = [_http(server.url) for _ in range(8)]
    try:
        answers = _together(*[lambda c=c: _init(c, "crowded") for c in clients])
    finally:
        for each in clients:
            each.close()
    assert len(set(answers)) == 8, answers
    best = max(answers, key=lambda a: a[1])
    for producer_id, epoch in answers:
        response = _produce(client, producer_id, epoch, [("crowd", 0, 0, [f"e{epoch}"])], "crowded")
        if (producer_id, epoch) == best:
            assert response.status_code == 200 and response.json()["partitions"][0]["error"] is None, response.text
        else:
            assert _code(response) == "PRODUCER_FENCED", response.text
    assert _end(client, "crowded", *best, True).json()["state"] == "CompleteCommit"
    assert _values(client, "crowd", 0, "read_committed") == [f"e{best[1]}"]


# ---- EndTxn racing the timeout abort and the admin abort


def _check_single_outcome(
    client, tid: str, topic: str, partitions: list[int], txn: tuple[int, int], committed: bool
) -> None:
    """The transaction of (producer id, epoch) `txn` ended exactly one way."""
    described = _wait_for_state(client, tid, {"CompleteCommit", "CompleteAbort"})
    assert described["state"] == ("CompleteCommit" if committed else "CompleteAbort"), (committed, described)
    assert described["producer_epoch"] == txn[1] + 1, (
        f"one epoch bump per ended transaction (epoch was {txn[1]}): {described}"
    )
    for partition in partitions:
        markers = _markers_of(client, topic, partition, *txn)
        assert [m["type"] for m in markers] == ["COMMIT" if committed else "ABORT"], (
            f"{tid}: partition {partition} must have exactly one marker for {txn}, has {markers}"
        )
    for partition in partitions:
        visible = [v for v in _values(client, topic, partition, "read_committed") if v.startswith(f"{tid}/")]
        everything = [v for v in _values(client, topic, partition, "read_uncommitted") if v.startswith(f"{tid}/")]
        assert everything == [f"{tid}/{partition}/{i}" for i in range(3)]
        assert visible == (everything if committed else []), (tid, committed, visible)


def test_end_txn_commit_racing_the_timeout_abort_has_exactly_one_outcome(make_server):
    server = make_server(abort_timed_out_transaction_interval_ms=50)
    client = _http(server.url)
    _create_topic(client, "timeouts", 2)
    outcomes = []
    for round_number in range(20):
        tid = f"timeout-race-{round_number}"
        txn = _init(client, tid, timeout_ms=100)
        _produce_ok(client, *txn, [("timeouts", p, 0, [f"{tid}/{p}/{i}" for i in range(3)]) for p in (0, 1)], tid)
        time.sleep(random.uniform(0.06, 0.2))  # around the timeout (100 ms) plus the worker's period (50 ms)
        response = _end(client, tid, *txn, True)
        if response.status_code == 200:
            assert response.json()["state"] == "CompleteCommit", response.text
            assert (response.json()["producer_id"], response.json()["producer_epoch"]) == (txn[0], txn[1] + 1)
            committed = True
        else:
            assert _code(response) in REFUSALS, response.text
            committed = False
        outcomes.append(committed)
        _check_single_outcome(client, tid, "timeouts", [0, 1], txn, committed)
    _assert_stable(client, "timeouts")
    print(f"commits won {sum(outcomes)} of {len(outcomes)} races against the timeout abort")


def test_end_txn_commit_racing_admin_abort_has_exactly_one_outcome(server):
    client = _http(server.url)
    _create_topic(client, "adminrace", 2)
    admin_client = _http(server.url)
    outcomes = []
    try:
        for round_number in range(20):
            tid = f"admin-race-{round_number}"
            txn = _init(client, tid)
            _produce_ok(client, *txn, [("adminrace", p, 0, [f"{tid}/{p}/{i}" for i in range(3)]) for p in (0, 1)], tid)
            commit, abort = _together(
                lambda tid=tid, txn=txn: _end(client, tid, *txn, True),
                lambda tid=tid: admin_client.post(f"/v1/transactions/{tid}/abort"),
            )
            if commit.status_code == 200:
                assert commit.json()["state"] == "CompleteCommit", commit.text
                assert _code(abort) in {"INVALID_TXN_STATE", "CONCURRENT_TRANSACTIONS"}, abort.text
                committed = True
            else:
                assert _code(commit) in REFUSALS, commit.text
                assert abort.status_code == 200, f"neither the commit nor the abort succeeded: {abort.text}"
                assert abort.json()["state"] == "CompleteAbort"
                assert abort.json()["producer_epoch"] == txn[1] + 1
                committed = False
            outcomes.append(committed)
            _check_single_outcome(client, tid, "adminrace", [0, 1], txn, committed)
    finally:
        admin_client.close()
    _assert_stable(client, "adminrace")
    print(f"commits won {sum(outcomes)} of {len(outcomes)} races against the admin abort")


def test_end_txn_commit_racing_init_of_a_new_instance(server):
    """The old instance commits while a new instance of the same transactional id initializes: the
    transaction ends exactly one way, the new instance owns the id afterwards, and whatever the old
    instance was answered cannot make it write again (the zombie stays fenced)."""
    client = _http(server.url)
    _create_topic(client, "zombies", 2)
    successor = _http(server.url)
    outcomes = []
    try:
        for round_number in range(20):
            tid = f"zombie-{round_number}"
            txn = _init(client, tid)
            _produce_ok(client, *txn, [("zombies", p, 0, [f"{tid}/{p}/{i}" for i in range(3)]) for p in (0, 1)], tid)
            commit, init = _together(
                lambda tid=tid, txn=txn: _end(client, tid, *txn, True),
                lambda tid=tid: successor.post(
                    "/v1/producers/init", json={"transactional_id": tid, "transaction_timeout_ms": 60_000}
                ),
            )
            assert init.status_code == 200, init.text
            new = (init.json()["producer_id"], init.json()["producer_epoch"])
            assert new[1] > txn[1] + 1
            committed = commit.status_code == 200
            if committed:
                assert commit.json()["state"] == "CompleteCommit", (
                    f"EndTxn answered {commit.json()} while the new instance got {new}"
                )
                assert (commit.json()["producer_id"], commit.json()["producer_epoch"]) == (txn[0], txn[1] + 1)
                answered = (commit.json()["producer_id"], commit.json()["producer_epoch"])
            else:
                assert _code(commit) in REFUSALS, commit.text
                answered = txn
            outcomes.append(committed)
            described = _describe(client, tid)
            assert (described["state"], described["producer_id"], described["producer_epoch"]) == ("Empty", *new)
            for partition in (0, 1):
                markers = _markers_of(client, "zombies", partition, *txn)
                assert [m["type"] for m in markers] == ["COMMIT" if committed else "ABORT"], (tid, markers)
                visible = [
                    v for v in _values(client, "zombies", partition, "read_committed") if v.startswith(f"{tid}/")
                ]
                assert visible == ([f"{tid}/{partition}/{i}" for i in range(3)] if committed else [])
            zombie = _produce(client, *answered, [("zombies", 0, 0, [f"{tid}/zombie"])], tid)
            assert _code(zombie) == "PRODUCER_FENCED", zombie.text
            _produce_ok(successor, *new, [("zombies", 1, 0, [f"{tid}/new"])], tid)
            assert _end(successor, tid, *new, True).json()["state"] == "CompleteCommit"
    finally:
        successor.close()
    _assert_stable(client, "zombies")
    print(f"commits won {sum(outcomes)} of {len(outcomes)} races against a new instance's InitProducerId")


def test_init_of_a_new_instance_between_the_phases_of_end_txn(server):
    """The race above at its narrowest, made deterministic, for an EndTxn whose phases are separate
    PostgreSQL transactions (docs/design.md keeps them separable; skipped while EndTxn is one PostgreSQL
    transaction, which leaves no window): EndTxn runs through a
    TransactionCoordinator in this process (on the test's database, beside the server), with a hook
    on its transaction log's `lock` so that, just before its second phase locks the transactional
    id, a new instance calls InitProducerId over HTTP. That interleaving is legal (the phases are
    separate PostgreSQL transactions). InitProducerId finds PrepareCommit, completes the commit and
    bumps the epoch for the new instance. EndTxn must then report the commit without handing the
    old instance an epoch that lets it write again (docs/api.md: InitProducerId fences every older
    instance; EndTxn's answer is what the NEXT transaction of the same instance uses)."""
    from app.coordinator.batched_writes import BatchedWrites
    from app.coordinator.transaction_coordinator import TransactionCoordinator
    from app.errors import BrokerError
    from app.settings import Settings
    from app.storage.database import create_pool

    client = _http(server.url)
    _create_topic(client, "phases", 1)
    tid = "between-phases"
    txn = _init(client, tid)
    _produce_ok(client, *txn, [("phases", 0, 0, ["v"])], tid)

    async def scenario():
        pool = await create_pool(server.database_url, 2)
        try:
            coordinator = TransactionCoordinator(pool, Settings(database_url=server.database_url))
            lock, calls, init = coordinator.log.lock, [], []

            async def lock_after_a_new_instance_initialized(conn, transactional_id):
                calls.append(transactional_id)
                if len(calls) == 2:  # EndTxn's second phase: PrepareCommit is durable
                    async with _ahttp(server.url) as http:
                        init.append(
                            await http.post(
                                "/v1/producers/init", json={"transactional_id": tid, "transaction_timeout_ms": 60_000}
                            )
                        )
                return await lock(conn, transactional_id)

            coordinator.log.lock = lock_after_a_new_instance_initialized
            try:
                result = await BatchedWrites(coordinator, max_records=1000).end_transaction(tid, *txn, True)
            except BrokerError as error:
                result = error
            return result, (init[0] if init else None)
        finally:
            await pool.close()

    end, init = asyncio.run(scenario())
    if init is None:
        assert not isinstance(end, Exception) and end.state == "CompleteCommit", end
        pytest.skip("EndTxn completes in one PostgreSQL transaction: there is no window between its phases")
    assert init.status_code == 200, init.text
    new = (init.json()["producer_id"], init.json()["producer_epoch"])
    assert _describe(client, tid)["state"] == "Empty"
    assert [m["type"] for m in _markers_of(client, "phases", 0, *txn)] == ["COMMIT"]
    assert _values(client, "phases", 0, "read_committed") == ["v"]
    if isinstance(end, Exception):
        assert str(end.code) in REFUSALS, end
        answered = txn
    else:
        answered = (end.producer_id, end.producer_epoch)
    # The old instance goes on with what EndTxn answered: it must stay fenced.
    zombie = _produce(client, *answered, [("phases", 0, 0, ["zombie"])], tid)
    assert _code(zombie) == "PRODUCER_FENCED", (
        f"EndTxn answered the old instance {end} (the new instance got {new}), and with it the old "
        f"instance wrote into the new instance's transaction: {zombie.text}"
    )
    if not isinstance(end, Exception):
        assert answered != new, f"EndTxn handed the old instance the new instance's ids: {end}"
        assert end.state == "CompleteCommit", f"EndTxn(commit) answered {end}"


def test_produce_racing_end_txn_lands_before_the_marker_or_is_refused(server):
    """A late produce of the transaction (to a partition already in it, and to a new one) races its
    EndTxn(commit): either it is appended inside the transaction (before its COMMIT marker on every
    partition, visible with the commit) or refused as a whole; it never lands after the marker,
    and nothing stays open (LSO == HW)."""
    client = _http(server.url)
    _create_topic(client, "late", 2)
    other = _http(server.url)
    landed = 0
    try:
        for round_number in range(20):
            tid = f"late-{round_number}"
            txn = _init(client, tid)
            _produce_ok(client, *txn, [("late", 0, 0, [f"{tid}/early"])], tid)
            late_batches = [("late", 0, 1, [f"{tid}/late0"]), ("late", 1, 0, [f"{tid}/late1"])]
            commit, late = _together(
                lambda tid=tid, txn=txn: _end(client, tid, *txn, True),
                lambda tid=tid, txn=txn, batches=late_batches: _produce(other, *txn, batches, tid),
            )
            assert commit.status_code == 200 and commit.json()["state"] == "CompleteCommit", commit.text
            if late.status_code == 200:
                entries = late.json()["partitions"]
                assert all(e["error"] is None for e in entries), entries
                landed += 1
                for entry, partition in zip(entries, (0, 1)):
                    [marker] = _markers_of(client, "late", partition, *txn)
                    assert marker["type"] == "COMMIT" and entry["last_offset"] < marker["offset"], (entry, marker)
                expected = {0: [f"{tid}/early", f"{tid}/late0"], 1: [f"{tid}/late1"]}
            else:
                assert _code(late) in {"CONCURRENT_TRANSACTIONS", "PRODUCER_FENCED"}, late.text
                assert _markers_of(client, "late", 1, *txn) == [], "partition 1 never joined the transaction"
                expected = {0: [f"{tid}/early"], 1: []}
            for partition in (0, 1):
                everything = [
                    v for v in _values(client, "late", partition, "read_uncommitted") if v.startswith(f"{tid}/")
                ]
                visible = [v for v in _values(client, "late", partition, "read_committed") if v.startswith(f"{tid}/")]
                assert everything == visible == expected[partition], (tid, partition, everything, visible)
    finally:
        other.close()
    _assert_stable(client, "late")
    print(f"the late produce landed in {landed} of 20 transactions")


# ---- many producers on shared partitions


@pytest.mark.parametrize("retry", ["after-the-answer", "racing-the-original"])
def test_many_idempotent_producers_with_retries_on_one_partition(server, retry):
    """Eight idempotent producers at once, 50 batches of 3 records each, every batch sent twice:
    either the retry follows the original's answer, or both are in flight at once (a client that
    timed out and retried while the original still waited for the partition). Offsets are dense,
    every record is there exactly once, and of each pair exactly one is appended and the other is
    answered `duplicate: true` with the original offsets (docs/api.md, "Producing", idempotence)."""
    client = _http(server.url)
    _create_topic(client, "idem", 1)
    producers, batches = 8, 50

    async def producer(number: int, http: httpx.AsyncClient) -> list[tuple[list[str], list[dict], dict | None]]:
        response = await http.post("/v1/producers/init", json={"transactional_id": None})
        producer_id, epoch = response.json()["producer_id"], response.json()["producer_epoch"]
        sent = []
        for batch in range(batches):
            values = [f"p{number}-b{batch}-{i}" for i in range(3)]
            body = {
                "producer_id": producer_id,
                "producer_epoch": epoch,
                "partitions": [
                    {
                        "topic": "idem",
                        "partition": 0,
                        "base_sequence": batch * 3,
                        "records": [{"value": v} for v in values],
                    }
                ],
            }
            if retry == "racing-the-original":
                pair = await asyncio.gather(http.post("/v1/produce", json=body), http.post("/v1/produce", json=body))
            else:
                pair = [await http.post("/v1/produce", json=body), await http.post("/v1/produce", json=body)]
            # A late retry (its response was lost) of one of the last five batches is a duplicate too.
            late = (await http.post("/v1/produce", json=body)).json()["partitions"][0] if batch % 10 == 9 else None
            sent.append((values, [r.json()["partitions"][0] for r in pair], late))
        return sent

    async def run():
        async with _ahttp(server.url, max_connections=4 * producers) as http:
            return await asyncio.gather(*[producer(n, http) for n in range(producers)])

    results = asyncio.run(run())
    appended_twice = [
        (values[0], pair)
        for sent in results
        for values, pair, _ in sent
        if sorted(entry["duplicate"] for entry in pair) != [False, True]
    ]
    records, entry = _read(client, "idem", 0, "read_uncommitted")
    assert not appended_twice, (
        f"{len(appended_twice)} of {producers * batches} batches were appended twice (both copies answered "
        f"duplicate: false), e.g. {appended_twice[:2]}; the partition holds {len(records)} records for "
        f"{producers * batches * 3} sent"
    )
    acknowledged: dict[int, str] = {}
    for sent in results:
        for values, pair, late in sent:
            assert all(entry["error"] is None for entry in pair), pair
            original = next(entry for entry in pair if not entry["duplicate"])
            duplicate = next(entry for entry in pair if entry["duplicate"])
            assert original["last_offset"] == original["base_offset"] + 2
            assert (duplicate["base_offset"], duplicate["last_offset"]) == (
                original["base_offset"],
                original["last_offset"],
            ), pair
            if late is not None:
                assert late["duplicate"] is True and late["base_offset"] == original["base_offset"], late
            for offset, value in zip(range(original["base_offset"], original["last_offset"] + 1), values):
                assert offset not in acknowledged, f"offset {offset} given twice"
                acknowledged[offset] = value
    assert sorted(acknowledged) == list(range(producers * batches * 3)), "offsets must be dense"
    assert dict(records) == acknowledged
    assert len(records) == len({v for _, v in records}), "every record exactly once"
    assert entry["high_watermark"] == producers * batches * 3


class _Record:
    def __init__(self, value: str) -> None:
        self.key, self.value, self.headers, self.timestamp_ms = None, value, [], None


def _queued_appends(
    database_url: str,
    first: tuple[int, list[str]],
    second: tuple[int, list[str]],
    before: list[tuple[int, list[str]]] = (),
    transactional: bool = False,
):
    """Connection A appends `first` (sequence, values) for producer 4242 in a PostgreSQL transaction
    it keeps open; connection B appends `second` meanwhile, in a transaction of its own, and queues
    behind A: on the partition's row lock for an idempotent producer, on the transactional id's row
    for a transactional one (each takes that row first, as produce does). A commits; B's result is
    returned with the partition's state."""
    from app.storage.database import connect
    from app.storage.log import partition_log, record_codec, topics
    from app.storage.log.append import BatchAppend, append_batch
    from app.storage.transactions.transaction_log import TransactionLog, TransactionRow

    log = TransactionLog()

    def append(topic, sequence: int, values: list[str]) -> BatchAppend:
        batch = record_codec.encode_batch([_Record(v) for v in values], "utf8", 0, "test")
        return BatchAppend(
            topic, 0, batch, producer_id=4242, producer_epoch=0, base_sequence=sequence, is_transactional=transactional
        )

    async def hold_the_producer(conn) -> None:
        if transactional:
            assert await log.lock(conn, "queued") is not None

    async def scenario():
        a, b = await connect(database_url), await connect(database_url)
        try:
            topic = await topics.create_topic(a, "queued", 1, {})
            if transactional:
                await topics.ensure_internal_topics(a, 1, 1)
                await log.lock_new(a, TransactionRow("queued", 4242, 0, "Ongoing", 60_000, 0, 0))
            for sequence, values in before:
                await append_batch(a, append(topic, sequence, values))

            async def append_as_b():
                async with b.transaction():
                    await hold_the_producer(b)
                    return await append_batch(b, append(topic, *second))

            transaction = a.transaction()
            await transaction.start()
            await hold_the_producer(a)
            result_a = await append_batch(a, append(topic, *first))
            queued = asyncio.create_task(append_as_b())
            await asyncio.sleep(0.3)
            assert not queued.done(), "B waits for A"
            await transaction.commit()
            result_b = await asyncio.wait_for(queued, 10)
            return result_a, result_b, await partition_log.partition_state(b, topic, 0)
        finally:
            await a.close()
            await b.close()

    return asyncio.run(scenario())


def test_a_retry_queued_behind_its_original_is_answered_as_a_duplicate(database_url):
    """Deterministic form of the racing retry above, with two real connections: the retry of an
    idempotent batch arrives while its original is being appended and queues on the partition's
    row lock. Once the original commits, the retry must be a duplicate with the original offsets,
    not a second copy of the records."""
    original, retry, state = _queued_appends(database_url, (0, ["a", "b", "c"]), (0, ["a", "b", "c"]))
    assert (original.base_offset, original.last_offset, original.duplicate) == (0, 2, False)
    assert (retry.base_offset, retry.last_offset, retry.duplicate) == (0, 2, True), (
        f"the retry was appended again: {retry}; high watermark {state.high_watermark}, expected 3"
    )
    assert state.high_watermark == 3


def test_the_next_batch_queued_behind_the_previous_one_is_appended(database_url):
    """A producer with two batches in flight (sequences 3 and 4, as Kafka's up to five in-flight
    requests): the second queues on the partition's row lock behind the first. Once the first
    commits, sequence 4 is the next expected one and must be appended, not refused as
    OUT_OF_ORDER_SEQUENCE_NUMBER (which tells the producer it lost data and must stop)."""
    first, second, state = _queued_appends(database_url, (3, ["d"]), (4, ["e"]), before=[(0, ["a", "b", "c"])])
    assert (first.base_offset, first.duplicate) == (3, False)
    assert getattr(second, "base_offset", None) == 4, f"sequence 4 after 3 was refused: {second!r}"
    assert state.high_watermark == 5


def test_a_transactional_retry_queued_behind_its_original_is_answered_as_a_duplicate(database_url):
    """append_batches reads a transactional producer's state in the statement that locks the
    partitions, whose snapshot predates any wait for them. That is right because its caller holds
    the transactional id's row since an earlier statement (as produce does): the retry of a batch
    queues on that row behind its original, and once the original commits, the retry's statements
    all see its state. The retry must be a duplicate with the original's offsets (without the row
    lock it is appended again: checked by hand)."""
    original, retry, state = _queued_appends(
        database_url, (0, ["a", "b", "c"]), (0, ["a", "b", "c"]), transactional=True
    )
    assert (original.base_offset, original.last_offset, original.duplicate) == (0, 2, False)
    assert (retry.base_offset, retry.last_offset, retry.duplicate) == (0, 2, True), (
        f"the retry was appended again: {retry}; high watermark {state.high_watermark}, expected 3"
    )
    assert state.high_watermark == 3


def test_many_transactional_producers_on_shared_partitions(server):
    """Six transactional ids, ten transactions each alternating commit and abort, all writing to the
    same two partitions, while a read_committed consumer follows the log: it never sees an aborted
    or undecided record and ends with exactly the committed ones; read_uncommitted shows all."""
    client = _http(server.url)
    _create_topic(client, "shared", 2)
    ids, transactions = 6, 10
    stop = threading.Event()
    seen: dict[int, list[tuple[int, str]]] = {0: [], 1: []}
    reader_errors: list[BaseException] = []

    def writer(number: int) -> tuple[set[str], set[str]]:
        tid = f"shared-{number}"
        committed, aborted = set(), set()
        with _http(server.url) as http:
            producer_id, epoch = _init(http, tid)
            for txn in range(transactions):
                values = {p: [f"{tid}/t{txn}/p{p}/{i}" for i in range(4)] for p in (0, 1)}
                # Two batches per partition per transaction (a new epoch starts at sequence 0).
                for half in (0, 1):
                    _produce_ok(
                        http,
                        producer_id,
                        epoch,
                        [("shared", p, half * 2, values[p][half * 2 : half * 2 + 2]) for p in (0, 1)],
                        tid,
                    )
                commit = txn % 2 == 0
                response = _end(http, tid, producer_id, epoch, commit)
                assert response.status_code == 200, response.text
                assert response.json()["state"] == ("CompleteCommit" if commit else "CompleteAbort")
                producer_id, epoch = response.json()["producer_id"], response.json()["producer_epoch"]
                (committed if commit else aborted).update(values[0] + values[1])
        return committed, aborted

    def reader() -> None:
        offsets = {0: 0, 1: 0}
        with _http(server.url) as http:
            try:
                while True:
                    finished = stop.is_set()
                    for partition in (0, 1):
                        records, entry = _read(http, "shared", partition, "read_committed", offsets[partition])
                        seen[partition] += records
                        offsets[partition] = entry["next_offset"]
                    if finished:
                        return
            except (AssertionError, httpx.HTTPError) as error:  # reported by the main thread
                reader_errors.append(error)

    reader_thread = threading.Thread(target=reader)
    reader_thread.start()
    try:
        with ThreadPoolExecutor(ids) as pool:
            results = list(pool.map(writer, range(ids)))
    finally:
        stop.set()
        reader_thread.join(timeout=60)
    assert not reader_errors, reader_errors
    committed = set().union(*(c for c, _ in results))
    aborted = set().union(*(a for _, a in results))
    for partition in (0, 1):
        final = _values(client, "shared", partition, "read_committed")
        assert set(final) == {v for v in committed if f"/p{partition}/" in v}
        assert len(final) == len(set(final))
        assert not set(final) & aborted
        followed = [value for _, value in seen[partition]]
        assert followed == final, "the following consumer saw something else than the final committed log"
        offsets = [offset for offset, _ in seen[partition]]
        assert offsets == sorted(offsets)
        everything = _values(client, "shared", partition, "read_uncommitted")
        assert set(everything) == {v for v in committed | aborted if f"/p{partition}/" in v}
        assert len(everything) == len(set(everything))
    _assert_stable(client, "shared")


# ---- several servers on one database


def test_servers_sharing_a_database_issue_unique_producer_ids(make_server):
    a, b = make_server(), make_server()
    assert a.database_url == b.database_url and a.url != b.url
    clients = [_http(s.url) for s in (a, b) for _ in range(4)]
    try:

        def init_many(client: httpx.Client, number: int) -> list[int]:
            issued = [_init(client, None)[0] for _ in range(15)]
            issued += [_init(client, f"multi-{number}-{i}")[0] for i in range(5)]
            return issued

        answers = _together(*[lambda c=c, n=n: init_many(c, n) for n, c in enumerate(clients)])
    finally:
        for each in clients:
            each.close()
    issued = [pid for answer in answers for pid in answer]
    assert len(issued) == 8 * 20
    assert len(set(issued)) == len(issued), "a producer id was issued twice"


def test_idempotent_producer_alternating_between_servers(make_server):
    """Sequence state lives in PostgreSQL: a producer initialized on A keeps its sequence when its
    batches go to A and B alternately, and a retry through the other server is a duplicate."""
    a, b = make_server(), make_server()
    ca, cb = _http(a.url), _http(b.url)
    _create_topic(ca, "roam", 1)
    producer_id, epoch = _init(ca, None)
    acknowledged = {}
    for batch in range(20):
        first, other = (ca, cb) if batch % 2 == 0 else (cb, ca)
        values = [f"b{batch}-{i}" for i in range(3)]
        [entry] = _produce_ok(first, producer_id, epoch, [("roam", 0, batch * 3, values)])
        assert entry["duplicate"] is False
        [retry] = _produce_ok(other, producer_id, epoch, [("roam", 0, batch * 3, values)])
        assert retry["duplicate"] is True and retry["base_offset"] == entry["base_offset"], retry
        acknowledged.update({entry["base_offset"] + i: v for i, v in enumerate(values)})
    gap = _produce(cb, producer_id, epoch, [("roam", 0, 99, ["gap"])]).json()["partitions"][0]
    assert gap["error"]["code"] == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    records, _ = _read(cb, "roam", 0, "read_uncommitted")
    assert dict(records) == acknowledged and sorted(acknowledged) == list(range(60))


def test_transaction_begun_on_one_server_committed_on_another(make_server):
    a, b = make_server(), make_server()
    ca, cb = _http(a.url), _http(b.url)
    _create_topic(ca, "hop", 2)
    tid = "hopper"
    producer_id, epoch = _init(ca, tid)
    _produce_ok(ca, producer_id, epoch, [("hop", 0, 0, ["a0", "a1"])], tid)
    _produce_ok(cb, producer_id, epoch, [("hop", 0, 2, ["b0"]), ("hop", 1, 0, ["b1"])], tid)
    assert _describe(cb, tid)["state"] == "Ongoing"
    assert _values(ca, "hop", 0, "read_committed") == []
    response = _end(cb, tid, producer_id, epoch, True)
    assert response.status_code == 200 and response.json()["state"] == "CompleteCommit", response.text
    retry = _end(ca, tid, producer_id, epoch, True)
    assert retry.status_code == 200 and retry.json() == response.json(), retry.text
    assert _values(ca, "hop", 0, "read_committed") == ["a0", "a1", "b0"]
    assert _values(ca, "hop", 1, "read_committed") == ["b1"]
    # The next transaction, with the epoch the commit returned, through A again.
    next_id, next_epoch = response.json()["producer_id"], response.json()["producer_epoch"]
    stale = _produce(ca, producer_id, epoch, [("hop", 1, 1, ["late"])], tid)
    assert _code(stale) == "PRODUCER_FENCED", stale.text
    _produce_ok(ca, next_id, next_epoch, [("hop", 1, 0, ["c1"])], tid)
    assert _end(cb, tid, next_id, next_epoch, False).json()["state"] == "CompleteAbort"
    assert _values(cb, "hop", 1, "read_committed") == ["b1"]
    _assert_stable(ca, "hop")


def test_timeout_workers_on_two_servers_abort_each_transaction_once(make_server):
    """Both servers' timeout workers run every 50 ms: each timed-out transaction gets exactly one
    ABORT marker per partition, one epoch bump and one CompleteAbort in the transaction log; an
    Ongoing transaction within its timeout and a Prepared one (no timeout applies) are left alone."""
    a = make_server(abort_timed_out_transaction_interval_ms=50)
    b = make_server(abort_timed_out_transaction_interval_ms=50)
    ca, cb = _http(a.url), _http(b.url)
    _create_topic(ca, "twoworkers", 2)
    transactions = {}
    for number in range(12):
        tid = f"expiring-{number}"
        client = (ca, cb)[number % 2]
        txn = _init(client, tid, timeout_ms=150)
        _produce_ok(client, *txn, [("twoworkers", p, 0, [f"{tid}/{p}"]) for p in (0, 1)], tid)
        transactions[tid] = txn
    patient = _init(ca, "patient", timeout_ms=60_000)
    _produce_ok(ca, *patient, [("twoworkers", 0, 0, ["patient"])], "patient")
    prepared = _init(cb, "prepared", timeout_ms=100)
    _produce_ok(cb, *prepared, [("twoworkers", 1, 0, ["prepared"])], "prepared")
    assert (
        cb.post(
            "/v1/txn/prepare",
            json={"transactional_id": "prepared", "producer_id": prepared[0], "producer_epoch": prepared[1]},
        ).status_code
        == 200
    )
    for tid in transactions:
        _wait_for_state(ca, tid, {"CompleteAbort"})
    time.sleep(0.3)  # more worker rounds on both servers: nothing may happen twice
    for tid, (producer_id, epoch) in transactions.items():
        described = _describe(cb, tid)
        assert (described["state"], described["producer_id"], described["producer_epoch"]) == (
            "CompleteAbort",
            producer_id,
            epoch + 1,
        ), described
        for partition in (0, 1):
            markers = _markers_of(ca, "twoworkers", partition, producer_id, epoch)
            assert [m["type"] for m in markers] == ["ABORT"], (tid, partition, markers)
        states = [record["state"] for record in _transaction_log(ca, tid)]
        assert states.count("CompleteAbort") == 1, (tid, states)
        assert states.count("PrepareEpochFence") == 1, (tid, states)
        fenced = _end(ca, tid, producer_id, epoch, True)
        assert _code(fenced) == "PRODUCER_FENCED", fenced.text
    assert _describe(ca, "patient")["state"] == "Ongoing"
    assert _describe(ca, "prepared")["state"] == "Prepared"
    assert _markers_of(ca, "twoworkers", 1, *prepared) == []
    assert _end(cb, "patient", *patient, True).json()["state"] == "CompleteCommit"
    assert _end(ca, "prepared", *prepared, True).json()["state"] == "CompleteCommit"
    assert _values(ca, "twoworkers", 0, "read_committed") == ["patient"]
    assert _values(ca, "twoworkers", 1, "read_committed") == ["prepared"]
    _assert_stable(ca, "twoworkers")
