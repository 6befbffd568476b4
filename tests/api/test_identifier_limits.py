"""Identifiers have a documented limit (schemas.MAX_IDENTIFIER_BYTES, in UTF-8 bytes): a longer
transactional id, group id, member id, principal or ACL name is 400 INVALID_REQUEST naming the field,
never a 500 from PostgreSQL's index row limit; the console's query parameters likewise."""

from __future__ import annotations

import random
import string

import pytest

from app.api.schemas import MAX_IDENTIFIER_BYTES


def incompressible(length: int) -> str:
    """Random letters: PostgreSQL cannot compress them under its index row limit."""
    rng = random.Random(length)
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(length))


LONG = incompressible(8_000)


def assert_refused(response, field: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "INVALID_REQUEST" and field in error["message"], error


@pytest.fixture
def ready(module_client):
    module_client.post("/v1/topics", json={"name": "limits", "partitions": 1})
    return module_client


def test_a_long_transactional_id_is_refused_by_name(ready):
    assert_refused(
        ready.post("/v1/producers/init", json={"transactional_id": LONG, "transaction_timeout_ms": 1000}),
        "transactional_id",
    )
    assert_refused(
        ready.post(
            "/v1/produce",
            json={
                "transactional_id": LONG,
                "producer_id": 1,
                "producer_epoch": 0,
                "partitions": [{"topic": "limits", "partition": 0, "base_sequence": 0, "records": [{"value": "v"}]}],
            },
        ),
        "transactional_id",
    )
    assert_refused(
        ready.post(
            "/v1/txn/end", json={"transactional_id": LONG, "producer_id": 1, "producer_epoch": 0, "committed": True}
        ),
        "transactional_id",
    )


def test_a_long_group_id_is_refused_in_the_path_and_in_bodies(ready):
    group = incompressible(6_000)
    assert_refused(ready.post(f"/v1/groups/{group}/heartbeat", json={"topics": ["limits"]}), "group_id")
    assert_refused(
        ready.post(
            f"/v1/groups/{group}/offsets/commit", json={"offsets": [{"topic": "limits", "partition": 0, "offset": 1}]}
        ),
        "group_id",
    )
    init = ready.post("/v1/producers/init", json={"transactional_id": "limits-app", "transaction_timeout_ms": 60_000})
    ids = {"transactional_id": "limits-app", **init.json()}
    assert_refused(ready.post("/v1/txn/add-offsets", json={**ids, "group_id": group}), "group_id")
    assert_refused(
        ready.post(
            "/v1/txn/offset-commit",
            json={**ids, "group_id": group, "offsets": [{"topic": "limits", "partition": 0, "offset": 1}]},
        ),
        "group_id",
    )
    assert ready.get("/v1/transactions/limits-app").json()["state"] == "Empty"


def test_a_long_member_id_is_refused(ready):
    assert_refused(
        ready.post("/v1/groups/limits-group/heartbeat", json={"member_id": LONG, "topics": ["limits"]}), "member_id"
    )
    assert_refused(ready.post("/v1/groups/limits-group/leave", json={"member_id": LONG}), "member_id")


def test_long_acl_and_principal_names_are_refused(ready):
    assert_refused(
        ready.post(
            "/v1/acls",
            json={
                "principal": "someone",
                "resource_type": "Topic",
                "resource_name": incompressible(6_000),
                "operation": "Read",
            },
        ),
        "resource_name",
    )
    # The limit is the core's ACL addition's (the Kafka door's CreateAcls shares it): its boundary.
    rule = {"principal": "someone", "resource_type": "Topic", "operation": "Read"}
    at_limit = ready.post("/v1/acls", json={**rule, "resource_name": "r" * MAX_IDENTIFIER_BYTES})
    assert at_limit.status_code == 201, at_limit.text
    assert_refused(
        ready.post("/v1/acls", json={**rule, "resource_name": "r" * (MAX_IDENTIFIER_BYTES + 1)}), "resource_name"
    )
    assert_refused(ready.post("/v1/principals", json={"name": incompressible(3_000)}), "name")
    assert ready.delete(f"/v1/principals/{incompressible(3_000)}").status_code in (400, 404)


def test_the_limit_counts_utf8_bytes_and_its_boundary_is_accepted(ready):
    at_limit = "x" * MAX_IDENTIFIER_BYTES
    assert (
        ready.post(
            "/v1/producers/init", json={"transactional_id": at_limit, "transaction_timeout_ms": 60_000}
        ).status_code
        == 200
    )
    four_byte_chars = "\N{GRINNING FACE}" * (MAX_IDENTIFIER_BYTES // 4 + 1)  # few characters, too many bytes
    assert_refused(
        ready.post("/v1/producers/init", json={"transactional_id": four_byte_chars, "transaction_timeout_ms": 60_000}),
        "transactional_id",
    )


@pytest.mark.parametrize(
    "path",
    [
        "/console/groups/limits-group?offsets_after=t:99999999999",
        "/console/groups/limits-group?pending_after=t:0:99999999999999999999",
        "/console/topics/limits?after=99999999999",
        "/console/topics/limits/partitions/99999999999",
        "/console/transactions?older_than=99999999999999999999d",
        f"/console/groups/{LONG}",
        f"/console/transactions/{LONG}",
    ],
)
def test_console_query_parameters_out_of_range_are_not_server_errors(ready, path):
    ready.post(
        "/v1/groups/limits-group/offsets/commit", json={"offsets": [{"topic": "limits", "partition": 0, "offset": 1}]}
    )
    response = ready.get(path)
    assert response.status_code < 500, (path, response.status_code, response.text[:500])
