"""The sink's exactly-once protocol: a two-phase commit (KIP-939) whose coordinator is the Spark driver
and whose commit point is the decision record (spark_client.decisions).

Task attempt (an executor's Python worker), `write_task`:
 1. reads the decision: if the batch is already decided (a re-run after a driver crash), writes
    nothing -- the decision's transactions are the batch's output;
 2. writes its rows in a transaction of its own (transactional id
    `<sink_id>/<batch>/<partition>/<attempt>-<task attempt id>`) and prepares it: durable,
    invisible to read_committed readers, never timed out. A slow server is waited out for up to
    delivery_timeout_ms (prepare_transaction() is called again while it times out after
    max_block_ms): failing the task would make Spark redo its work in a new transaction;
 3. reads the decision again: if a decision was taken meanwhile without it (a zombie: speculative
    or retried), aborts its own transaction; else returns (transactional id, producer id, epoch)
    as its commit message.

Driver, `commit_batch` (all tasks succeeded):
 1. if the batch is already decided (Spark re-runs and re-commits the last batch after a crash
    between the sink's commit and its own commit log): rolls the decision forward -- commits what
    is still Prepared -- and sweeps;
 2. else records the decision: the batch commits with exactly these prepared transactions. A
    record that failed may have been written (its answer lost): the decision is read back and
    what is there decides -- recorded: on to 3; not recorded: recorded again (the same decision);
    unknowable: an IncompleteCommitError saying the outcome is unknown (`record_decision`). The
    first record of a batch wins (spark_client.decisions): one refused because another decision
    was recorded first is read back too, and that one is the outcome;
 3. commits each of them (EndTxn with its producer id and epoch: safe to repeat);
 4. sweeps: aborts every transaction still open (Ongoing or Prepared) under the batch's prefix
    that the decision does not name -- failed and speculative attempts, which Spark never tells the
    Python side about -- and, for a streaming sink, those of earlier batches (crashed runs).

Driver, `abort_batch` (a task failed, or the commit raised): if a decision exists for the batch it
is rolled forward (an abort never undoes a commit: Spark may call abort after a commit succeeded);
else every transaction of the batch is aborted -- after a batch write's abort records an empty
decision, so that an attempt still running (Spark kills them, but their workers may go on a little)
aborts what it prepares later instead of leaving it Prepared for good. That record is refused if the
commit's decision got there first (its record arriving late, after the commit gave up on it): the
abort then rolls that decision forward. A commit's record arriving after the abort's is refused:
the job stays aborted, as its abort found it.

Why zombies cannot commit: a task prepares, then reads the decision; the driver records the
decision, then lists. If the task's read came first, so did its prepare, so the driver's list finds
the transaction and aborts it; if the driver's record came first, the task sees the decision and
aborts itself. Every transaction of a batch is therefore committed iff the decision names it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

from spark_client.columns import write_rows
from spark_client.decisions import Decision, DecisionLog, Relation, SinkBatch, SinkStateError
from spark_client.faults import crash_driver
from spark_client.options import ConnectionOptions, WriteOptions
from txbroker import Producer, errors
from txbroker.two_phase import AsyncTwoPhaseClient, PreparedTransaction

log = logging.getLogger("spark_client")
# A decision whose record failed and was found not recorded when read back is recorded once more
# (each attempt retried for up to commit_timeout_ms): the server answered the read, so it is back.
RECORD_ATTEMPTS = 2


class IncompleteCommitError(RuntimeError):
    """The driver's commit or abort of a batch could not finish (the server did not answer within
    commit_timeout_ms): the message says whether the batch is committed and what finishes it."""


@dataclass
class TaskCommitMessage(WriterCommitMessage):
    """What a successful task attempt tells the driver. `transaction` is None when the task wrote
    nothing: no rows, or `skipped` (the batch was already decided, or decided without it)."""

    partition: int
    transaction: PreparedTransaction | None
    rows: int
    skipped: bool = False
    query_id: str | None = None


@dataclass(frozen=True)
class TaskAttempt:
    """Who is writing: Spark's TaskContext, as plain values."""

    partition: int
    attempt: int
    task_attempt_id: int
    query_id: str | None = None


# ---- the task's side


