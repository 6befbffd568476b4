"""Authentication, Kafka-style ACLs, the audit log, quotas and request limits, over real HTTP."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import asyncpg
import httpx
import pytest

from app.coordinator.authorizer import (
    ANONYMOUS,
    Acl,
    Operation,
    PatternType,
    Permission,
    Principal,
    ResourceType,
    is_allowed,
)
from tests.conftest import REPO_ROOT, loopback_socket

ADMIN_TOKEN = "root-token-for-tests"


# ---- the authorizer, pure


def acl(resource_type, name, operation, permission="allow", pattern="literal", principal="alice"):
    return Acl(
        principal, ResourceType(resource_type), PatternType(pattern), name, Operation(operation), Permission(permission)
    )


@pytest.mark.parametrize(
    "rules, operation, resource_type, name, allowed",
    [
        ([], "Read", "Topic", "orders", False),
        ([acl("Topic", "orders", "Read")], "Read", "Topic", "orders", True),
        ([acl("Topic", "orders", "Read")], "Write", "Topic", "orders", False),
        ([acl("Topic", "orders", "Read")], "Read", "Topic", "orders-2", False),
        ([acl("Topic", "orders", "Read")], "Read", "Group", "orders", False),
        ([acl("Topic", "ord", "Read", pattern="prefixed")], "Read", "Topic", "orders", True),
        ([acl("Topic", "ord", "Read", pattern="prefixed")], "Read", "Topic", "xorders", False),
        ([acl("Topic", "*", "Write")], "Write", "Topic", "anything", True),
        ([acl("Topic", "orders", "All")], "Delete", "Topic", "orders", True),
        ([acl("Topic", "orders", "Write")], "Describe", "Topic", "orders", True),  # Write implies Describe
        ([acl("Topic", "orders", "Create")], "Describe", "Topic", "orders", False),  # Create does not
        ([acl("Topic", "*", "All"), acl("Topic", "secret", "Read", "deny")], "Read", "Topic", "secret", False),
        ([acl("Topic", "*", "All"), acl("Topic", "sec", "All", "deny", "prefixed")], "Write", "Topic", "secret", False),
        ([acl("Topic", "*", "All"), acl("Topic", "secret", "Read", "deny")], "Write", "Topic", "secret", True),
    ],
)
def test_acl_evaluation(rules, operation, resource_type, name, allowed):
    principal = Principal("alice", acls=tuple(rules))
    assert is_allowed(principal, Operation(operation), ResourceType(resource_type), name) is allowed


def test_super_users_and_anonymous_may_do_everything():
    assert is_allowed(Principal("root", is_super_user=True), Operation.ALTER, ResourceType.CLUSTER, "x")
    assert is_allowed(ANONYMOUS, Operation.DELETE, ResourceType.TOPIC, "x")


# ---- over HTTP


@pytest.fixture
def secured(make_server):
    server = make_server(auth="required", admin_token=ADMIN_TOKEN)
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)
    admin.post("/v1/topics", json={"name": "orders", "partitions": 1}).raise_for_status()
    admin.post("/v1/topics", json={"name": "secret", "partitions": 1}).raise_for_status()
    yield server, admin
    admin.close()


def new_user(admin: httpx.Client, name: str, *rules: dict) -> httpx.Client:
    admin.post("/v1/principals", json={"name": name}).raise_for_status()
    token = admin.post(f"/v1/principals/{name}/keys").json()["token"]
    for rule in rules:
        admin.post("/v1/acls", json={"principal": name, **rule}).raise_for_status()
    return httpx.Client(base_url=str(admin.base_url), headers={"Authorization": f"Bearer {token}"}, timeout=30)


def rule(resource_type, name, operation, permission="allow", pattern_type="literal") -> dict:
    return {
        "resource_type": resource_type,
        "resource_name": name,
        "operation": operation,
        "permission": permission,
        "pattern_type": pattern_type,
    }


def code(response: httpx.Response) -> str:
    return response.json()["error"]["code"]


def produce(client, topic="orders", **extra):
    return client.post(
        "/v1/produce",
        json={
            "partitions": [
                {
                    "topic": topic,
                    "partition": 0,
                    "base_sequence": extra.pop("base_sequence", -1),
                    "records": [{"value": "v"}],
                }
            ],
            **extra,
        },
    )


def test_requests_without_valid_credentials_are_unauthorized(secured):
    server, admin = secured
    anonymous = httpx.Client(base_url=server.url)
    for headers in (
        {},
        {"Authorization": "Basic abc"},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer not-a-key"},
    ):
        response = anonymous.get("/v1/topics", headers=headers)
        assert response.status_code == 401 and code(response) == "UNAUTHORIZED", headers
        assert "Bearer" in response.json()["error"]["message"]
    assert anonymous.get("/v1/health").status_code == 200, "health stays open for load balancers"
    assert admin.get("/v1/whoami").json() == {"principal": "admin", "super_user": True}


def test_produce_needs_write_on_the_topic(secured):
    _, admin = secured
    writer = new_user(admin, "writer", rule("Topic", "orders", "Write"))
    assert produce(writer).status_code == 200
    denied = produce(writer, topic="secret")
    assert denied.status_code == 403 and code(denied) == "TOPIC_AUTHORIZATION_FAILED"
    assert "writer" in denied.json()["error"]["message"] and "secret" in denied.json()["error"]["message"]
    records = writer.post("/v1/topics/secret/records", json={"partition": 0, "records": [{"value": "x"}]})
    assert code(records) == "TOPIC_AUTHORIZATION_FAILED"
    reader = admin.get("/v1/topics/secret").json()["partitions"][0]
    assert reader["high_watermark"] == 0, "a denied request writes nothing"


def test_fetch_needs_read_and_list_offsets_needs_describe(secured):
    _, admin = secured
    reader = new_user(admin, "reader", rule("Topic", "orders", "Read"))
    body = {"partitions": [{"topic": "orders", "partition": 0, "offset": 0}]}
    assert reader.post("/v1/fetch", json=body).status_code == 200
    assert reader.get("/v1/topics/orders/partitions/0/records").status_code == 200
    assert (
        reader.post("/v1/offsets/list", json={"partitions": [{"topic": "orders", "partition": 0}]}).status_code == 200
    )
    body["partitions"][0]["topic"] = "secret"
    assert code(reader.post("/v1/fetch", json=body)) == "TOPIC_AUTHORIZATION_FAILED"
    assert code(produce(reader)) == "TOPIC_AUTHORIZATION_FAILED", "Read does not allow Write"


def test_transactional_writes_need_write_on_the_transactional_id(secured):
    _, admin = secured
    app = new_user(
        admin,
        "app",
        rule("Topic", "orders", "Write"),
        rule("TransactionalId", "app-", "Write", pattern_type="prefixed"),
        rule("Group", "app-group", "Read"),
    )
    init = app.post("/v1/producers/init", json={"transactional_id": "app-1", "transaction_timeout_ms": 60000})
    assert init.status_code == 200
    ids = {"transactional_id": "app-1", **init.json()}
    assert produce(app, base_sequence=0, **ids).status_code == 200
    assert app.post("/v1/txn/add-offsets", json={**ids, "group_id": "app-group"}).status_code == 200
    assert code(app.post("/v1/txn/add-offsets", json={**ids, "group_id": "other"})) == "GROUP_AUTHORIZATION_FAILED"
    assert app.post("/v1/txn/end", json={**ids, "committed": True}).status_code == 200
    denied = app.post("/v1/producers/init", json={"transactional_id": "billing-1", "transaction_timeout_ms": 60000})
    assert denied.status_code == 403 and code(denied) == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    for path, extra in (
        ("/v1/txn/end", {"committed": True}),
        ("/v1/txn/prepare", {}),
        ("/v1/txn/add-partitions", {"partitions": [{"topic": "orders", "partition": 0}]}),
    ):
        response = app.post(
            path, json={"transactional_id": "billing-1", "producer_id": 1, "producer_epoch": 0, **extra}
        )
        assert code(response) == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", path
    assert app.post("/v1/producers/init", json={}).status_code == 200, "idempotence needs no extra ACL"


def test_another_principal_cannot_bump_an_idempotent_producers_epoch(secured):
    """Regression: POST /v1/producers/init with another principal's idempotent producer id and epoch
    bumped it (KIP-360), fencing that producer everywhere. Another principal now gets a new id; the
    owner's bump bumps."""
    _, admin = secured
    owner = new_user(admin, "owner", rule("Topic", "orders", "Write"))
    stranger = new_user(admin, "stranger")
    issued = owner.post("/v1/producers/init", json={}).json()
    ids = {"producer_id": issued["producer_id"], "producer_epoch": issued["producer_epoch"]}
    assert produce(owner, base_sequence=0, **ids).status_code == 200
    other = stranger.post("/v1/producers/init", json=ids).json()
    assert other["producer_id"] != ids["producer_id"] and other["producer_epoch"] == 0
    assert produce(owner, base_sequence=1, **ids).status_code == 200
    bumped = owner.post("/v1/producers/init", json=ids).json()
    assert (bumped["producer_id"], bumped["producer_epoch"]) == (ids["producer_id"], ids["producer_epoch"] + 1)


