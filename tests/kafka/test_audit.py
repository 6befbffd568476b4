"""The audit log (`GET /v1/audit`, app/coordinator/audit.py) names the principal of every
administrative action and the door it came through, whichever door that was: HTTP, Kafka's admin
APIs (confluent-kafka's AdminClient over SASL) or the console; `server` for what a node does itself
at start. Before, an entry named the principal alone, and an ACL deleted over Kafka's DeleteAcls was
told from one deleted over HTTP by nothing. Each entry also names the client's address, the peer of
the connection its door served it on (which machine deleted the topic), as Kafka's authorizer log
names a decision's client host."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
from urllib.parse import urlsplit

import asyncpg
import httpx
import psutil
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from tests.api.test_log_lifecycle import delete_records, log_start, produce
from tests.api.test_review_fixes import _make_audit_fail, init_transactional, txn_state
from tests.console.abort_form import abort_from_the_console
from tests.kafka.clients import WAIT_S
from tests.kafka.test_security import confluent_config

ADMIN_TOKEN = "audit-admin-token"


@pytest.fixture
def secured(make_server):
    return make_server(kafka_listener="127.0.0.1:0", auth="required", admin_token=ADMIN_TOKEN)


@pytest.fixture
def admin(secured):
    with httpx.Client(base_url=secured.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30) as client:
        yield client


def audited(admin: httpx.Client) -> list[tuple]:
    """(principal, source, action, resource, details) of each entry, oldest first."""
    entries = admin.get("/v1/audit", params={"limit": 1000}).json()["entries"]
    return [(e["principal"], e.get("source"), e["action"], e["resource"], e["details"]) for e in reversed(entries)]


def test_kafkas_admin_apis_are_audited_as_the_kafka_doors(secured, admin):
    kafka = AdminClient(confluent_config(secured.extra["kafka_bootstrap"], "admin", ADMIN_TOKEN))
    admin.post("/v1/principals", json={"name": "app"}).raise_for_status()
    before = len(audited(admin))

    kafka.create_topics([NewTopic("audited", 1)])["audited"].result(WAIT_S)
    resource = ConfigResource(ConfigResource.Type.TOPIC, "audited")
    kafka.incremental_alter_configs(
        [
            ConfigResource(
                ConfigResource.Type.TOPIC,
                "audited",
                incremental_configs=[
                    ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET),
                    ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
                    ConfigEntry("segment.ms", None, incremental_operation=AlterConfigOpType.DELETE),
                ],
            )
        ]
    )[resource].result(WAIT_S)
    kafka.create_partitions([NewPartitions("audited", 2)])["audited"].result(WAIT_S)
    [deleted] = kafka.delete_records([TopicPartition("audited", 1, 0)]).values()
    assert deleted.result(WAIT_S).low_watermark == 0
    binding = AclBinding(
        ResourceType.TOPIC,
        "audited",
        ResourcePatternType.LITERAL,
        "User:app",
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    [created] = kafka.create_acls([binding]).values()
    assert created.result(WAIT_S) is None
    of_app = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, "User:app", None, AclOperation.ANY, AclPermissionType.ANY
    )
    [removed] = kafka.delete_acls([of_app]).values()
    assert removed.result(WAIT_S) == [binding]
    kafka.delete_topics(["audited"])["audited"].result(WAIT_S)

    entries = audited(admin)[before:]
    assert [(principal, source, action, resource) for principal, source, action, resource, _ in entries] == [
        ("admin", "kafka", "create topic", "audited"),
        ("admin", "kafka", "alter topic config", "audited"),
        ("admin", "kafka", "create partitions", "audited"),
        ("admin", "kafka", "delete records", "audited"),
        ("admin", "kafka", "add acl", "Topic:audited"),
        ("admin", "kafka", "remove acl", "Topic:audited"),
        ("admin", "kafka", "delete topic", "audited"),
    ]
    # Kafka's operations by what they did, not by their numbers (SET 0, DELETE 1, APPEND 2).
    assert entries[1][4] == "retention.ms=60000, cleanup.policy+=compact, segment.ms back to its default"
    # A removed rule is named as its creation was: the rule is gone, its entry is what is left of it.
    assert entries[5][4] == entries[4][4], entries[4:6]
    assert re.fullmatch(r"allow Read for app \(literal\), rule \d+", entries[5][4]), entries[5]


def test_https_and_the_consoles_actions_are_audited_as_theirs(secured, admin):
    admin.post("/v1/topics", json={"name": "kept", "partitions": 1}).raise_for_status()
    admin.post(
        "/v1/acls",
        json={"principal": "app", "resource_type": "Topic", "resource_name": "kept", "operation": "Write"},
    ).raise_for_status()
    for transactional_id in ("aborted-over-http", "aborted-in-the-console"):
        producer = init_transactional(admin, transactional_id)
        admin.post(
            "/v1/txn/add-partitions", json={**producer, "partitions": [{"topic": "kept", "partition": 0}]}
        ).raise_for_status()
    admin.post("/v1/transactions/aborted-over-http/abort").raise_for_status()
    aborted = abort_from_the_console(admin, secured.url, "aborted-in-the-console")
    assert aborted.status_code == 303, aborted.text
    assert txn_state(admin, "aborted-in-the-console") == "CompleteAbort"

    assert [(principal, source, action, resource) for principal, source, action, resource, _ in audited(admin)] == [
        ("admin", "server", "install bootstrap key (admin_token)", "admin"),
        ("admin", "http", "create topic", "kept"),
        ("admin", "http", "add acl", "Topic:kept"),
        ("admin", "http", "abort transaction", "aborted-over-http"),
        ("admin", "console", "abort transaction", "aborted-in-the-console"),
    ]


# ---- the client's address: the peer of the connection each door served the action on


def test_each_entry_names_the_address_its_door_saw_the_client_at(secured, admin):
    """HTTP's and the console's TCP peer, the Kafka connection's: 127.0.0.1 and the port the client's
    OS chose, each its own (what Kafka's authorizer log names as the client's host); none for what
    the node did itself at start."""
    status, http_port = post_from_a_port_of_our_own(secured.url, "/v1/topics", {"name": "over-http", "partitions": 1})
    assert status == 201

    kafka = AdminClient(confluent_config(secured.extra["kafka_bootstrap"], "admin", ADMIN_TOKEN))
    kafka.create_topics([NewTopic("over-kafka", 1)])["over-kafka"].result(WAIT_S)
    kafka_ports = ports_connected_to(secured.extra["kafka_bootstrap"])  # the AdminClient's, still open

    producer = init_transactional(admin, "aborted-in-the-console")
    admin.post(
        "/v1/txn/add-partitions", json={**producer, "partitions": [{"topic": "over-http", "partition": 0}]}
    ).raise_for_status()
    assert abort_from_the_console(admin, secured.url, "aborted-in-the-console").status_code == 303
    console_ports = ports_connected_to(secured.url)  # the httpx client's kept-alive connection

    entries = {(e["source"], e["action"]): e["client_address"] for e in entries_of(admin)}
    assert entries[("server", "install bootstrap key (admin_token)")] is None
    assert entries[("http", "create topic")] == f"127.0.0.1:{http_port}"
    host, kafka_port = entries[("kafka", "create topic")].split(":")
    assert host == "127.0.0.1" and int(kafka_port) in kafka_ports and int(kafka_port) != http_port, (
        entries,
        kafka_ports,
    )
    host, console_port = entries[("console", "abort transaction")].split(":")
    assert host == "127.0.0.1" and int(console_port) in console_ports, (entries, console_ports)


def test_a_forwarded_for_header_is_not_taken_for_the_clients_address(server_process, database_url):
    """X-Forwarded-For is any client's to write: `txbroker serve` names no proxy it trusts (uvicorn
    by default believes one from 127.0.0.1, so any program on the node's machine could put any
    address in the audit log). The entry names the TCP peer; behind a reverse proxy, the proxy."""
    node = server_process(
        "--database-url", database_url, env={"TXBROKER_AUTH": "required", "TXBROKER_ADMIN_TOKEN": ADMIN_TOKEN}
    )
    status, client_port = post_from_a_port_of_our_own(
        node.url,
        "/v1/topics",
        {"name": "forwarded", "partitions": 1},
        {"X-Forwarded-For": "203.0.113.7", "X-Forwarded-Proto": "https", "Forwarded": "for=203.0.113.7"},
    )
    assert status == 201
    with httpx.Client(base_url=node.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30) as client:
        [created] = [e for e in entries_of(client) if e["action"] == "create topic"]
    assert created["client_address"] == f"127.0.0.1:{client_port}", created


def entries_of(admin: httpx.Client) -> list[dict]:
    return admin.get("/v1/audit", params={"limit": 1000}).json()["entries"]


def post_from_a_port_of_our_own(url: str, path: str, body: dict, headers: dict | None = None) -> tuple[int, int]:
    """POSTs `body` as the admin from 127.0.0.1 on a connection of its own: (the status, the
    connection's local port, which the server sees as the client's)."""
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30, source_address=("127.0.0.1", 0))
    try:
        connection.connect()
        local_port = connection.sock.getsockname()[1]
        connection.request(
            "POST",
            path,
            json.dumps(body),
            {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json", **(headers or {})},
        )
        response = connection.getresponse()
        response.read()
        return response.status, local_port
    finally:
        connection.close()


def ports_connected_to(address: str) -> set[int]:
    """The local ports of this process's established TCP connections to `address` (URL or HOST:PORT):
    its clients' (the server, in this process too, has the other ends)."""
    port = urlsplit(address if "//" in address else f"//{address}").port
    return {
        c.laddr.port
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port == port
    }