def _read_decision(options: WriteOptions, batch: SinkBatch) -> Decision | None:
    async def read() -> Decision | None:
        async with DecisionLog(options.connection, batch, options.commit_timeout_ms) as decisions:
            return await decisions.read()

    return asyncio.run(read())


def _prepare(producer: Producer, bound_ms: int) -> PreparedTransaction | None:
    """prepare_transaction(), called again while it raises a retriable TxbrokerTimeoutError -- the
    server slow to take the records or to answer the PrepareTxn: each call blocks at most
    max_block_ms, and the next resumes it -- for up to `bound_ms` (delivery_timeout_ms: what a task
    waited for its records before prepare_transaction() was bounded by max_block_ms), give or take
    one max_block_ms. A slow but working server then costs no task retry, which would redo the
    task's work in a new transaction. Any other error, and the timeout past the bound, is raised;
    so is an abortable timeout (a record failed at its delivery timeout, its request in flight):
    the transaction can only abort, and calling again would raise it again at once."""
    deadline = time.monotonic() + bound_ms / 1000
    while True:
        try:
            return producer.prepare_transaction()
        except errors.TxbrokerTimeoutError as error:
            if not error.retriable or error.abortable or time.monotonic() >= deadline:
                raise
            log.info("%s: not prepared yet, preparing on (%s)", producer.transactional_id, error)


def write_task(
    options: WriteOptions, batch: SinkBatch, batches: Iterator[pa.RecordBatch], task: TaskAttempt
) -> TaskCommitMessage:
    """Phase one for one task attempt: write the rows in a transaction of its own, and prepare it."""
    faults = options.faults
    decided = _read_decision(options, batch)
    relation = batch.relation(decided, task.query_id)
    if relation is Relation.SUPERSEDED:
        raise batch.superseded_error(decided, task.query_id)
    if relation is Relation.COMMITTED:
        log.info("%s: batch %s is already decided: this attempt writes nothing", batch.sink_id, batch.batch_key)
        return TaskCommitMessage(task.partition, None, 0, skipped=True, query_id=task.query_id)
    faults.task_point("before_write", batch.batch_id, task.partition, task.attempt)
    transactional_id = batch.transactional_id(task.partition, task.attempt, task.task_attempt_id)
    producer: Producer | None = None
    rows = 0
    try:
        for record_batch in batches:
            if record_batch.num_rows == 0:
                continue
            if producer is None:  # no transaction at all for a task without rows
                producer = Producer(
                    options.connection.url, transactional_id=transactional_id, **options.producer_config
                )
                producer.init_transactions()
                producer.begin_transaction()
            send, topic = producer.send, options.topic
            for key, value, partition, headers, timestamp_ms in write_rows(record_batch):
                send(topic, value, key=key, partition=partition, headers=headers, timestamp_ms=timestamp_ms)
            rows += record_batch.num_rows
            if faults.tasks or faults.pause:
                producer.flush()
                faults.task_point("mid_write", batch.batch_id, task.partition, task.attempt)
        if producer is None:
            return TaskCommitMessage(task.partition, None, 0, query_id=task.query_id)
        faults.point("before_prepare", batch.batch_id)
        prepared = _prepare(producer, options.delivery_timeout_ms)
        if prepared is None:  # broken invariant: rows were sent, so the transaction has content
            raise RuntimeError(f"{transactional_id}: {rows} rows sent but nothing to prepare")
        faults.task_point("after_prepare", batch.batch_id, task.partition, task.attempt)
        if batch.relation(_read_decision(options, batch), task.query_id) is not Relation.UNDECIDED:
            # Decided without this attempt (it is a zombie): nobody else will look for it.
            log.warning(
                "%s: batch %s was decided without %s: aborting it", batch.sink_id, batch.batch_key, transactional_id
            )
            producer.abort_transaction()
            return TaskCommitMessage(task.partition, None, rows, skipped=True, query_id=task.query_id)
        return TaskCommitMessage(task.partition, prepared, rows, query_id=task.query_id)
    except BaseException:
        if producer is not None:  # best effort: the driver's sweep aborts what is left anyway
            try:
                producer.abort_transaction()
            except Exception as error:  # noqa: BLE001 - the task's own error is the one to raise
                log.info("aborting %s after a failure: %s", transactional_id, error)
        raise
    finally:
        if producer is not None:
            producer.close(timeout=5)