def test_group_operations_need_read_on_the_group(secured):
    _, admin = secured
    consumer = new_user(admin, "consumer", rule("Group", "readers", "Read"), rule("Topic", "orders", "Read"))
    joined = consumer.post("/v1/groups/readers/heartbeat", json={"member_id": "", "topics": ["orders"]})
    assert joined.status_code == 200
    commit = consumer.post(
        "/v1/groups/readers/offsets/commit", json={"offsets": [{"topic": "orders", "partition": 0, "offset": 0}]}
    )
    assert commit.status_code == 200 and commit.json()["offsets"][0]["error"] is None
    assert consumer.post("/v1/groups/readers/offsets/fetch", json={}).status_code == 200
    assert consumer.get("/v1/groups/readers").status_code == 200, "Read implies Describe"
    assert (
        code(consumer.post("/v1/groups/others/heartbeat", json={"topics": ["orders"]})) == "GROUP_AUTHORIZATION_FAILED"
    )
    assert [g["group_id"] for g in consumer.get("/v1/groups").json()["groups"]] == ["readers"]


def test_listings_show_only_what_the_principal_may_describe(secured):
    _, admin = secured
    for tid in ("team-a-1", "team-b-1"):
        admin.post("/v1/producers/init", json={"transactional_id": tid, "transaction_timeout_ms": 60000})
    viewer = new_user(
        admin,
        "viewer",
        rule("Topic", "orders", "Describe"),
        rule("TransactionalId", "team-a-", "Describe", pattern_type="prefixed"),
    )
    assert [t["name"] for t in viewer.get("/v1/topics").json()["topics"]] == ["orders"]
    assert viewer.get("/v1/cluster").json()["topics"] == ["orders"]
    assert [t["transactional_id"] for t in viewer.get("/v1/transactions").json()["transactions"]] == ["team-a-1"]
    assert viewer.get("/v1/transactions/team-a-1").status_code == 200
    assert code(viewer.get("/v1/transactions/team-b-1")) == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    assert code(viewer.get("/metrics")) == "CLUSTER_AUTHORIZATION_FAILED"


