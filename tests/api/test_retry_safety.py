"""docs/api.md, "Conventions": "Every endpoint that changes state is safe to retry with the same body". Each
state-changing endpoint of the API (the list is taken from the app's routes, so a new endpoint
cannot be left out) is sent twice with the same body, as a client whose first answer was lost
would: the second must answer the first's outcome, or a clean contract error, and leave the
server's state exactly as the first left it.

The exceptions docs/api.md names, by nature: plain writes (producer_id -1) are at-least-once, and a
group join (member_id "") may create a member that then expires. Also by nature: InitProducerId
with -1/-1 announces a new instance, so its retry fences the first answer (which nobody received);
a new API key is minted per call. The logs themselves (`__consumer_offsets`, `__transaction_state`,
the audit log) may record a retry; what they materialize may not change.
"""

from __future__ import annotations

import httpx

TOPIC, GROUP, TXN_ID = "retried", "retried-group", "retried-app"

# Routes that change nothing, or are retried only as the exceptions above.
READ_ONLY_POSTS = {
    "/v1/fetch",
    "/v1/offsets/list",
    "/v1/coordinators/find",
    "/v1/groups/{group_id}/offsets/fetch",
    "/console/login",
    "/console/logout",
}
BY_NATURE = {
    "/v1/topics/{topic}/records": "plain writes are at-least-once",
    "/v1/principals/{name}/keys": "each call mints a new key (a token nobody has seen is harmless)",
}


def snapshot(client: httpx.Client) -> dict:
    """The state a retry must not change: topics and their logs, transactions, the group's
    members, generation, assignment and offsets (visible and pending), principals, keys, ACLs."""
    topics = client.get("/v1/topics").json()["topics"]
    logs = {}
    for topic in topics:
        if topic["name"].startswith("__"):
            continue
        for p in topic["partitions"]:
            entry = client.post(
                "/v1/fetch",
                json={
                    "isolation_level": "read_uncommitted",
                    "max_records": 10_000,
                    "partitions": [{"topic": topic["name"], "partition": p["partition"], "offset": 0}],
                },
            ).json()["partitions"][0]
            logs[(topic["name"], p["partition"])] = [(r["offset"], r["value"]) for r in entry["records"]]
    group = client.get(f"/v1/groups/{GROUP}")
    group_state = None
    if group.status_code == 200:
        body = group.json()
        group_state = {
            "generation": body["generation_id"],
            "offsets": body["offsets"],
            "members": sorted((m["member_id"], str(m.get("assignment"))) for m in body["members"]),
        }
    return {
        "topics": [t for t in topics if not t["name"].startswith("__")],
        "logs": logs,
        "transactions": client.get("/v1/transactions").json()["transactions"],
        "group": group_state,
        "offsets": client.post(f"/v1/groups/{GROUP}/offsets/fetch", json={}).json(),
        "principals": client.get("/v1/principals").json(),
        "keys": client.get("/v1/principals/retried-user/keys").json(),
        "acls": client.get("/v1/acls").json(),
    }


CLEAN_ERRORS = {
    "TOPIC_ALREADY_EXISTS",
    "UNKNOWN_TOPIC_OR_PARTITION",
    "INVALID_TXN_STATE",
    "UNKNOWN_MEMBER_ID",
    "INVALID_REQUEST",
    "NOT_FOUND",
}


class Retrier:
    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self.covered: set[tuple[str, str]] = set()

    def twice(self, method: str, route: str, path: str, **kwargs) -> httpx.Response:
        """Sends the request twice; returns the first answer."""
        self.covered.add((method, route))
        first = self.client.request(method, path, **kwargs)
        assert first.status_code < 500, first.text
        after_first = snapshot(self.client)
        second = self.client.request(method, path, **kwargs)
        after_second = snapshot(self.client)
        same_answer = second.status_code == first.status_code and _outcome(second) == _outcome(first)
        if not same_answer:
            assert 400 <= second.status_code < 500, (route, second.status_code, second.text)
            if route.startswith("/console/"):  # a page for people: the error is in its text
                assert "invalid_txn_state" in second.text.lower() or "no transaction is open" in second.text, route
            else:
                assert second.json()["error"]["code"] in CLEAN_ERRORS, (route, second.text)
        assert after_second == after_first, f"{method} {route}: the retry changed the state"
        return first