# ---- the driver's side


class _Coordinator:
    """The driver's calls for one batch: decisions, completions, the sweep."""

    def __init__(
        self, options: WriteOptions, batch: SinkBatch, decisions: DecisionLog, transactions: AsyncTwoPhaseClient
    ) -> None:
        self.options, self.batch, self.decisions, self.transactions = options, batch, decisions, transactions

    async def roll_forward(self, decision: Decision) -> None:
        """Commits what the decision names (idempotent: committed ones answer success), then sweeps."""
        log.info(
            "%s: rolling batch %d forward (%d transactions)",
            self.batch.sink_id,
            decision.batch_id,
            len(decision.transactions),
        )
        try:
            await self.transactions.commit_all(decision.transactions)
        except (errors.ProducerFencedError, errors.InvalidTxnStateError) as error:
            raise SinkStateError(
                f"batch {decision.batch_id} of sink {self.batch.sink_id!r} was decided, but one of its transactions "
                f"is no longer Prepared and was not committed by the sink: someone else aborted it (an operator's "
                f"abort?), so its rows are lost ({error})"
            ) from error
        await self.sweep(decision.transactions)

    async def sweep(self, keep: Iterable[PreparedTransaction]) -> None:
        """Aborts every open transaction of this batch (and, for a stream, of earlier batches) but `keep`."""
        kept = {t.transactional_id for t in keep}
        leftovers = [
            t
            for t in await self.transactions.list(self.batch.sweep_prefix)
            if self.batch.sweeps(t["transactional_id"]) and t["transactional_id"] not in kept
        ]
        if leftovers:
            log.info(
                "%s: aborting %d transactions of failed or extra attempts: %s",
                self.batch.sink_id,
                len(leftovers),
                [t["transactional_id"] for t in leftovers],
            )
        slots = asyncio.Semaphore(8)

        async def abort(transaction: dict) -> None:
            async with slots:
                await self.transactions.abort_open(
                    transaction["transactional_id"], transaction["producer_id"], transaction["producer_epoch"]
                )

        await asyncio.gather(*(abort(t) for t in leftovers))

    async def commit(self, messages: Sequence[TaskCommitMessage | None]) -> Decision:
        batch = self.batch
        decided = await self.decisions.read()
        query_id = _query_id(messages)
        relation = batch.relation(decided, query_id)
        if relation is Relation.COMMITTED:
            await self.finish(decided)
            return decided
        if relation is Relation.SUPERSEDED:
            await self.transactions.commit_all(decided.transactions)  # whoever's it is, it was decided
            raise batch.superseded_error(decided, query_id)
        if any(m is None for m in messages):
            raise SinkStateError(f"commit of batch {batch.batch_key} without every task's message: {messages}")
        if any(m.skipped for m in messages):
            raise SinkStateError(
                f"tasks of batch {batch.batch_key} found a decision for it that is gone now: "
                f"is another query writing with sink_id {batch.sink_id!r}?"
            )
        prepared = [m.transaction for m in messages if m.transaction is not None]
        await asyncio.to_thread(self.options.faults.point, "before_decision", batch.batch_id)
        decision = await self.record_decision(prepared, query_id)  # the commit point
        if batch.job and decision.transactions != tuple(prepared):
            # Only an abort of the job records another decision for it (the empty one): it stands.
            raise SinkStateError(
                f"batch write {batch.job} of sink {batch.sink_id!r} is NOT committed: an abort of the job recorded "
                f"its decision first, naming {len(decision.transactions)} transactions, not these {len(prepared)} "
                f"prepared ones, and the first decision recorded for a batch stands. The abort Spark calls next "
                f"aborts them; run the write again"
            )
        await asyncio.to_thread(self.options.faults.point, "after_decision", batch.batch_id)
        if self.options.faults.crashes_after_decision(batch.batch_id):
            await self.transactions.commit_all(prepared[:1])
            crash_driver()
        await self.finish(decision)
        return decision

    async def record_decision(self, prepared: Sequence[PreparedTransaction], query_id: str | None) -> Decision:
        """Records the decision: the commit point. Returns the decision recorded for the batch:
        this one, or one recorded first by another writer (the first wins: DecisionLog.record). A
        record that failed may have been written all the same -- its answer lost (the node died
        right after writing it, or the request timed out after the server wrote it) -- and a
        refused one was refused because another decision is there, so the decision is read back,
        and what is there is the outcome: recorded (this one or another for this batch), the batch
        is committed with it (and is finished); not recorded while the server answers again, it is
        recorded again; a refusal (a non-retriable error) with nothing recorded for the batch is
        raised as it is; unknowable within the bounds, an error that says so and how to learn it.
        Every record of a commit, retried or arriving late, is this very decision (the same
        transactions, in the same order), and one arriving after another decision of its batch,
        or a later batch's, was recorded is refused: nothing recorded is ever replaced."""
        batch = self.batch
        for _ in range(RECORD_ATTEMPTS):
            try:
                return await self.decisions.record(batch.batch_id, prepared, query_id)
            except errors.TxbrokerError as error:
                failure = error
            log.warning(
                "%s: recording the decision of batch %s failed (%s): reading it back",
                batch.sink_id,
                batch.batch_key,
                failure,
            )
            try:
                recorded = await self.decisions.read()
            except errors.TxbrokerError as read_error:
                raise self.unknown_outcome(failure, read_error) from failure
            relation = batch.relation(recorded, query_id)
            if relation is Relation.COMMITTED:
                mine = recorded.transactions == tuple(prepared)
                log.info(
                    "%s: the decision of batch %s was recorded, %s",
                    batch.sink_id,
                    batch.batch_key,
                    "its answer lost" if mine else f"another one first ({len(recorded.transactions)} transactions)",
                )
                return recorded
            if relation is Relation.SUPERSEDED:
                raise batch.superseded_error(recorded, query_id) from failure
            if not failure.retriable:
                raise failure  # the server refused it: not recorded, nothing committed (Spark's abort follows)
        raise self.unknown_outcome(failure, f"not recorded when read back after each of {RECORD_ATTEMPTS} records")

    def unknown_outcome(self, failure: Exception, read_back: object) -> IncompleteCommitError:
        """The error of a commit that cannot tell whether its decision was recorded."""
        batch, connection = self.batch, self.options.connection
        return self.commit_error(
            f"the outcome of batch {batch.batch_key} of sink {batch.sink_id!r} is UNKNOWN: recording its decision "
            f"(the commit point) failed ({failure}), and the server may have written it before its answer was "
            f"lost; reading it back did not tell ({read_back}).",
            job_remedy=(
                f"Do not run the write again before you know: if it is committed, its rows would be written "
                f"twice. Once the server answers (Spark's abort, which runs next, may already finish it), run "
                f"spark_client.recover({connection.url!r}, {batch.sink_id!r}, {batch.topic!r}, abort_undecided=True) "
                f"while no other write with this sink_id runs -- it commits the job if its decision was recorded, "
                f"else aborts it -- then spark_client.job_outcome({connection.url!r}, {batch.sink_id!r}, "
                f"{batch.topic!r}, {batch.job!r}) says which: 'committed' (done), or 'not committed' or "
                f"'undecided' (run the write again)"
            ),
            stream_remedy=(
                f"Restart the query from its checkpoint, with the same sink_id: it finishes batch {batch.batch_id} "
                f"as its decision says if one was recorded, else writes it again, once"
            ),
        )

    def commit_error(self, what: str, job_remedy: str, stream_remedy: str) -> IncompleteCommitError:
        return IncompleteCommitError(f"{what} {job_remedy if self.batch.job else stream_remedy}")

    async def finish(self, decision: Decision) -> None:
        """roll_forward() of a commit: a failure to finish says the batch is committed all the same."""
        try:
            await self.roll_forward(decision)
        except errors.TxbrokerError as error:
            raise self.incomplete_commit(decision, error) from error

    def incomplete_commit(self, decision: Decision, error: Exception) -> IncompleteCommitError:
        """The error of a commit that failed after its decision was recorded: the batch IS
        committed, and what finishes it is not a new run of the write (which would write its rows
        twice) but a roll forward."""
        batch, connection = self.batch, self.options.connection
        return self.commit_error(
            f"batch {batch.batch_key} of sink {batch.sink_id!r} IS COMMITTED (its decision, "
            f"{len(decision.transactions)} prepared transactions, was recorded), but finishing it failed: {error}. "
            f"Until it is finished, its rows are not visible and its transactions hold back read_committed "
            f"readers of {batch.topic!r}.",
            job_remedy=(
                f"Do not run the write again: its rows would be written twice. Once the server answers, finish "
                f"it with spark_client.recover({connection.url!r}, {batch.sink_id!r}, {batch.topic!r}) (nothing "
                f"to do if the abort Spark calls next could finish it: recover() then reports nothing committed)"
            ),
            stream_remedy=(
                f"Restart the query from its checkpoint, with the same sink_id: it finishes batch "
                f"{decision.batch_id} before it goes on (a new checkpoint would write the batch's rows again)"
            ),
        )

    async def abort(self, messages: Sequence[TaskCommitMessage | None]) -> None:
        try:
            await self._abort(messages)
        except errors.TxbrokerError as error:
            if not self.batch.job:
                raise  # the query's restart from its checkpoint re-runs the batch and sweeps it
            connection = self.options.connection
            raise IncompleteCommitError(
                f"aborting batch write {self.batch.job} of sink {self.batch.sink_id!r} failed: {error}. Its "
                f"transactions may be left open -- Prepared ones for good, holding back read_committed readers of "
                f"{self.batch.topic!r}. Once the server answers, run spark_client.recover({connection.url!r}, "
                f"{self.batch.sink_id!r}, {self.batch.topic!r}, abort_undecided=True) while no other write with "
                f"this sink_id runs: it finishes the job as its decision says, if one was recorded, else aborts it"
            ) from error

    async def _abort(self, messages: Sequence[TaskCommitMessage | None]) -> None:
        decided = await self.decisions.read()
        if self.batch.relation(decided, _query_id(messages)) is Relation.COMMITTED:
            await self.roll_forward(decided)  # an abort never undoes a commit
            return
        if self.batch.job:
            # An attempt Spark no longer waits for (speculative, or killed as the job failed) may
            # still prepare after the sweep below. A job's id is never written again, so deciding it
            # with no transaction makes such a straggler abort its own, as a zombie of a committed
            # batch does. A stream's batch must stay undecided: Spark re-runs it under the same id
            # after a restart, and that run's sweep finds the stragglers.
            decided = await self.decisions.record_or_read(self.batch.batch_id, (), _query_id(messages))
            if decided is not None and decided.transactions:
                # The commit's decision was recorded since our read (its record arrived late): the
                # first decision stands, and an abort never undoes a commit.
                await self.roll_forward(decided)
                return
        await self.transactions.abort_all([m.transaction for m in messages if m is not None and m.transaction])
        await self.sweep(())


