"""The sink's decisions: which prepared transactions make up a committed batch, recorded durably
before any of them is committed. Recording it is the commit point of the two-phase commit: once it
is written, the batch IS committed, whoever finishes the job (this driver, or the next one after a
crash, or `spark_client.recover`); before it, the batch's transactions are only ever aborted.

A decision is an offset commit (generation -1: no group membership) of a group of its own:

    group   txbroker-spark.<sink_id>            a streaming sink (one per query)
            txbroker-spark.<sink_id>.<job>      a batch write (one per job)
    key     (the output topic, partition 0)     offset commits name a partition of a real topic
    offset  the batch id (0 for a batch write)
    metadata {"v": 1, "batch": 7, "query": "<Spark query id>",
              "txns": [["orders/7/0/0-31", 4001, 2], ...]}   transactional id, producer id, epoch

A streaming sink keeps only its latest decision, overwritten batch after batch (as Delta Lake keeps
the latest version per txnAppId): Spark runs batch N+1 only after the sink's commit of batch N
returned, and re-runs after a crash only the last batch (whose decision, if any, is the latest). So
one record answers every question a sink asks -- "was batch N decided, and with what?" -- and a
long-running query does not leave a group per micro-batch behind. A batch write's job id is fresh,
so its decision has a group of its own (the record of what the job committed: nothing, for a job
that was aborted).

Decisions are written at most once per batch: the first writer wins. Each record is an offset commit
with `require_advance` (docs/api.md), which the server writes only past the committed offset --
atomically, whichever server process takes it -- and refuses `OFFSET_NOT_ADVANCED` at or below it,
but for a repeat of the very record already there (answered as written). A record that arrives late
(its request stuck while its driver gave up on it) therefore never replaces what was decided since:
an aborted job's empty decision, a later batch's decision. The writer of a refused record reads
what is recorded and acts on it (`commit_protocol`).

The metadata field holds at most 100,000 characters: about 2,500 tasks per batch.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import quote

from spark_client.options import ConnectionOptions
from txbroker import errors
from txbroker.connection import Connection
from txbroker.records import offset_errors
from txbroker.retry import Backoff, retrying
from txbroker.two_phase import PreparedTransaction
from txbroker.wire import NO_OFFSET

T = TypeVar("T")

GROUP_PREFIX = "txbroker-spark."
FORMAT_VERSION = 1
MAX_METADATA_CHARS = 100_000


class SinkStateError(RuntimeError):
    """The sink's recorded state contradicts this batch: another query uses the same sink_id, or the
    query's checkpoint was reset while its sink_id was kept."""


@dataclass(frozen=True)
class Decision:
    batch_id: int
    transactions: tuple[PreparedTransaction, ...]
    query_id: str | None = None

    def metadata(self) -> str:
        return json.dumps(
            {
                "v": FORMAT_VERSION,
                "batch": self.batch_id,
                "query": self.query_id,
                "txns": [list(t) for t in self.transactions],
            },
            separators=(",", ":"),
        )

    @classmethod
    def parse(cls, offset: int, metadata: str | None) -> Decision:
        try:
            body = json.loads(metadata or "")
            if body.get("v") != FORMAT_VERSION or body["batch"] != offset:
                raise ValueError(f"version {body.get('v')}, batch {body.get('batch')}")
            return cls(
                offset,
                tuple(PreparedTransaction(str(t), int(p), int(e)) for t, p, e in body["txns"]),
                body.get("query"),
            )
        except (ValueError, KeyError, TypeError) as error:
            raise SinkStateError(
                f"the sink's decision record for batch {offset} is not one this version wrote "
                f"({error}): {metadata!r:.200}"
            ) from None


class Relation(enum.Enum):
    """Where a batch stands against the sink's latest decision."""

    UNDECIDED = "undecided"  # no decision for it yet: its transactions are only ever aborted
    COMMITTED = "committed"  # decided: exactly the decision's transactions commit
    # a later batch was decided, or this batch number by another query: a contradiction (SinkStateError)
    SUPERSEDED = "superseded"