def _outcome(response: httpx.Response):
    """The answer, with a produce's `duplicate` flag left out: a retried batch answers the same
    offsets, flagged as the duplicate it is."""
    if not response.headers.get("content-type", "").startswith("application/json"):
        return response.content
    body = response.json()
    for entry in body.get("partitions", []) if isinstance(body, dict) else []:
        if isinstance(entry, dict):
            entry.pop("duplicate", None)
    return body


def state_changing_routes(app) -> set[tuple[str, str]]:
    routes = set()
    for route in app.routes:
        for method in getattr(route, "methods", None) or ():
            if method in ("POST", "PUT", "PATCH", "DELETE") and route.path not in READ_ONLY_POSTS:
                routes.add((method, route.path))
    return routes


def test_every_state_changing_endpoint_is_safe_to_retry(server):
    client = server.client
    r = Retrier(client)
    r.twice("POST", "/v1/topics", "/v1/topics", json={"name": TOPIC, "partitions": 2})
    r.twice("POST", "/v1/topics", "/v1/topics", json={"name": "doomed", "partitions": 1})
    r.twice("DELETE", "/v1/topics/{topic}", "/v1/topics/doomed")

    # Idempotent produce: the retry is a duplicate with the original offsets.
    idem = client.post("/v1/producers/init", json={}).json()
    first = r.twice(
        "POST",
        "/v1/produce",
        "/v1/produce",
        json={
            **idem,
            "partitions": [
                {"topic": TOPIC, "partition": 0, "base_sequence": 0, "records": [{"value": "i0"}, {"value": "i1"}]}
            ],
        },
    )
    assert first.json()["partitions"][0]["duplicate"] is False
    # KIP-360 bump of an idempotent producer, retried.
    bumped = r.twice("POST", "/v1/producers/init", "/v1/producers/init", json=idem).json()
    assert bumped["producer_epoch"] == idem["producer_epoch"] + 1

    # A transaction, every step retried.
    init = client.post("/v1/producers/init", json={"transactional_id": TXN_ID, "transaction_timeout_ms": 60_000})
    ids = {"transactional_id": TXN_ID, **init.json()}
    # KIP-360 bump of a transactional producer, retried: the retry answers the same ids.
    ids = {
        "transactional_id": TXN_ID,
        **r.twice(
            "POST", "/v1/producers/init", "/v1/producers/init", json={**ids, "transaction_timeout_ms": 60_000}
        ).json(),
    }
    r.twice(
        "POST",
        "/v1/txn/add-partitions",
        "/v1/txn/add-partitions",
        json={**ids, "partitions": [{"topic": TOPIC, "partition": 1}]},
    )
    r.twice(
        "POST",
        "/v1/produce",
        "/v1/produce",
        json={
            **ids,
            "partitions": [{"topic": TOPIC, "partition": 1, "base_sequence": 0, "records": [{"value": "t0"}]}],
        },
    )
    r.twice("POST", "/v1/txn/add-offsets", "/v1/txn/add-offsets", json={**ids, "group_id": GROUP})
    r.twice(
        "POST",
        "/v1/txn/offset-commit",
        "/v1/txn/offset-commit",
        json={**ids, "group_id": GROUP, "offsets": [{"topic": TOPIC, "partition": 0, "offset": 2, "metadata": "m"}]},
    )
    ended = r.twice("POST", "/v1/txn/end", "/v1/txn/end", json={**ids, "committed": True}).json()
    assert ended["state"] == "CompleteCommit"
    ids = {"transactional_id": TXN_ID, "producer_id": ended["producer_id"], "producer_epoch": ended["producer_epoch"]}

    # Two-phase: prepare retried, then the admin abort retried (its retry: nothing is open).
    client.post("/v1/txn/add-partitions", json={**ids, "partitions": [{"topic": TOPIC, "partition": 0}]})
    r.twice("POST", "/v1/txn/prepare", "/v1/txn/prepare", json=ids)
    r.twice("POST", "/v1/transactions/{transactional_id:path}/abort", f"/v1/transactions/{TXN_ID}/abort")
    described = client.get(f"/v1/transactions/{TXN_ID}").json()
    ids = {
        "transactional_id": TXN_ID,
        "producer_id": described["producer_id"],
        "producer_epoch": described["producer_epoch"],
    }
    client.post("/v1/txn/add-partitions", json={**ids, "partitions": [{"topic": TOPIC, "partition": 0}]})
    started = client.get(f"/v1/transactions/{TXN_ID}").json()["start_time_ms"]
    r.twice(
        "POST",
        "/console/transactions/{transactional_id:path}/abort",
        f"/console/transactions/{TXN_ID}/abort",
        data={
            "producer_id": str(ids["producer_id"]),
            "producer_epoch": str(ids["producer_epoch"]),
            "start_time_ms": str(started),
        },
    )

    # Groups: a member (its join is the by-nature exception), heartbeats, commits, leave.
    member = client.post(f"/v1/groups/{GROUP}/heartbeat", json={"topics": [TOPIC]}).json()
    r.covered.add(("POST", "/v1/groups/{group_id}/heartbeat"))
    r.twice(
        "POST",
        "/v1/groups/{group_id}/heartbeat",
        f"/v1/groups/{GROUP}/heartbeat",
        json={"member_id": member["member_id"], "generation_id": member["generation_id"], "topics": [TOPIC]},
    )
    r.twice(
        "POST",
        "/v1/groups/{group_id}/offsets/commit",
        f"/v1/groups/{GROUP}/offsets/commit",
        json={
            "member_id": member["member_id"],
            "generation_id": member["generation_id"],
            "offsets": [{"topic": TOPIC, "partition": 1, "offset": 1}],
        },
    )
    r.twice("POST", "/v1/groups/{group_id}/leave", f"/v1/groups/{GROUP}/leave", json={"member_id": member["member_id"]})

    # Security administration.
    r.twice("POST", "/v1/principals", "/v1/principals", json={"name": "retried-user"})
    key = client.post("/v1/principals/retried-user/keys").json()
    r.twice("DELETE", "/v1/principals/{name}/keys/{key_id}", f"/v1/principals/retried-user/keys/{key['key_id']}")
    acl = r.twice(
        "POST",
        "/v1/acls",
        "/v1/acls",
        json={
            "principal": "retried-user",
            "resource_type": "Topic",
            "pattern_type": "literal",
            "resource_name": TOPIC,
            "operation": "Read",
        },
    ).json()
    r.twice("DELETE", "/v1/acls/{acl_id}", f"/v1/acls/{acl['acl_id']}")
    r.twice("DELETE", "/v1/principals/{name}", "/v1/principals/retried-user")

    app = server.extra["uvicorn"].config.app
    missing = state_changing_routes(app) - r.covered - {("POST", route) for route in BY_NATURE}
    assert not missing, f"state-changing endpoints this test does not retry: {sorted(missing)}"


