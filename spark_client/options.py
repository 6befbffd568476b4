"""The data source's options (spark_client's docstring lists them), parsed and checked once on the
driver, when Spark asks for a reader or writer, into frozen values that Spark pickles to the tasks.

Spark hands options over as strings in a case-insensitive map; every check here names the option,
what it received and what it accepts, so a misconfigured query fails at planning, not in a task.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

from spark_client.faults import Faults
from txbroker.producer import DEFAULT_DELIVERY_TIMEOUT_MS, DEFAULT_LINGER_MS, delivery_timeout
from txbroker.wire import ISOLATION_LEVELS

EARLIEST, LATEST = -2, -1  # ListOffsets' timestamps, and Kafka's per-partition offsets JSON
SINK_ID = re.compile(r"[A-Za-z0-9._-]{1,200}")
DEFAULT_TRANSACTION_TIMEOUT_MS = 600_000
# The SDK producer's defaults. delivery_timeout_ms (DEFAULT_DELIVERY_TIMEOUT_MS, or linger_ms +
# request_timeout_ms if larger) is also how long a task keeps calling prepare_transaction() again
# while a slow server makes it time out (see commit_protocol).
DEFAULT_MAX_BLOCK_MS = 60_000
# How long the driver's calls (the decision, the commits, the sweep) and a task's reads of the
# decision retry a server that does not answer (down, restarting, its PostgreSQL away).
DEFAULT_COMMIT_TIMEOUT_MS = 120_000
DEFAULT_MAX_RECORDS_PER_FETCH = 10_000


class OptionError(ValueError):
    """A missing or invalid option of the txbroker data source."""


@dataclass(frozen=True)
class ConnectionOptions:
    url: str
    token: str | None = None
    request_timeout_ms: int = 30_000

    @property
    def client_config(self) -> dict:
        """Keyword arguments for the SDK's clients. A plain-HTTP server gets a transport without TLS
        settings: httpx builds its default SSL context (loading the CA bundle) for every client,
        and a task makes several clients."""
        config: dict = {"token": self.token, "request_timeout_ms": self.request_timeout_ms}
        if self.url.startswith("http://"):
            config["transport"] = httpx.AsyncHTTPTransport(verify=False)
        return config


@dataclass(frozen=True)
class ReadOptions:
    connection: ConnectionOptions
    topic: str
    isolation_level: str = "read_committed"
    # "earliest" / "latest", or {partition: offset} (EARLIEST/LATEST allowed as values)
    starting_offsets: str | Mapping[int, int] = "earliest"
    ending_offsets: str | Mapping[int, int] = "latest"
    max_records_per_trigger: int | None = None
    binary: bool = False
    max_records_per_fetch: int = DEFAULT_MAX_RECORDS_PER_FETCH
    # Offsets of a planned range that are gone when it is read (retention, DeleteRecords): fail
    # the task (Kafka's source's failOnDataLoss), or skip them.
    fail_on_data_loss: bool = True


@dataclass(frozen=True)
class WriteOptions:
    connection: ConnectionOptions
    topic: str
    sink_id: str | None = None
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS
    faults: Faults = field(default_factory=Faults)
    delivery_timeout_ms: int = DEFAULT_DELIVERY_TIMEOUT_MS
    max_block_ms: int = DEFAULT_MAX_BLOCK_MS
    commit_timeout_ms: int = DEFAULT_COMMIT_TIMEOUT_MS

    @property
    def producer_config(self) -> dict:
        """Keyword arguments for a task's Producer."""
        return {
            "transaction_timeout_ms": self.transaction_timeout_ms,
            "delivery_timeout_ms": self.delivery_timeout_ms,
            "max_block_ms": self.max_block_ms,
            **self.connection.client_config,
        }


def _delivery_timeout_ms(options: dict[str, str], request_timeout_ms: int) -> int:
    """The tasks' producers' delivery_timeout_ms, checked here as the SDK's producer checks it
    (at least linger_ms + request_timeout_ms; not given, the default or that sum if larger), so
    that a job with a request_timeout_ms above the default delivery timeout neither fails in every
    task nor needs both options: the driver refuses a given one that is too short, before any task."""
    given = _int(options, "delivery_timeout_ms", None)
    try:
        return int(delivery_timeout(given, DEFAULT_LINGER_MS, request_timeout_ms))
    except ValueError as error:
        raise OptionError(f"option 'delivery_timeout_ms': {error}") from None


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(key).lower(): value for key, value in options.items()}


def _required(options: dict[str, str], name: str, hint: str) -> str:
    value = options.get(name.lower())
    if value is None or not str(value).strip():
        raise OptionError(f"the txbroker data source needs the option {name!r}: {hint}")
    return str(value).strip()