def test_offsets_and_transactions_show_only_the_topics_and_groups_the_principal_may_describe(secured):
    """Regression: with Describe on a group, OffsetFetch (all partitions, or named ones) and
    DescribeGroups answered the committed offsets, metadata and lag of every topic, and with Describe
    on a transactional id, DescribeTransactions and ListTransactions answered every topic partition
    and group of the transaction: names and offsets a principal may not Describe. Kafka shows
    neither (KafkaApis: "Clients are not allowed to see offsets for topics that are not authorized
    for Describe"; DescribeTransactions keeps only the topics the principal may Describe), nor does
    txbroker's Kafka door."""
    _, admin = secured
    offsets = [{"topic": topic, "partition": 0, "offset": 1, "metadata": topic} for topic in ("orders", "secret")]
    admin.post("/v1/groups/mixed/offsets/commit", json={"offsets": offsets}).raise_for_status()
    init = admin.post("/v1/producers/init", json={"transactional_id": "mixed-tx", "transaction_timeout_ms": 60000})
    ids = {"transactional_id": "mixed-tx", **init.raise_for_status().json()}
    partitions = [{"topic": topic, "partition": 0} for topic in ("orders", "secret")]
    admin.post("/v1/txn/add-partitions", json={**ids, "partitions": partitions}).raise_for_status()
    admin.post("/v1/txn/add-offsets", json={**ids, "group_id": "hidden-group"}).raise_for_status()
    viewer = new_user(
        admin,
        "offsets-viewer",
        rule("Group", "mixed", "Describe"),
        rule("Topic", "orders", "Describe"),
        rule("TransactionalId", "mixed-tx", "Describe"),
    )
    fetched = viewer.post("/v1/groups/mixed/offsets/fetch", json={}).json()["offsets"]
    assert [(o["topic"], o["offset"], o["metadata"]) for o in fetched] == [("orders", 1, "orders")]
    named = viewer.post("/v1/groups/mixed/offsets/fetch", json={"partitions": [{"topic": "secret", "partition": 0}]})
    assert (named.status_code, code(named)) == (403, "TOPIC_AUTHORIZATION_FAILED")
    assert [o["topic"] for o in viewer.get("/v1/groups/mixed").json()["offsets"]] == ["orders"]
    described = viewer.get("/v1/transactions/mixed-tx").json()
    [listed] = viewer.get("/v1/transactions").json()["transactions"]
    for transaction in (described, listed):
        assert (transaction["partitions"], transaction["groups"]) == ([{"topic": "orders", "partition": 0}], [])
    everything = admin.get("/v1/transactions/mixed-tx").json()
    assert {p["topic"] for p in everything["partitions"]} >= {"orders", "secret"}
    assert everything["groups"] == ["hidden-group"]


