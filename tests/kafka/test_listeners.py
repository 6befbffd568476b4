"""Several Kafka listeners on one node, each with its own security protocol (`--kafka-listener
PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9094`): each serves its protocol, a PLAINTEXT one with
`--auth required` as the principal ANONYMOUS that the ACLs judge, Metadata answered on a listener
gives that listener's address, and the settings a node must not start with are refused at start."""

from __future__ import annotations

import asyncio
import datetime
import ssl
import subprocess
import sys
import time

import pytest
from confluent_kafka import KafkaError as ConfluentError
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from kio.schema.errors import ErrorCode as KafkaError

from app.cli import listening_refusal
from app.kafka import api_table
from app.runtime.listening_sockets import bound_accepting_socket
from app.settings import Settings
from app.storage import database, node_presence
from app.storage.node_presence import LiveNode
from tests.api.test_tls import NEEDS_OPENSSL
from tests.conftest import (
    REPO_ROOT,
    start_in_process_server,
    start_server_on_fresh_database,
    stop_in_process_server,
)
from tests.kafka.clients import WAIT_S, ConfluentKafka
from tests.kafka.raw import RawConnection, request_of
from tests.kafka.test_nodes import metadata_brokers
from tests.kafka.test_security import (
    ADMIN_TOKEN,
    admin_client,
    confluent_security,
    metadata,
    new_principal,
    reader_and_writer,
    rule,
)
from tests.kafka.test_security_tls import certificate  # noqa: F401  (the module's fixture, shared)
from tests.kafka.test_serve import _listening_sockets as listening_sockets

pytestmark = NEEDS_OPENSSL

TOPIC = "two-doors"
ANONYMOUS = "ANONYMOUS"


@pytest.fixture(scope="module")
def two_listeners(postgres, certificate):  # noqa: F811
    """A node with auth required and two listeners: PLAINTEXT (its clients anonymous) and SASL_SSL."""
    cert, key = certificate
    server = start_server_on_fresh_database(
        postgres,
        "kafka_listeners",
        kafka_listener="PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        auth="required",
        admin_token=ADMIN_TOKEN,
        ssl_certfile=cert,
        ssl_keyfile=key,
    )
    with admin_client(server) as admin:
        admin.post("/v1/topics", json={"name": TOPIC, "partitions": 1, "config": {}}).raise_for_status()
    yield server
    stop_in_process_server(server)


def listener(server, protocol: str) -> str:
    return server.extra["kafka_listeners"][protocol]


def tls_connection(address: str, cert) -> RawConnection:
    connection = RawConnection(address)
    context = ssl.create_default_context(cafile=str(cert))
    connection.sock = context.wrap_socket(connection.sock, server_hostname="127.0.0.1")
    return connection


def test_each_listener_serves_its_protocol_to_confluent_kafka(two_listeners, certificate):  # noqa: F811
    with admin_client(two_listeners) as admin:
        for acl in reader_and_writer(TOPIC):
            admin.post("/v1/acls", json={"principal": ANONYMOUS, **acl}).raise_for_status()
    plaintext = {"bootstrap.servers": listener(two_listeners, "PLAINTEXT")}
    ConfluentKafka().produce(two_listeners, TOPIC, [{"value": b"anonymous"}], **plaintext)
    username = "through-sasl-ssl"
    _, api_key = new_principal(two_listeners, username, *reader_and_writer(TOPIC))
    sasl_ssl = {
        "bootstrap.servers": listener(two_listeners, "SASL_SSL"),
        **confluent_security(
            username, api_key, **{"security.protocol": "SASL_SSL", "ssl.ca.location": str(certificate[0])}
        ),
    }
    ConfluentKafka().produce(two_listeners, TOPIC, [{"value": b"authenticated"}], **sasl_ssl)
    group = {"group.id": "sasl-listeners"}
    for config in (plaintext, sasl_ssl):
        received = ConfluentKafka().consume(two_listeners, TOPIC, 0, 2, **config, **group)
        assert [record.value for record in received] == [b"anonymous", b"authenticated"]