def _int(options: dict[str, str], name: str, default: int | None, minimum: int = 1) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {name!r} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise OptionError(f"option {name!r} must be at least {minimum}, not {value}")
    return value


def _bool(options: dict[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text not in ("true", "false"):
        raise OptionError(f"option {name!r} must be 'true' or 'false', not {raw!r}")
    return text == "true"


def connection_options(options: Mapping[str, str]) -> ConnectionOptions:
    lowered = _lower(options)
    url = _required(lowered, "url", "the txbroker server, e.g. .option('url', 'http://127.0.0.1:8080')")
    if not url.startswith(("http://", "https://")):
        raise OptionError(f"option 'url' must be an http:// or https:// URL, not {url!r}")
    return ConnectionOptions(url.rstrip("/"), lowered.get("token") or None, _int(lowered, "request_timeout_ms", 30_000))


def _offsets(
    options: dict[str, str], name: str, topic: str, default: str, allowed: tuple[str, ...]
) -> str | dict[int, int]:
    raw = options.get(name.lower())
    if raw is None:
        return default
    text = str(raw).strip()
    if text in allowed:
        return text
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    # Kafka's form {"topic": {"0": 23, "1": -2}}, or {"0": 23} for the one topic.
    if isinstance(parsed, dict) and set(parsed) == {topic} and isinstance(parsed[topic], dict):
        parsed = parsed[topic]
    offsets = (
        # JSON integers only: int() would take 1.5 as 1 and true as 1, and fail on 1e400 (inf)
        {int(p): o for p, o in parsed.items() if p.strip().isdecimal() and type(o) is int}
        if isinstance(parsed, dict)
        else None
    )
    if offsets is not None and len(offsets) != len(parsed):
        offsets = None
    if offsets is None or any(p < 0 or o < EARLIEST for p, o in offsets.items()):
        raise OptionError(
            f"option {name!r} must be one of {list(allowed)} or a JSON object of partition -> "
            f'offset (-2 earliest, -1 latest) such as \'{{"{topic}": {{"0": 42}}}}\', not {raw!r}'
        )
    return offsets


def read_options(options: Mapping[str, str], streaming: bool) -> ReadOptions:
    lowered = _lower(options)
    topic = _required(lowered, "topic", "the topic to read")
    isolation = lowered.get("isolation_level", "read_committed").strip()
    if isolation not in ISOLATION_LEVELS:
        raise OptionError(f"option 'isolation_level' must be one of {list(ISOLATION_LEVELS)}, not {isolation!r}")
    starting = _offsets(
        lowered, "startingOffsets", topic, "latest" if streaming else "earliest", ("earliest", "latest")
    )
    if streaming and "endingoffsets" in lowered:
        raise OptionError("option 'endingOffsets' is for batch reads (spark.read); a stream has no end")
    ending = _offsets(lowered, "endingOffsets", topic, "latest", ("latest",))
    if not streaming and "maxrecordspertrigger" in lowered:
        raise OptionError("option 'maxRecordsPerTrigger' is for streaming reads (spark.readStream)")
    return ReadOptions(
        connection_options(options),
        topic,
        isolation,
        starting,
        ending,
        _int(lowered, "maxRecordsPerTrigger", None),
        _bool(lowered, "binary", False),
        _int(lowered, "max_records_per_fetch", DEFAULT_MAX_RECORDS_PER_FETCH),
        _bool(lowered, "failOnDataLoss", True),
    )


def write_options(options: Mapping[str, str], streaming: bool) -> WriteOptions:
    lowered = _lower(options)
    topic = _required(lowered, "topic", "the topic to write")
    sink_id = lowered.get("sink_id")
    if streaming and not sink_id:
        raise OptionError(
            "a streaming write needs the option 'sink_id': a name for this query's output, stable across "
            "restarts from its checkpoint (e.g. 'orders-enricher'), under which the sink records which "
            "transactions each micro-batch committed"
        )
    sink_id = (sink_id or "batch").strip()
    if not SINK_ID.fullmatch(sink_id):
        raise OptionError(f"option 'sink_id' must match {SINK_ID.pattern}, not {sink_id!r}")
    connection = connection_options(options)
    return WriteOptions(
        connection,
        topic,
        sink_id,
        _int(lowered, "transaction_timeout_ms", DEFAULT_TRANSACTION_TIMEOUT_MS),
        Faults.parse(lowered.get("_test_faults")),
        _delivery_timeout_ms(lowered, connection.request_timeout_ms),
        _int(lowered, "max_block_ms", DEFAULT_MAX_BLOCK_MS),
        _int(lowered, "commit_timeout_ms", DEFAULT_COMMIT_TIMEOUT_MS),
    )