def test_a_filtered_transaction_page_is_full_until_the_last(secured):
    """The ACL filter applies before the page limit: a principal who may see only some ids still gets
    full pages, so a short page means the listing is done (the SDK's Admin pages that way)."""
    _, admin = secured
    for number in range(1, 8):
        admin.post("/v1/producers/init", json={"transactional_id": f"id-{number}", "transaction_timeout_ms": 60000})
    visible = ("id-1", "id-4", "id-6", "id-7")
    viewer = new_user(admin, "pager", *(rule("TransactionalId", tid, "Describe") for tid in visible))

    def page(**params) -> list[str]:
        body = viewer.get("/v1/transactions", params={"limit": 2, **params}).json()
        return [t["transactional_id"] for t in body["transactions"]]

    assert page() == ["id-1", "id-4"]
    assert page(after="id-4") == ["id-6", "id-7"]
    assert page(after="id-7") == []


def test_admin_abort_needs_write_on_the_id_or_alter_on_the_cluster(secured):
    _, admin = secured
    init = admin.post("/v1/producers/init", json={"transactional_id": "hang", "transaction_timeout_ms": 60000}).json()
    produce(admin, base_sequence=0, transactional_id="hang", **init).raise_for_status()
    nobody = new_user(admin, "nobody", rule("TransactionalId", "hang", "Describe"))
    assert code(nobody.post("/v1/transactions/hang/abort")) == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    operator = new_user(admin, "operator", rule("Cluster", "txbroker-cluster", "Alter"))
    aborted = operator.post("/v1/transactions/hang/abort")
    assert aborted.status_code == 200 and aborted.json()["state"] == "CompleteAbort"
    entries = admin.get("/v1/audit").json()["entries"]
    assert {"principal": "operator", "action": "abort transaction", "resource": "hang"}.items() <= entries[0].items()