def test_a_lost_answer_to_a_transactional_bump_is_answered_again(server):
    """KIP-360: the identical retry of InitProducerId(P, E) whose answer was lost gets the ids that
    bump issued; a new instance's InitProducerId in between makes it PRODUCER_FENCED again."""
    client = server.client
    first = client.post("/v1/producers/init", json={"transactional_id": "bumper", "transaction_timeout_ms": 60_000})
    body = {"transactional_id": "bumper", "transaction_timeout_ms": 60_000, **first.json()}
    bumped = client.post("/v1/producers/init", json=body)
    assert bumped.status_code == 200
    retried = client.post("/v1/producers/init", json=body)
    assert retried.status_code == 200, retried.text
    assert retried.json() == bumped.json()
    # The bumped ids work.
    ids = {"transactional_id": "bumper", **bumped.json()}
    client.post("/v1/topics", json={"name": "bumped", "partitions": 1})
    assert (
        client.post(
            "/v1/txn/add-partitions", json={**ids, "partitions": [{"topic": "bumped", "partition": 0}]}
        ).status_code
        == 200
    )
    # Once a transaction began, the old ids are fenced as before.
    late = client.post("/v1/producers/init", json=body)
    assert late.status_code == 409 and late.json()["error"]["code"] == "PRODUCER_FENCED"


def test_a_new_instance_forgets_the_retry(server):
    client = server.client
    first = client.post("/v1/producers/init", json={"transactional_id": "forgot", "transaction_timeout_ms": 60_000})
    body = {"transactional_id": "forgot", "transaction_timeout_ms": 60_000, **first.json()}
    assert client.post("/v1/producers/init", json=body).status_code == 200
    assert (
        client.post(
            "/v1/producers/init", json={"transactional_id": "forgot", "transaction_timeout_ms": 60_000}
        ).status_code
        == 200
    )
    late = client.post("/v1/producers/init", json=body)
    assert late.status_code == 409 and late.json()["error"]["code"] == "PRODUCER_FENCED"