# ---- an entry exists exactly when its change was made


def test_records_deleted_and_their_entry_commit_together(secured, admin):
    """DeleteRecords moved each partition's log start in a PostgreSQL transaction of its own, then
    wrote the audit entry apart: an entry that failed left records deleted by nobody on record
    (answered 500), and a request whose every partition was refused still wrote one."""
    admin.post("/v1/topics", json={"name": "trimmed", "partitions": 2}).raise_for_status()
    for partition in (0, 1):
        produce(admin, "trimmed", [{"value": f"v{n}"} for n in range(4)], partition)

    refused = delete_records(admin, "trimmed", {0: 9, 1: 7})  # past the high watermarks
    assert [p["error"]["code"] for p in refused.json()["partitions"]] == ["OFFSET_OUT_OF_RANGE"] * 2
    assert "delete records" not in [action for _, _, action, _, _ in audited(admin)]

    asyncio.run(_make_audit_fail(secured.database_url))
    assert delete_records(admin, "trimmed", {0: 2, 1: 3}).status_code == 500
    assert (log_start(admin, "trimmed", 0), log_start(admin, "trimmed", 1)) == (0, 0)

    asyncio.run(_let_audit_succeed(secured.database_url))
    moved = delete_records(admin, "trimmed", {1: 3, 0: 9})  # partition 1 moves, 0 is refused
    assert [(p["partition"], p["low_watermark"]) for p in moved.json()["partitions"]] == [(1, 3), (0, -1)]
    assert audited(admin)[-1] == ("admin", "http", "delete records", "trimmed", "partition 1: log start 3")


async def _let_audit_succeed(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("DROP TRIGGER refuse_audit ON audit_log")
    finally:
        await conn.close()