def _query_id(messages: Sequence[TaskCommitMessage | None]) -> str | None:
    return next((m.query_id for m in messages if m is not None and m.query_id), None)


async def _as_coordinator(options: WriteOptions, batch: SinkBatch, action):
    connection = options.connection
    async with (
        DecisionLog(connection, batch, options.commit_timeout_ms) as decisions,
        AsyncTwoPhaseClient(
            connection.url, default_api_timeout_ms=options.commit_timeout_ms, **connection.client_config
        ) as transactions,
    ):
        return await action(_Coordinator(options, batch, decisions, transactions))


def commit_batch(options: WriteOptions, batch: SinkBatch, messages: Sequence[TaskCommitMessage | None]) -> Decision:
    """The driver's commit of a batch (see the module docstring); idempotent per batch."""
    decision = asyncio.run(_as_coordinator(options, batch, lambda c: c.commit(messages)))
    log.info(
        "%s: batch %s committed: %d transactions, %d rows",
        batch.sink_id,
        batch.batch_key,
        len(decision.transactions),
        sum(m.rows for m in messages if m is not None),
    )
    return decision


def abort_batch(options: WriteOptions, batch: SinkBatch, messages: Sequence[TaskCommitMessage | None]) -> None:
    """The driver's abort of a batch: rolls a recorded decision forward, else aborts everything."""
    asyncio.run(_as_coordinator(options, batch, lambda c: c.abort(messages)))