@dataclass(frozen=True)
class SinkBatch:
    """One batch of one sink, and the names its transactions and decision live under.

    Transactional ids are `<sink_id>/<batch>/<partition>/<attempt>-<task attempt id>`: one per task
    attempt, so retried and speculative attempts never share (nor fence) one, and every transaction
    of a batch is found by the prefix `<sink_id>/<batch>/`. `<batch>` is the streaming batch id, or
    the batch write's job id (`job-<hex>`)."""

    sink_id: str
    topic: str
    batch_id: int = 0
    job: str | None = None

    @property
    def group_id(self) -> str:
        return GROUP_PREFIX + self.sink_id + (f".{self.job}" if self.job else "")

    @property
    def batch_key(self) -> str:
        return self.job or str(self.batch_id)

    @property
    def prefix(self) -> str:
        return f"{self.sink_id}/{self.batch_key}/"

    @property
    def sweep_prefix(self) -> str:
        """What a commit or abort of this batch cleans up: a job's own transactions; a streaming
        sink's transactions of this batch and every earlier one (left by crashed attempts or runs)."""
        return self.prefix if self.job else f"{self.sink_id}/"

    def transactional_id(self, partition: int, attempt: int, task_attempt_id: int) -> str:
        return f"{self.prefix}{partition}/{attempt}-{task_attempt_id}"

    def sweeps(self, transactional_id: str) -> bool:
        """Whether a transaction found under `sweep_prefix` is this batch's or an earlier one's."""
        if self.job:
            return transactional_id.startswith(self.prefix)
        batch = transactional_id[len(self.sink_id) + 1 :].split("/", 1)[0]
        return batch.isdigit() and int(batch) <= self.batch_id

    def relation(self, decision: Decision | None, query_id: str | None = None) -> Relation:
        """Where this batch of the query `query_id` (Spark's query id: kept across restarts from a
        checkpoint, new with a new one) stands against the sink's latest decision."""
        if decision is None or decision.batch_id < self.batch_id:
            return Relation.UNDECIDED
        if decision.batch_id == self.batch_id:
            if query_id and decision.query_id and decision.query_id != query_id:
                # The same batch number of another query (a reset checkpoint, a second query): taken
                # for this batch's decision, its rows would be dropped as already written.
                return Relation.SUPERSEDED
            return Relation.COMMITTED
        return Relation.SUPERSEDED

    def superseded_error(self, decision: Decision, query_id: str | None) -> SinkStateError:
        return SinkStateError(
            f"sink {self.sink_id!r} already committed batch {decision.batch_id} (query {decision.query_id}), but "
            f"batch {self.batch_id} (query {query_id}) is being written now: a sink_id belongs to one streaming "
            f"query and its checkpoint. Give a query whose checkpoint was reset, or a second query, a sink_id of "
            f"its own."
        )


class DecisionLog:
    """Reads and records the decision of one sink (or batch write job): see the module docstring."""

    def __init__(self, connection: ConnectionOptions, batch: SinkBatch, api_timeout_ms: int = 120_000) -> None:
        self._connection = Connection(connection.url, **connection.client_config)
        self._group_path = f"/v1/groups/{quote(batch.group_id, safe='')}/offsets"
        self._topic = batch.topic
        self._backoff = Backoff()
        self._api_timeout_s = api_timeout_ms / 1000

    async def __aenter__(self) -> DecisionLog:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self._connection.close()

    async def _call(self, what: str, action: str, body: dict, read: Callable[[dict], T]) -> T:
        """The answer as `read` takes it, inside each attempt: an answer without the contract's
        fields (a proxy's, say) is retried as a lost one is, within the same bound."""
        return await retrying(
            lambda: self._connection.request("POST", f"{self._group_path}/{action}", body, read=read),
            what=what,
            timeout_s=self._api_timeout_s,
            backoff=self._backoff,
        )

    async def read(self) -> Decision | None:
        try:
            entries = await self._call(
                "reading the sink's decision",
                "fetch",
                {"partitions": [{"topic": self._topic, "partition": 0}], "require_stable": False},
                _committed_entries,
            )
        except errors.GroupIdNotFoundError:
            return None
        for error, offset, metadata in entries:
            if error is not None:
                raise errors.from_body(error)
            if offset != NO_OFFSET:
                return Decision.parse(offset, metadata)
        return None

    async def record(
        self, batch_id: int, transactions: Iterable[PreparedTransaction], query_id: str | None = None
    ) -> Decision:
        """Durably records that the batch commits with exactly these transactions, if no decision
        for it (or a later batch) is recorded yet: the first writer wins. Safe to repeat: the very
        record already there is answered as written. Raises OffsetNotAdvancedError when another
        decision is recorded for this batch or a later one (read() says which), nothing written."""
        decision = Decision(batch_id, tuple(PreparedTransaction(*t) for t in transactions), query_id)
        metadata = decision.metadata()
        if len(metadata) > MAX_METADATA_CHARS:
            raise SinkStateError(
                f"batch {batch_id} has {len(decision.transactions)} transactions: more than one "
                f"decision record holds ({len(metadata)} > {MAX_METADATA_CHARS} characters); "
                f"write with fewer tasks (coalesce())"
            )
        for error in await self._call(
            f"recording the decision for batch {batch_id}",
            "commit",
            {
                "member_id": "",
                "generation_id": -1,
                "offsets": [{"topic": self._topic, "partition": 0, "offset": batch_id, "metadata": metadata}],
                "require_advance": True,
            },
            offset_errors,
        ):
            if error is not None:
                raise errors.from_body(error)
        return decision

    async def record_or_read(
        self, batch_id: int, transactions: Iterable[PreparedTransaction], query_id: str | None = None
    ) -> Decision | None:
        """record(); or, refused because another decision was recorded first, that one (read()):
        the first writer wins, and its decision is the outcome."""
        try:
            return await self.record(batch_id, transactions, query_id)
        except errors.OffsetNotAdvancedError:
            return await self.read()


def _committed_entries(answer: dict) -> list[tuple[dict | None, int, str | None]]:
    """(error, offset, metadata) of each partition of an OffsetFetch answer."""
    return [(entry["error"], entry["offset"], entry.get("metadata")) for entry in answer["offsets"]]