def test_topic_creation_needs_create_and_deletion_needs_delete(secured):
    _, admin = secured
    creator = new_user(
        admin,
        "creator",
        rule("Topic", "scratch-", "Create", pattern_type="prefixed"),
        rule("Topic", "scratch-", "Delete", pattern_type="prefixed"),
    )
    assert creator.post("/v1/topics", json={"name": "scratch-1"}).status_code == 201
    assert code(creator.post("/v1/topics", json={"name": "prod-1"})) == "TOPIC_AUTHORIZATION_FAILED"
    assert code(creator.delete("/v1/topics/orders")) == "TOPIC_AUTHORIZATION_FAILED"
    assert creator.delete("/v1/topics/scratch-1").status_code == 204
    actions = [(e["principal"], e["action"], e["resource"]) for e in admin.get("/v1/audit").json()["entries"]]
    assert ("creator", "delete topic", "scratch-1") in actions and ("creator", "create topic", "scratch-1") in actions


def test_managing_principals_and_acls_needs_alter_on_the_cluster(secured):
    _, admin = secured
    user = new_user(admin, "plain", rule("Topic", "*", "All"))
    assert (
        code(user.post("/v1/principals", json={"name": "sneaky", "super_user": True})) == "CLUSTER_AUTHORIZATION_FAILED"
    )
    assert (
        code(user.post("/v1/acls", json={"principal": "plain", **rule("Cluster", "txbroker-cluster", "All")}))
        == "CLUSTER_AUTHORIZATION_FAILED"
    )
    listed = admin.get("/v1/acls", params={"principal": "plain"}).json()["acls"]
    assert [(a["resource_type"], a["resource_name"], a["operation"]) for a in listed] == [("Topic", "*", "All")]
    assert admin.delete(f"/v1/acls/{listed[0]['acl_id']}").status_code == 204
    assert code(produce(user)) == "TOPIC_AUTHORIZATION_FAILED", "a removed rule stops applying at once"


def test_deny_wins_over_allow(secured):
    _, admin = secured
    user = new_user(admin, "careful", rule("Topic", "*", "All"), rule("Topic", "secret", "Write", "deny"))
    assert produce(user).status_code == 200
    assert code(produce(user, topic="secret")) == "TOPIC_AUTHORIZATION_FAILED"
    assert (
        user.post("/v1/fetch", json={"partitions": [{"topic": "secret", "partition": 0, "offset": 0}]}).status_code
        == 200
    ), "the deny names Write only"


def test_revoking_a_key_takes_effect_on_the_next_request(secured):
    _, admin = secured
    user = new_user(admin, "leaver", rule("Topic", "orders", "Read"))
    assert user.get("/v1/topics/orders/partitions/0/records").status_code == 200
    [key] = admin.get("/v1/principals/leaver/keys").json()["keys"]
    assert admin.delete(f"/v1/principals/leaver/keys/{key['key_id']}").status_code == 204
    assert code(user.get("/v1/topics/orders/partitions/0/records")) == "UNAUTHORIZED"
    assert admin.get("/v1/principals/leaver/keys").json()["keys"][0]["revoked_ms"] is not None
    assert admin.delete("/v1/principals/leaver").status_code == 204
    # Gone with its keys: listing them is 404, as adding or revoking one is (not an empty list,
    # which would read as a principal without keys).
    gone = admin.get("/v1/principals/leaver/keys")
    assert (gone.status_code, code(gone)) == (404, "NOT_FOUND")
    assert "leaver" in gone.json()["error"]["message"]