def test_the_plaintext_listener_is_anonymous_judged_by_the_acls(two_listeners):
    topic = "anonymous-judged"
    with admin_client(two_listeners) as admin:
        admin.post("/v1/topics", json={"name": topic, "partitions": 1, "config": {}}).raise_for_status()
    with RawConnection(listener(two_listeners, "PLAINTEXT")) as connection:
        # No SASL on it: a client configured for SASL is told so, as Kafka's PLAINTEXT listener tells it.
        handshake = connection.call(request_of(api_table.SASL_HANDSHAKE, 1, mechanism="PLAIN"))
        assert handshake.error_code == KafkaError.illegal_sasl_state
        # ANONYMOUS is no super user: allowed nothing until a rule names it (or every principal).
        [answer] = metadata(connection, topic).topics
        assert answer.error_code == KafkaError.topic_authorization_failed
        with admin_client(two_listeners) as admin:
            admin.post("/v1/acls", json={"principal": ANONYMOUS, **rule("Topic", topic, "Describe")}).raise_for_status()
        [answer] = metadata(connection, topic).topics  # the rule applies to the open connection's next request
        assert answer.error_code == KafkaError.none
    admin = AdminClient({"bootstrap.servers": listener(two_listeners, "PLAINTEXT")})
    with pytest.raises(KafkaException) as refused:
        admin.create_topics([NewTopic("made-by-anonymous", 1)])["made-by-anonymous"].result(WAIT_S)
    assert refused.value.args[0].code() in (
        ConfluentError.TOPIC_AUTHORIZATION_FAILED,
        ConfluentError.CLUSTER_AUTHORIZATION_FAILED,
    )


def _idempotent_producer_id(connection: RawConnection) -> KafkaError:
    """The error of an InitProducerId without a transactional id (an idempotent producer's)."""
    return connection.call(
        request_of(
            api_table.INIT_PRODUCER_ID,
            4,
            transactional_id=None,
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=-1,
            producer_epoch=-1,
        )
    ).error_code


def test_anonymous_is_an_idempotent_producer_only_with_write_on_some_topic(postgres):
    """Kafka's InitProducerId rule (IdempotentWrite on the Cluster or Write on any topic) for the
    principal a listener without SASL serves: with no rule, it is allowed nothing, not even a
    producer id (a row each, for anyone who reaches the listener)."""
    server = start_server_on_fresh_database(
        postgres,
        "kafka_anonymous_producer_ids",
        kafka_listener="PLAINTEXT://127.0.0.1:0",
        auth="required",
        admin_token=ADMIN_TOKEN,
    )
    try:
        with RawConnection(listener(server, "PLAINTEXT")) as connection:
            assert _idempotent_producer_id(connection) == KafkaError.cluster_authorization_failed
            with admin_client(server) as admin:
                admin.post(
                    "/v1/acls", json={"principal": ANONYMOUS, **rule("Topic", "readable", "Read")}
                ).raise_for_status()
            assert _idempotent_producer_id(connection) == KafkaError.cluster_authorization_failed
            with admin_client(server) as admin:
                admin.post(
                    "/v1/acls", json={"principal": ANONYMOUS, **rule("Topic", "writable", "Write")}
                ).raise_for_status()
            assert _idempotent_producer_id(connection) == KafkaError.none
    finally:
        stop_in_process_server(server)


def test_a_prefix_allowed_is_some_topic_though_the_prefix_itself_is_denied(postgres):
    """Kafka's authorizeByResourceType for InitProducerId: Write allowed on the prefix 'written-' is
    Write on some topic ('written-x') even with a rule denying the topic named 'written-' itself;
    denied on the prefix 'written' (every such topic), it is none."""
    server = start_server_on_fresh_database(
        postgres,
        "kafka_anonymous_prefixed_write",
        kafka_listener="PLAINTEXT://127.0.0.1:0",
        auth="required",
        admin_token=ADMIN_TOKEN,
    )
    try:
        with RawConnection(listener(server, "PLAINTEXT")) as connection, admin_client(server) as admin:
            for acl in (
                rule("Topic", "written-", "Write", "prefixed"),
                {**rule("Topic", "written-", "Write"), "permission": "deny"},
            ):
                admin.post("/v1/acls", json={"principal": ANONYMOUS, **acl}).raise_for_status()
            assert _idempotent_producer_id(connection) == KafkaError.none
            denied = {**rule("Topic", "written", "Write", "prefixed"), "permission": "deny"}
            admin.post("/v1/acls", json={"principal": ANONYMOUS, **denied}).raise_for_status()
            assert _idempotent_producer_id(connection) == KafkaError.cluster_authorization_failed
    finally:
        stop_in_process_server(server)


