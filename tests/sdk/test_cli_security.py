"""`txbroker principals|acls|audit` as an operator runs them, against a server with auth required."""

from __future__ import annotations

import json
import re

from tests.sdk.test_cli import ok, txbroker

ADMIN_TOKEN = "cli-admin-token"


def test_operator_creates_a_principal_a_key_and_an_acl_then_revokes(make_server):
    server = make_server(auth="required", admin_token=ADMIN_TOKEN)
    admin = {"TXBROKER_TOKEN": ADMIN_TOKEN}
    anonymous = txbroker(server.url, "topics", "list")
    assert anonymous.returncode == 1 and "UNAUTHORIZED" in anonymous.stderr.decode()

    assert ok(txbroker(server.url, "principals", "create", "orders-app", env=admin)) == "created principal orders-app\n"
    key = json.loads(ok(txbroker(server.url, "principals", "add-key", "orders-app", "--json", env=admin)))
    app = {"TXBROKER_TOKEN": key["token"]}
    assert txbroker(server.url, "topics", "create", "orders", env=app).returncode == 1, "no ACL yet"
    added = ok(
        txbroker(
            server.url,
            "acls",
            "add",
            "--principal",
            "orders-app",
            "--resource-type",
            "Topic",
            "--resource-name",
            "orders",
            "--prefixed",
            "--operation",
            "All",
            env=admin,
        )
    )
    assert "allow All on Topic 'orders' (prefixed) for orders-app" in added
    assert ok(txbroker(server.url, "topics", "create", "orders-eu", env=app)).startswith("created topic orders-eu")
    listing = ok(txbroker(server.url, "acls", "list", "--principal", "orders-app", env=admin))
    assert listing.splitlines()[0].split()[:3] == ["ID", "PRINCIPAL", "PERMISSION"] and "orders-app" in listing

    revoked_key = ok(txbroker(server.url, "principals", "revoke-key", "orders-app", key["key_id"], "--json", env=admin))
    assert json.loads(revoked_key) == {"revoked": key["key_id"], "principal": "orders-app"}
    revoked = txbroker(server.url, "topics", "list", env=app)
    assert revoked.returncode == 1 and "UNAUTHORIZED" in revoked.stderr.decode()
    audit = json.loads(ok(txbroker(server.url, "audit", "--json", env=admin)))
    assert [e["action"] for e in audit][:4] == ["revoke key", "create topic", "add acl", "add key"]
    assert {e["source"] for e in audit[:4]} == {"http"}
    # Each command is a process of its own, on a connection of its own: the port its OS chose.
    assert all(re.fullmatch(r"127\.0\.0\.1:\d+", e["client_address"]) for e in audit[:4]), audit[:4]
    table = ok(txbroker(server.url, "audit", env=admin)).splitlines()
    assert table[0].split()[:5] == ["TIME", "PRINCIPAL", "SOURCE", "CLIENT", "ACTION"]
    assert table[1].split()[1:5] == ["admin", "http", audit[0]["client_address"], "revoke"], table[1]
    denied = txbroker(server.url, "principals", "list", env={"TXBROKER_TOKEN": "nope"})
    assert denied.returncode == 1

    # With --json every change says what it did as JSON (these printed text before).
    [acl] = json.loads(ok(txbroker(server.url, "acls", "list", "--principal", "orders-app", "--json", env=admin)))
    removed = ok(txbroker(server.url, "acls", "remove", str(acl["acl_id"]), "--json", env=admin))
    assert json.loads(removed) == {"removed": acl["acl_id"]}
    deleted = ok(txbroker(server.url, "principals", "delete", "orders-app", "--json", env=admin))
    assert json.loads(deleted) == {"deleted": "orders-app"}


def test_operator_sets_lists_and_deletes_a_principals_scram_credential(make_server):
    """The password comes on stdin, never as an argument; the credential then authenticates a
    Kafka client (tests/kafka/test_scram.py), here seen by the listing and the audit log."""
    server = make_server(auth="required", admin_token=ADMIN_TOKEN)
    admin = {"TXBROKER_TOKEN": ADMIN_TOKEN}
    ok(txbroker(server.url, "principals", "create", "orders-app", env=admin))
    set_scram = ["principals", "set-scram", "orders-app", "SCRAM-SHA-512", "--iterations", "8192"]
    assert ok(txbroker(server.url, *set_scram, stdin="a password\n", env=admin)).startswith(
        "set the SCRAM-SHA-512 credential of orders-app (8192 iterations)"
    )
    listed = json.loads(ok(txbroker(server.url, "principals", "scram", "orders-app", "--json", env=admin)))
    assert [(c["mechanism"], c["iterations"]) for c in listed] == [("SCRAM-SHA-512", 8192)]
    table = ok(txbroker(server.url, "principals", "scram", "orders-app", env=admin)).splitlines()
    assert table[0].split() == ["MECHANISM", "ITERATIONS", "UPDATED"] and table[1].split()[:2] == [
        "SCRAM-SHA-512",
        "8192",
    ]
    too_few = txbroker(server.url, *set_scram[:4], "--iterations", "100", stdin="p\n", env=admin)
    assert too_few.returncode == 1 and "100 iterations: expected 4096 to 16384" in too_few.stderr.decode()
    deleted = ok(txbroker(server.url, "principals", "delete-scram", "orders-app", "SCRAM-SHA-512", "--json", env=admin))
    assert json.loads(deleted) == {"deleted": "SCRAM-SHA-512", "principal": "orders-app"}
    assert (
        ok(txbroker(server.url, "principals", "scram", "orders-app", env=admin))
        == "orders-app has no SCRAM credentials\n"
    )
    audit = json.loads(ok(txbroker(server.url, "audit", "--json", env=admin)))
    assert [e["action"] for e in audit][:2] == ["delete scram credential", "set scram credential"]