def bearer(server, token: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def test_a_revoked_admin_token_stays_revoked_when_a_node_starts_with_it(make_server):
    """TXBROKER_ADMIN_TOKEN is a node's copy of a credential: a node started with it after the key
    was revoked (a second node on the database, or this one restarted by its service manager) must
    not bring the key back (it reinstated it, so a leaked admin token came back at every start)."""
    first = make_server(auth="required", admin_token=ADMIN_TOKEN)
    admin = bearer(first, ADMIN_TOKEN)
    admin.post("/v1/principals", json={"name": "ops", "super_user": True}).raise_for_status()
    ops = bearer(first, admin.post("/v1/principals/ops/keys").json()["token"])
    assert ops.delete("/v1/principals/admin/keys/bootstrap").status_code == 204
    assert code(admin.get("/v1/whoami")) == "UNAUTHORIZED"

    second = make_server(auth="required", admin_token=ADMIN_TOKEN)  # healthy: its start-up has run
    for server in (first, second):
        assert code(bearer(server, ADMIN_TOKEN).get("/v1/whoami")) == "UNAUTHORIZED", server.url
    [key] = ops.get("/v1/principals/admin/keys").json()["keys"]
    assert key["key_id"] == "bootstrap" and key["revoked_ms"] is not None
    # A token the database has not seen is a rotation: it is the bootstrap key from then on.
    third = make_server(auth="required", admin_token="a-new-admin-token")
    assert bearer(third, "a-new-admin-token").get("/v1/whoami").json() == {"principal": "admin", "super_user": True}


def test_a_node_started_with_a_rotated_admin_token_does_not_bring_it_back(make_server):
    """Rotating TXBROKER_ADMIN_TOKEN node by node: a node still configured with the old token that
    starts after another started with the new one leaves the new one in force and the old refused
    (it swapped them back, locking out whoever held the new token)."""
    first = make_server(auth="required", admin_token=ADMIN_TOKEN)
    rotated = make_server(auth="required", admin_token="rotated-admin-token")
    assert code(bearer(first, ADMIN_TOKEN).get("/v1/whoami")) == "UNAUTHORIZED"
    stale = make_server(auth="required", admin_token=ADMIN_TOKEN)
    for server in (first, rotated, stale):
        assert code(bearer(server, ADMIN_TOKEN).get("/v1/whoami")) == "UNAUTHORIZED", server.url
        assert bearer(server, "rotated-admin-token").get("/v1/whoami").status_code == 200, server.url
    keys = bearer(rotated, "rotated-admin-token").get("/v1/principals/admin/keys").json()["keys"]
    assert [k["revoked_ms"] is None for k in keys if k["key_id"] == "bootstrap"] == [True]
    assert len(keys) == 2 and all(k["revoked_ms"] is not None for k in keys if k["key_id"] != "bootstrap")


def test_transactional_ids_per_principal_are_limited(make_server):
    server = make_server(auth="required", admin_token=ADMIN_TOKEN, max_transactional_ids_per_principal=2)
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    user = new_user(admin, "greedy", rule("TransactionalId", "*", "Write"))
    for n in range(2):
        assert (
            user.post(
                "/v1/producers/init", json={"transactional_id": f"t{n}", "transaction_timeout_ms": 1000}
            ).status_code
            == 200
        )
    assert (
        user.post("/v1/producers/init", json={"transactional_id": "t0", "transaction_timeout_ms": 1000}).status_code
        == 200
    ), "re-initializing an existing id is not a new one"
    over = user.post("/v1/producers/init", json={"transactional_id": "t2", "transaction_timeout_ms": 1000})
    assert over.status_code == 403 and "max_transactional_ids_per_principal" in over.json()["error"]["message"]


# ---- listening beyond loopback


def test_serve_refuses_non_loopback_without_authentication(database_url):
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--host", "0.0.0.0", "--database-url", database_url],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "refusing to listen on 0.0.0.0 without authentication" in result.stderr


def test_listening_rule():
    from app.cli import listening_refusal
    from app.settings import Settings

    assert listening_refusal(Settings(host="127.0.0.1"), None) is None
    assert listening_refusal(Settings(host="::1"), None) is None
    assert listening_refusal(Settings(host="localhost"), None) is None
    assert listening_refusal(Settings(host="10.1.2.3"), None) is not None
    assert listening_refusal(Settings(host="10.1.2.3", auth="required"), None) is None
    assert listening_refusal(Settings(host="10.1.2.3", allow_anonymous=True), None) is None
    sock = loopback_socket()
    try:
        assert listening_refusal(Settings(host="10.1.2.3"), sock.fileno()) is None, "an fd is judged by its address"
    finally:
        sock.close()


# ---- request limits


def test_too_many_partitions_in_one_request(make_server):
    server = make_server(max_partitions_per_request=2)
    server.client.post("/v1/topics", json={"name": "wide", "partitions": 3}).raise_for_status()
    response = server.client.post(
        "/v1/fetch", json={"partitions": [{"topic": "wide", "partition": p, "offset": 0} for p in range(3)]}
    )
    assert response.status_code == 400 and "max_partitions_per_request" in response.json()["error"]["message"]


def test_too_many_partitions_in_an_offset_commit_or_fetch(make_server):
    """Regression: the offset endpoints took any number of partitions, past the
    max_partitions_per_request that api.md sets for every request (a commit of them all was written
    as one batch of __consumer_offsets, in one statement). They are refused now, as the others'
    are, and nothing is committed."""
    server = make_server(max_partitions_per_request=2)
    client = server.client
    client.post("/v1/topics", json={"name": "wide", "partitions": 3}).raise_for_status()
    offsets = [{"topic": "wide", "partition": p, "offset": 1} for p in range(3)]
    producer = client.post("/v1/producers/init", json={"transactional_id": "wide-app"}).json()
    refused = [
        client.post("/v1/groups/wide-group/offsets/commit", json={"offsets": offsets}),
        client.post(
            "/v1/txn/offset-commit",
            json={"transactional_id": "wide-app", **producer, "group_id": "wide-group", "offsets": offsets},
        ),
        client.post(
            "/v1/groups/wide-group/offsets/fetch",
            json={"partitions": [{"topic": "wide", "partition": p} for p in range(3)]},
        ),
    ]
    for response in refused:
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "INVALID_REQUEST"
        assert "max_partitions_per_request" in response.json()["error"]["message"]
    assert client.get("/v1/groups/wide-group").status_code == 404
    assert client.get("/v1/transactions/wide-app").json()["state"] == "Empty"
    within = client.post("/v1/groups/wide-group/offsets/commit", json={"offsets": offsets[:2]})
    assert within.status_code == 200 and [o["error"] for o in within.json()["offsets"]] == [None, None]


def test_too_many_partitions_are_refused_before_their_entries_are_validated(make_server):
    """Regression: the count was checked once the schema had validated every entry, microseconds
    each on the worker's event loop: a fetch naming 1.5 million partitions (58 MB, within
    max_request_bytes) held every other request of the worker for 6 s before it was refused. The
    count is now refused first, so an entry past the limit is never looked at: here the last one,
    invalid, which validation would have named."""
    server = make_server(max_partitions_per_request=2)
    listed = [{"topic": "wide", "partition": p, "offset": 0} for p in range(2)] + [{"partition": "not a number"}]
    for path, key in (
        ("/v1/fetch", "partitions"),
        ("/v1/offsets/list", "partitions"),
        ("/v1/produce", "partitions"),
        ("/v1/txn/add-partitions", "partitions"),
        ("/v1/groups/wide-group/offsets/commit", "offsets"),
    ):
        response = server.client.post(path, json={key: listed})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "INVALID_REQUEST"
        assert "names 3 partitions: expected at most 2 (setting max_partitions_per_request)" in error["message"], path


def assert_refused(response, message: str) -> None:
    assert response.status_code == 400, response.text
    assert response.json()["error"] == {"code": "INVALID_REQUEST", "message": message, "retriable": False}


def test_too_many_records_are_refused_before_they_are_validated(make_server):
    """Regression: max_records_per_request was checked once the schema had validated every record:
    a produce of one partition of five million records `{"value": ""}` (64 MB, within
    max_request_bytes) held every other request of the worker for 14 s (38 s when a record made the
    fast path decline) before it was refused. The records are now counted over the whole request
    first, so a record past the limit is never looked at: here the last one, invalid, which
    validation would have named."""
    server = make_server(max_records_per_request=3)
    server.client.post("/v1/topics", json={"name": "many", "partitions": 2}).raise_for_status()
    records = [{"value": "a"}, {"value": "b"}]
    for path, body in (
        (
            "/v1/produce",
            {
                "partitions": [
                    {"topic": "many", "partition": 0, "records": records},
                    {"topic": "many", "partition": 1, "records": [*records, {"value": 1}]},
                ]
            },
        ),
        ("/v1/topics/many/records", {"records": [*records, *records, {"value": 1}]}),
    ):
        assert_refused(
            server.client.post(path, json=body),
            "the request carries 5 records: expected at most 3 (setting max_records_per_request); split it",
        )


def test_too_many_record_headers_are_refused_before_they_are_validated(make_server):
    """Regression: a record's headers were not bounded at all: one record of six million headers
    `{"key": ""}` (64 MB) was validated (30 s of the worker's event loop for every other request when
    a header made the fast path decline) and then stored. A request's headers are bounded as its
    records, over the whole request (max_record_headers_per_request), and counted before validation:
    the header past the limit here, invalid, is never looked at."""
    server = make_server(max_record_headers_per_request=3)
    server.client.post("/v1/topics", json={"name": "labelled", "partitions": 1}).raise_for_status()
    headers = [{"key": "a"}, {"key": "b", "value": "c"}]
    for path, records in (
        ("/v1/produce", [{"headers": headers}, {"headers": [*headers, {"key": 1}]}]),
        ("/v1/topics/labelled/records", [{"headers": [*headers, *headers, {"key": 1}]}]),
    ):
        body = {"records": records}
        if path == "/v1/produce":
            body = {"partitions": [{"topic": "labelled", "partition": 0, "records": records}]}
        assert_refused(
            server.client.post(path, json=body),
            "the request carries 5 record headers: expected at most 3 over all its records "
            "(setting max_record_headers_per_request); split it, or send fewer headers",
        )
    assert server.client.get("/v1/topics/labelled").json()["partitions"][0]["high_watermark"] == 0


def test_long_polls_beyond_capacity_are_answered_at_once(make_server):
    server = make_server(max_concurrent_long_polls=1)
    server.client.post("/v1/topics", json={"name": "quiet", "partitions": 1}).raise_for_status()
    body = {"max_wait_ms": 3000, "partitions": [{"topic": "quiet", "partition": 0, "offset": 0}]}
    holder = threading.Thread(target=lambda: httpx.post(f"{server.url}/v1/fetch", json=body, timeout=30))
    holder.start()
    time.sleep(0.5)
    started = time.monotonic()
    response = server.client.post("/v1/fetch", json=body)
    elapsed = time.monotonic() - started
    holder.join()
    assert response.status_code == 200 and response.json()["partitions"][0]["records"] == []
    assert elapsed < 2.5, "with the only long-poll slot taken, the fetch was answered without waiting"


def test_a_key_or_scram_credential_for_a_principal_deleted_meanwhile_is_not_found(server):
    """Regression: adding an API key or setting a SCRAM credential checked that the principal
    existed, then wrote its row; a deletion of the principal committed in between made that write
    violate its foreign key, answered as an internal error. The check now holds the principal's row
    (FOR KEY SHARE) until the write commits: the request waits for the deletion, then answers 404."""
    requests = {
        "an API key": lambda name: httpx.post(f"{server.url}/v1/principals/{name}/keys", timeout=30),
        "a SCRAM credential": lambda name: httpx.put(
            f"{server.url}/v1/principals/{name}/scram-credentials/SCRAM-SHA-256",
            json={"password": "deleted-meanwhile"},
            timeout=30,
        ),
    }

    async def deleted_while_asked(name: str, send) -> httpx.Response:
        deleter = await asyncpg.connect(server.database_url)
        try:
            deletion = deleter.transaction()
            await deletion.start()
            await deleter.execute("DELETE FROM principals WHERE name = $1", name)
            answer = asyncio.ensure_future(asyncio.to_thread(send, name))
            for _ in range(300):  # until the request waits for the deletion's row lock
                waiting = await deleter.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
                if waiting or answer.done():
                    break
                await asyncio.sleep(0.02)
            await deletion.commit()
            return await answer
        finally:
            await deleter.close()

    for what, send in requests.items():
        name = "deleted-meanwhile-" + what.split()[-1].lower()
        server.client.post("/v1/principals", json={"name": name, "super_user": False}).raise_for_status()
        answer = asyncio.run(deleted_while_asked(name, send))
        assert answer.status_code == 404, f"{what}: {answer.status_code} {answer.text[:300]}"
        assert answer.json()["error"]["code"] == "NOT_FOUND", what