def _cluster_operations(connection: RawConnection) -> int:
    return connection.call(
        request_of(api_table.DESCRIBE_CLUSTER, 1, include_cluster_authorized_operations=True, endpoint_type=1)
    ).cluster_authorized_operations


def test_anonymous_is_told_idempotent_write_only_when_init_producer_id_would_grant_it(postgres):
    """DescribeCluster's authorized operations say what InitProducerId does: ANONYMOUS's
    IdempotentWrite only with Write on some topic (every authenticated principal's always)."""
    server = start_server_on_fresh_database(
        postgres,
        "kafka_anonymous_cluster_operations",
        kafka_listener="PLAINTEXT://127.0.0.1:0",
        auth="required",
        admin_token=ADMIN_TOKEN,
    )
    describe, describe_configs, idempotent_write = 8, 10, 12
    try:
        with RawConnection(listener(server, "PLAINTEXT")) as connection, admin_client(server) as admin:
            admin.post(
                "/v1/acls", json={"principal": ANONYMOUS, **rule("Cluster", "txbroker-cluster", "Describe")}
            ).raise_for_status()
            assert _cluster_operations(connection) == (1 << describe) | (1 << describe_configs)
            assert _idempotent_producer_id(connection) == KafkaError.cluster_authorization_failed
            admin.post(
                "/v1/acls", json={"principal": ANONYMOUS, **rule("Topic", "writable", "Write")}
            ).raise_for_status()
            assert _cluster_operations(connection) == (1 << describe) | (1 << describe_configs) | (
                1 << idempotent_write
            )
            assert _idempotent_producer_id(connection) == KafkaError.none
    finally:
        stop_in_process_server(server)


def _brokers(connection: RawConnection) -> list[tuple[int, str, int]]:
    return [(broker.node_id, broker.host, broker.port) for broker in metadata_brokers(connection)]


def test_metadata_on_each_listener_gives_that_listeners_address(two_listeners, certificate):  # noqa: F811
    plaintext_host, plaintext_port = listener(two_listeners, "PLAINTEXT").rsplit(":", 1)
    with RawConnection(listener(two_listeners, "PLAINTEXT")) as connection:
        assert _brokers(connection) == [(0, plaintext_host, int(plaintext_port))]
    username = "metadata-over-sasl-ssl"
    _, api_key = new_principal(two_listeners, username)
    sasl_host, sasl_port = listener(two_listeners, "SASL_SSL").rsplit(":", 1)
    assert sasl_port != plaintext_port
    with tls_connection(listener(two_listeners, "SASL_SSL"), certificate[0]) as connection:
        assert connection.call(request_of(api_table.SASL_HANDSHAKE, 1, mechanism="PLAIN")).error_code == 0
        logged_in = connection.call(
            request_of(api_table.SASL_AUTHENTICATE, 2, auth_bytes=f"\0{username}\0{api_key}".encode())
        )
        assert logged_in.error_code == KafkaError.none
        assert _brokers(connection) == [(0, sasl_host, int(sasl_port))]


# ---- what `serve` refuses to start with


def _refusal(**settings) -> str | None:
    return listening_refusal(Settings(**settings), None)