# ---- after a crash


async def _recover(connection: ConnectionOptions, sink_id: str, topic: str, abort_undecided: bool) -> dict:
    report = {"committed": [], "aborted": [], "left": []}
    async with AsyncTwoPhaseClient(connection.url, **connection.client_config) as transactions:
        open_ones = await transactions.list(f"{sink_id}/")
        by_batch: dict[str, list[dict]] = {}
        for transaction in open_ones:
            by_batch.setdefault(transaction["transactional_id"][len(sink_id) + 1 :].split("/", 1)[0], []).append(
                transaction
            )
        stream_decision: Decision | None = None
        if any(key.isdigit() for key in by_batch):
            async with DecisionLog(connection, SinkBatch(sink_id, topic)) as decisions:
                stream_decision = await decisions.read()
        for key, found in sorted(by_batch.items()):
            batch = SinkBatch(sink_id, topic, int(key)) if key.isdigit() else SinkBatch(sink_id, topic, job=key)
            if batch.job:
                async with DecisionLog(connection, batch) as decisions:
                    decision = await decisions.read()
                    if decision is None and abort_undecided:
                        # Decided "nothing committed" before its transactions are aborted, as an
                        # abort of the job does: a record of its commit still on its way is then
                        # refused, or, recorded first, is the outcome (committed below).
                        decision = await decisions.record_or_read(batch.batch_id, ())
            else:
                decision = stream_decision
            relation = batch.relation(decision)
            decided = {t.transactional_id for t in decision.transactions} if relation is Relation.COMMITTED else set()
            if decided:
                await transactions.commit_all(decision.transactions)
                report["committed"] += sorted(decided)
            for transaction in found:
                tid = transaction["transactional_id"]
                if tid in decided:
                    continue
                # Not named by a decision of its batch, or of a later one (SUPERSEDED): a loser. In
                # an undecided batch: only the caller knows its writer is gone (abort_undecided).
                if relation is not Relation.UNDECIDED or abort_undecided:
                    await transactions.abort_open(tid, transaction["producer_id"], transaction["producer_epoch"])
                    report["aborted"].append(tid)
                else:
                    report["left"].append(tid)
    return report