def test_listener_lists_are_read_and_checked_at_start(tmp_path):
    cert = tmp_path / "cert.pem"  # only its being set matters to the checks
    tls = {"ssl_certfile": cert, "ssl_keyfile": cert}
    both = "PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9094"
    assert _refusal(kafka_listener=both, auth="required", **tls) is None
    assert _refusal(kafka_listener="PLAINTEXT://127.0.0.1:9092,SSL://[::1]:9093", **tls) is None
    # A bare item's protocol is the server-wide one: two SASL_PLAINTEXT listeners with auth required.
    refusal = _refusal(kafka_listener="127.0.0.1:9092,SASL_PLAINTEXT://127.0.0.1:9093", auth="required")
    assert "two SASL_PLAINTEXT listeners" in refusal and "at most one per security protocol" in refusal
    refusal = _refusal(kafka_listener="PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.2:9092", **tls)
    assert "share port 9092" in refusal
    refusal = _refusal(kafka_listener="PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093")
    assert "SSL://127.0.0.1:9093 speaks TLS, which needs the server's certificate" in refusal
    assert "--ssl-certfile" in refusal
    refusal = _refusal(kafka_listener="SASL_PLAINTEXT://127.0.0.1:9093")
    assert "SASL_PLAINTEXT://127.0.0.1:9093 authenticates clients with SASL, which needs --auth required" in refusal
    refusal = _refusal(kafka_listener="EXTERNAL://127.0.0.1:9093")
    assert "names the security protocol 'EXTERNAL'" in refusal and "PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL" in refusal
    refusal = _refusal(kafka_listener="PLAINTEXT://127.0.0.1:9092", kafka_advertised_listener="SSL://example.com:9093")
    assert "SSL://example.com:9093 names no listener of this node" in refusal
    refusal = _refusal(kafka_listener="PLAINTEXT://127.0.0.1:9092", kafka_advertised_listener="a:1,b:2")
    assert "its item 2 (b:2) has no listener at that position" in refusal


def test_an_unauthenticated_listener_binds_loopback_only_whatever_auth_says():
    # With auth required a PLAINTEXT listener's clients are anonymous all the same: loopback only,
    # as any listener without authentication, unless waived.
    settings = {"kafka_listener": "PLAINTEXT://0.0.0.0:9092,SASL_PLAINTEXT://0.0.0.0:9093", "auth": "required"}
    refusal = _refusal(**settings)
    assert "refusing to open the PLAINTEXT Kafka listener on 0.0.0.0" in refusal
    assert "principal ANONYMOUS" in refusal and "--allow-anonymous" in refusal
    assert _refusal(**settings, allow_anonymous=True) is None
    assert _refusal(kafka_listener="PLAINTEXT://127.0.0.1:9092,SASL_PLAINTEXT://0.0.0.0:9093", auth="required") is None


def test_serve_refuses_an_ssl_listener_without_the_certificate(database_url):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.cli",
            "serve",
            "--kafka-listener",
            "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
            "--database-url",
            database_url,
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "SSL://127.0.0.1:0 speaks TLS, which needs the server's certificate" in result.stderr


def test_every_worker_serves_every_listener(server_process, database_url):
    # Ports of our own, held as `serve` holds its Kafka ports (tests/kafka/test_serve.py says how).
    with bound_accepting_socket("127.0.0.1", 0) as plaintext, bound_accepting_socket("127.0.0.1", 0) as sasl:
        ports = {"PLAINTEXT": plaintext.getsockname()[1], "SASL_PLAINTEXT": sasl.getsockname()[1]}
        server_process(
            "--database-url",
            database_url,
            "--workers",
            "2",
            "--auth",
            "required",
            "--kafka-listener",
            ",".join(f"{protocol}://127.0.0.1:{port}" for protocol, port in ports.items()),
            "--kafka-advertised-listener",
            f"SASL_PLAINTEXT://localhost:{ports['SASL_PLAINTEXT']}",
        )
        for port in ports.values():
            assert listening_sockets(port) == 2, "each worker listens on each listener's port"
        with RawConnection(f"127.0.0.1:{ports['PLAINTEXT']}") as connection:
            assert _brokers(connection) == [(0, "127.0.0.1", ports["PLAINTEXT"])]
        with RawConnection(f"127.0.0.1:{ports['SASL_PLAINTEXT']}") as connection:
            assert connection.call(request_of(api_table.SASL_HANDSHAKE, 1, mechanism="PLAIN")).error_code == 0


# ---- several nodes: each answers, on a listener, every node's address of that listener's protocol


@pytest.fixture(scope="module")
def three_nodes(postgres):
    """Nodes 1 and 2 with a PLAINTEXT and a SASL_PLAINTEXT listener each, node 3 with PLAINTEXT only,
    on one database, auth required."""
    both = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0"
    first = start_server_on_fresh_database(
        postgres, "kafka_listeners_nodes", kafka_listener=both, auth="required", admin_token=ADMIN_TOKEN, node_id=1
    )
    others = [
        start_in_process_server(
            first.database_url, kafka_listener=listeners, auth="required", admin_token=ADMIN_TOKEN, node_id=node_id
        )
        for node_id, listeners in ((2, both), (3, "PLAINTEXT://127.0.0.1:0"))
    ]
    yield [first, *others]
    for server in [*others, first]:
        stop_in_process_server(server)


def _sasl_connection(address: str) -> RawConnection:
    """A connection to a SASL_PLAINTEXT listener, logged in as the admin principal."""
    connection = RawConnection(address)
    assert connection.call(request_of(api_table.SASL_HANDSHAKE, 1, mechanism="PLAIN")).error_code == 0
    logged_in = connection.call(
        request_of(api_table.SASL_AUTHENTICATE, 2, auth_bytes=f"\0admin\0{ADMIN_TOKEN}".encode())
    )
    assert logged_in.error_code == KafkaError.none
    return connection


def _addresses(server, protocol: str) -> tuple[int, str, int]:
    host, port = listener(server, protocol).rsplit(":", 1)
    return server.settings.node_id, host, int(port)


def test_each_listener_lists_every_nodes_address_of_its_protocol(three_nodes):
    plaintext = sorted(_addresses(server, "PLAINTEXT") for server in three_nodes)
    sasl = sorted(_addresses(server, "SASL_PLAINTEXT") for server in three_nodes[:2])
    deadline = time.monotonic() + WAIT_S
    for server in three_nodes:
        with RawConnection(listener(server, "PLAINTEXT")) as connection:
            while sorted(_brokers(connection)) != plaintext:  # each node sees the others once announced
                assert time.monotonic() < deadline, f"PLAINTEXT brokers {_brokers(connection)}, expected {plaintext}"
    # Node 3 has no SASL_PLAINTEXT listener: left out of that listener's answers, as Kafka leaves out a
    # broker without the listener, and never named a leader there (its clients could not reach it).
    topic = "led-over-sasl"
    with admin_client(three_nodes[0]) as admin:
        admin.post("/v1/topics", json={"name": topic, "partitions": 12, "config": {}}).raise_for_status()
    for server in three_nodes[:2]:
        with _sasl_connection(listener(server, "SASL_PLAINTEXT")) as connection:
            assert sorted(_brokers(connection)) == sasl
            [answer] = metadata(connection, topic).topics
            assert {partition.leader_id for partition in answer.partitions} == {1, 2}
            coordinator = connection.call(
                request_of(api_table.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=("a-group", "b-group"))
            )
            for found in coordinator.coordinators:
                assert (found.node_id, found.host, found.port) in sasl


def test_describe_configs_gives_every_listener(two_listeners, certificate):  # noqa: F811
    admin = AdminClient(
        {
            "bootstrap.servers": listener(two_listeners, "SASL_SSL"),
            **confluent_security(
                "admin", ADMIN_TOKEN, **{"security.protocol": "SASL_SSL", "ssl.ca.location": str(certificate[0])}
            ),
        }
    )
    broker = ConfigResource(ResourceType.BROKER, "0")
    configs = admin.describe_configs([broker])[broker].result(WAIT_S)
    expected = ",".join(f"{protocol}://{listener(two_listeners, protocol)}" for protocol in ("PLAINTEXT", "SASL_SSL"))
    assert configs["advertised.listeners"].value == expected
    assert [item.split("://")[0] for item in configs["listeners"].value.split(",")] == ["PLAINTEXT", "SASL_SSL"]


def test_a_node_of_the_version_before_is_listed_on_every_listener(three_nodes):
    # A node of the version before announces its one address and writes no listeners (a rolling
    # upgrade): listed at that address on every listener, as every node was before.
    old_node = LiveNode(9, "127.0.0.1", 19092)

    async def announce_and_list() -> tuple[list, list]:
        connection = await database.connect(three_nodes[0].database_url)
        try:
            assert await node_presence.announce(connection, old_node)
            found = []
            for protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
                opener = RawConnection if protocol == "PLAINTEXT" else _sasl_connection
                with opener(listener(three_nodes[0], protocol)) as kafka:
                    found.append(await asyncio.to_thread(_brokers, kafka))
            return found
        finally:
            await connection.close()

    for brokers in asyncio.run(announce_and_list()):
        assert (9, "127.0.0.1", 19092) in brokers