def recover(url: str, sink_id: str, topic: str, *, token: str | None = None, abort_undecided: bool = False) -> dict:
    """Finishes what crashed drivers of a sink left open: commits every Prepared transaction that a
    recorded decision names, aborts the other open transactions of decided (or earlier) batches,
    and with `abort_undecided=True` -- only when no writer of this sink_id is running -- the open
    transactions of undecided batches too (a batch write whose driver died before deciding), after
    recording an undecided batch write's empty decision (as Spark's abort of it does: the first
    decision stands, so a record of its commit arriving later is refused).
    A streaming query does this by itself when it restarts; batch writes need this call.
    Returns the transactional ids {"committed": [...], "aborted": [...], "left": [...]}."""
    return asyncio.run(_recover(ConnectionOptions(url.rstrip("/"), token), sink_id, topic, abort_undecided))


def job_outcome(url: str, sink_id: str, topic: str, job: str, *, token: str | None = None) -> str:
    """What the batch write `job` (its id, `job-<hex>`, as its errors name it) committed, as its
    decision record says: "committed" (a decision names its transactions: its rows are written, or
    will be once the decision is rolled forward -- by Spark's abort, or by recover()), "not
    committed" (its decision names none: it was aborted, or had no rows) or "undecided" (no
    decision: nothing is committed; recover(..., abort_undecided=True) aborts what it left open).
    What a job whose commit failed with an UNKNOWN outcome needs to know before it is run again."""
    if not job.startswith("job-"):
        raise ValueError(
            f"job_outcome: a batch write's job id looks like 'job-<hex>' (its errors name it), not {job!r}"
        )

    async def read() -> Decision | None:
        batch = SinkBatch(sink_id, topic, job=job)
        async with DecisionLog(ConnectionOptions(url.rstrip("/"), token), batch) as decisions:
            return await decisions.read()

    decision = asyncio.run(read())
    if decision is None:
        return "undecided"
    return "committed" if decision.transactions else "not committed"
