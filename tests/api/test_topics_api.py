"""Topics and cluster endpoints (docs/api.md, "Topics and cluster"), plus routing, OpenAPI and metrics."""

from __future__ import annotations

import itertools
import re

import pytest

DEFAULT_CONFIG = {
    "retention_ms": -1,
    "retention_bytes": -1,
    "max_message_bytes": 1048576,
    "cleanup_policy": "delete",
    "delete_retention_ms": 86400000,
}
INTERNAL_TOPICS = ("__transaction_state", "__consumer_offsets")


# One server (and database) for the module: a fresh one per test costs ~0.5 s. Tests that share it use
# names of their own (`fresh`); tests that count things server-wide use the per-test `server` fixture.
@pytest.fixture(scope="module")
def shared(module_server):
    return module_server


@pytest.fixture
def client(module_client):
    return module_client


_names = itertools.count()


def fresh(prefix="t"):
    """A topic name no other test of this module uses."""
    return f"{prefix}-{next(_names)}"


def create(client, name, partitions=1, config=None):
    body = {"name": name, "partitions": partitions}
    if config is not None:
        body["config"] = config
    return client.post("/v1/topics", json=body)


def assert_error(response, status, code):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "retriable"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["retriable"], bool)
    assert body["error"]["retriable"] is False
    assert body["error"]["message"]
    assert "Traceback" not in response.text
    return body["error"]


def produce(client, topic, partition, values):
    response = client.post(
        "/v1/produce",
        json={"partitions": [{"topic": topic, "partition": partition, "records": [{"value": v} for v in values]}]},
    )
    assert response.status_code == 200, response.text
    return response.json()["partitions"][0]


# ---- create


def test_create_returns_201_with_topic_body_and_default_config(client):
    name = fresh("orders")
    response = create(client, name, 3)
    assert response.status_code == 201
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", body["topic_id"])  # Kafka's topic id, as its tools print it
    assert body == {
        "name": name,
        "topic_id": body["topic_id"],
        "config": DEFAULT_CONFIG,
        "partitions": [
            {"partition": p, "log_start_offset": 0, "high_watermark": 0, "last_stable_offset": 0} for p in range(3)
        ],
    }


def test_create_without_partitions_or_config_defaults_to_one_partition(client):
    response = client.post("/v1/topics", json={"name": fresh()})
    assert response.status_code == 201
    assert [p["partition"] for p in response.json()["partitions"]] == [0]
    assert response.json()["config"] == DEFAULT_CONFIG


def test_create_fills_in_defaults_for_config_keys_not_given(client):
    response = create(client, fresh(), 1, {"max_message_bytes": 100})
    assert response.status_code == 201
    assert response.json()["config"] == {**DEFAULT_CONFIG, "max_message_bytes": 100}


def test_create_accepts_all_config_keys_and_describe_returns_them(client):
    name = fresh()
    config = {
        "retention_ms": 60000,
        "retention_bytes": 1 << 40,
        "max_message_bytes": 1,
        "cleanup_policy": "compact,delete",
        "delete_retention_ms": 0,
    }
    response = create(client, name, 2, config)
    assert response.status_code == 201
    assert response.json()["config"] == config
    assert client.get(f"/v1/topics/{name}").json()["config"] == config


def test_create_takes_the_timestamp_bounds_and_shows_them(client):
    """Kafka's message.timestamp.before.max.ms and after.max.ms: any value >= 0 is kept (and applied
    to produces, tests/api/test_bad_input.py); a negative one is Kafka's INVALID_CONFIG."""
    name = fresh("bounds")
    bounds = {"message_timestamp_before_max_ms": 0, "message_timestamp_after_max_ms": 60000}
    response = create(client, name, 1, bounds)
    assert response.status_code == 201, response.text
    assert client.get(f"/v1/topics/{name}").json()["config"] == {**DEFAULT_CONFIG, **bounds}
    error = assert_error(create(client, fresh(), 1, {"message_timestamp_after_max_ms": -1}), 400, "INVALID_CONFIG")
    assert error["message"].startswith(
        "Invalid value -1 for configuration message.timestamp.after.max.ms: Value must be at least 0"
    )


def test_create_existing_topic_is_409_topic_already_exists(client):
    name = fresh("dup")
    assert create(client, name, 1).status_code == 201
    error = assert_error(create(client, name, 4), 409, "TOPIC_ALREADY_EXISTS")
    assert name in error["message"]
    # The original is untouched.
    assert len(client.get(f"/v1/topics/{name}").json()["partitions"]) == 1


@pytest.mark.parametrize("name", ["", ".", "..", "a b", "x" * 250, "__x", "a/b", "ü", "a\tb", "a:b", "tab\n"])
def test_create_with_invalid_name_is_invalid_topic_exception(client, name):
    error = assert_error(create(client, name), 400, "INVALID_TOPIC_EXCEPTION")
    assert "name" in error["message"]


@pytest.mark.parametrize("name", ["a", "x" * 249, "A.b_c-9", "_x", "x__", "...a", "-"])
def test_create_with_valid_edge_names_succeeds(client, name):
    response = create(client, name)
    assert response.status_code == 201, response.text
    assert response.json()["name"] == name


def test_names_are_case_sensitive(client):
    name = fresh("Case")
    assert create(client, name).status_code == 201
    assert create(client, name.lower()).status_code == 201


@pytest.mark.parametrize("partitions", [0, -1, 10001, 2**40])
def test_create_with_bad_partition_count_is_invalid_partitions(client, partitions):
    name = fresh()
    error = assert_error(create(client, name, partitions), 400, "INVALID_PARTITIONS")
    assert str(partitions) in error["message"]
    assert_error(client.get(f"/v1/topics/{name}"), 404, "UNKNOWN_TOPIC_OR_PARTITION")


def test_create_with_10000_partitions_is_allowed(client):
    name = fresh("wide")
    response = create(client, name, 10000)
    assert response.status_code == 201
    assert len(response.json()["partitions"]) == 10000
    assert response.json()["partitions"][-1]["partition"] == 9999
    assert client.delete(f"/v1/topics/{name}").status_code == 204  # keeps /metrics small for the others


@pytest.mark.parametrize(
    "config",
    [
        {"unknown_key": 1},
        {"cleanup.policy": "compact"},
        {"max_message_bytes": -5},
        {"max_message_bytes": 0},
        {"max_message_bytes": "100"},
        {"max_message_bytes": 1.5},
        {"max_message_bytes": True},
        {"max_message_bytes": None},
        {"retention_ms": -2},
        {"retention_bytes": -2},
        {"retention_ms": 2**63},
        {"cleanup_policy": "forever"},
        {"cleanup_policy": 1},
        {"cleanup_policy": "compact,"},
        {"delete_retention_ms": -1},
    ],
)
def test_create_with_bad_config_is_invalid_config(client, config):
    name = fresh()
    error = assert_error(create(client, name, 1, config), 400, "INVALID_CONFIG")
    assert list(config)[0] in error["message"]
    assert_error(client.get(f"/v1/topics/{name}"), 404, "UNKNOWN_TOPIC_OR_PARTITION")


# ---- list, describe, cluster


def test_list_topics_includes_created_topics_with_partitions_and_config(client):
    first, second = fresh("b"), fresh("a")
    create(client, first, 2)
    create(client, second, 1, {"retention_ms": 5})
    response = client.get("/v1/topics")
    assert response.status_code == 200
    by_name = {topic["name"]: topic for topic in response.json()["topics"]}
    assert by_name[second]["config"] == {**DEFAULT_CONFIG, "retention_ms": 5}
    assert [p["partition"] for p in by_name[first]["partitions"]] == [0, 1]
    assert by_name[first]["config"] == DEFAULT_CONFIG


def test_describe_reports_high_watermark_after_writes(client):
    name = fresh()
    create(client, name, 2)
    produce(client, name, 1, ["a", "b", "c"])
    response = client.get(f"/v1/topics/{name}")
    assert response.status_code == 200
    assert response.json()["partitions"] == [
        {"partition": 0, "log_start_offset": 0, "high_watermark": 0, "last_stable_offset": 0},
        {"partition": 1, "log_start_offset": 0, "high_watermark": 3, "last_stable_offset": 3},
    ]


def test_describe_unknown_topic_is_404(client):
    error = assert_error(client.get("/v1/topics/missing"), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert "missing" in error["message"]


def test_internal_topics_are_listed_in_topics_and_cluster(client, shared):
    listed = {topic["name"]: topic for topic in client.get("/v1/topics").json()["topics"]}
    for name in INTERNAL_TOPICS:
        assert name in listed
    assert len(listed["__transaction_state"]["partitions"]) == shared.settings.transaction_log_partitions
    assert len(listed["__consumer_offsets"]["partitions"]) == shared.settings.offsets_partitions
    cluster = client.get("/v1/cluster")
    assert cluster.status_code == 200
    for name in INTERNAL_TOPICS:
        assert name in cluster.json()["topics"]


def test_internal_topics_can_be_described(client):
    for name in INTERNAL_TOPICS:
        response = client.get(f"/v1/topics/{name}")
        assert response.status_code == 200
        assert response.json()["name"] == name


def test_internal_topic_partition_counts_follow_settings(make_server):
    server = make_server(transaction_log_partitions=3, offsets_partitions=5)
    assert len(server.client.get("/v1/topics/__transaction_state").json()["partitions"]) == 3
    assert len(server.client.get("/v1/topics/__consumer_offsets").json()["partitions"]) == 5


def test_cluster_describes_this_node_and_topic_names(client, shared):
    name = fresh()
    create(client, name)
    body = client.get("/v1/cluster").json()
    assert body["node_id"] == shared.settings.node_id
    assert body["nodes"] == [{"node_id": shared.settings.node_id, "url": shared.settings.public_url()}]
    assert name in body["topics"]
    assert all(isinstance(topic, str) for topic in body["topics"])


def test_fresh_database_has_only_the_internal_topics(server):
    assert sorted(server.client.get("/v1/cluster").json()["topics"]) == sorted(INTERNAL_TOPICS)
    assert sorted(t["name"] for t in server.client.get("/v1/topics").json()["topics"]) == sorted(INTERNAL_TOPICS)


def test_health_is_ok(client):
    response = client.get("/v1/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok"}


# ---- delete


def test_delete_is_204_then_describe_is_404(client):
    name = fresh("gone")
    create(client, name, 2)
    response = client.delete(f"/v1/topics/{name}")
    assert response.status_code == 204
    assert response.content == b""
    assert_error(client.get(f"/v1/topics/{name}"), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert name not in [t["name"] for t in client.get("/v1/topics").json()["topics"]]
    assert name not in client.get("/v1/cluster").json()["topics"]


def test_delete_unknown_topic_is_404(client):
    assert_error(client.delete("/v1/topics/never-created"), 404, "UNKNOWN_TOPIC_OR_PARTITION")


def test_delete_twice_second_is_404(client):
    name = fresh()
    create(client, name)
    assert client.delete(f"/v1/topics/{name}").status_code == 204
    assert_error(client.delete(f"/v1/topics/{name}"), 404, "UNKNOWN_TOPIC_OR_PARTITION")


def test_delete_leaves_other_topics_alone(client):
    keep, drop = fresh("keep"), fresh("drop")
    create(client, keep)
    create(client, drop)
    produce(client, keep, 0, ["k1", "k2"])
    produce(client, drop, 0, ["d1"])
    assert client.delete(f"/v1/topics/{drop}").status_code == 204
    records = client.get(f"/v1/topics/{keep}/partitions/0/records").json()["records"]
    assert [r["value"] for r in records] == ["k1", "k2"]


def test_deleted_topic_rejects_produce_with_unknown_topic(client):
    name = fresh("dead")
    create(client, name)
    client.delete(f"/v1/topics/{name}")
    response = client.post(
        "/v1/produce", json={"partitions": [{"topic": name, "partition": 0, "records": [{"value": "x"}]}]}
    )
    assert response.status_code == 200
    assert response.json()["partitions"][0]["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"


def test_deleted_and_recreated_topic_starts_empty_at_offset_zero(client):
    name = fresh("phoenix")
    create(client, name, 1)
    produce(client, name, 0, ["old-1", "old-2", "old-3"])
    assert client.delete(f"/v1/topics/{name}").status_code == 204
    assert create(client, name, 2).status_code == 201
    described = client.get(f"/v1/topics/{name}").json()
    assert [p["high_watermark"] for p in described["partitions"]] == [0, 0]
    fetched = client.post("/v1/fetch", json={"partitions": [{"topic": name, "partition": 0, "offset": 0}]})
    assert fetched.json()["partitions"][0]["records"] == []
    assert fetched.json()["partitions"][0]["high_watermark"] == 0
    result = produce(client, name, 0, ["new"])
    assert (result["base_offset"], result["last_offset"]) == (0, 0)
    records = client.get(f"/v1/topics/{name}/partitions/0/records").json()["records"]
    assert [(r["offset"], r["value"]) for r in records] == [(0, "new")]


# ---- internal topics are read-only for clients


@pytest.mark.parametrize("name", INTERNAL_TOPICS)
def test_internal_topic_cannot_be_deleted(client, name):
    error = assert_error(client.delete(f"/v1/topics/{name}"), 400, "INVALID_TOPIC_EXCEPTION")
    assert name in error["message"]
    assert client.get(f"/v1/topics/{name}").status_code == 200


@pytest.mark.parametrize("name", INTERNAL_TOPICS)
def test_internal_topic_cannot_be_created(client, name):
    assert_error(create(client, name, 1), 400, "INVALID_TOPIC_EXCEPTION")


def _internal_high_watermarks(client, name):
    return [p["high_watermark"] for p in client.get(f"/v1/topics/{name}").json()["partitions"]]


def _produce_error(response):
    """The error of a one-partition produce, whether request-level or partition-level (docs/api.md does
    not say which INVALID_TOPIC_EXCEPTION is)."""
    if response.status_code == 200:
        return response.json()["partitions"][0]["error"]
    assert response.status_code == 400, response.text
    return response.json()["error"]


@pytest.mark.parametrize("name", INTERNAL_TOPICS)
def test_internal_topic_cannot_be_written_by_produce(client, name):
    before = _internal_high_watermarks(client, name)
    response = client.post(
        "/v1/produce", json={"partitions": [{"topic": name, "partition": 0, "records": [{"value": "sneaky"}]}]}
    )
    error = _produce_error(response)
    assert error["code"] == "INVALID_TOPIC_EXCEPTION"
    assert name in error["message"]
    assert _internal_high_watermarks(client, name) == before


@pytest.mark.parametrize("name", INTERNAL_TOPICS)
@pytest.mark.parametrize("partition", [0, None])
def test_internal_topic_cannot_be_written_by_records_endpoint(client, name, partition):
    before = _internal_high_watermarks(client, name)
    response = client.post(
        f"/v1/topics/{name}/records", json={"partition": partition, "records": [{"key": "k", "value": "v"}]}
    )
    assert_error(response, 400, "INVALID_TOPIC_EXCEPTION")
    assert _internal_high_watermarks(client, name) == before


# ---- routing, OpenAPI, metrics


def test_root_redirects_to_console(client):
    response = client.get("/", follow_redirects=False)
    assert response.status_code in (301, 302, 303, 307, 308)
    assert response.headers["location"].endswith("/console")


@pytest.mark.parametrize("path", ["/nope", "/v1/nope", "/v1/topics/a/b/c/d"])
def test_unknown_route_is_404_not_found_in_error_format(client, path):
    error = assert_error(client.get(path), 404, "NOT_FOUND")
    assert path in error["message"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/v1/topics"),
        ("GET", "/v1/produce"),
        ("GET", "/v1/fetch"),
        ("DELETE", "/v1/cluster"),
        ("PATCH", "/v1/topics/x"),
        ("POST", "/v1/health"),
    ],
)
def test_wrong_method_is_405_method_not_allowed_in_error_format(client, method, path):
    error = assert_error(client.request(method, path), 405, "METHOD_NOT_ALLOWED")
    assert method in error["message"]


# Every endpoint of docs/api.md, in its words. The topics, produce and fetch ones must exist; the others are
# checked once the server routes them.
API_MD_ENDPOINTS = [
    ("GET", "/v1/health"),
    ("GET", "/v1/cluster"),
    ("POST", "/v1/topics"),
    ("GET", "/v1/topics"),
    ("GET", "/v1/topics/{topic}"),
    ("DELETE", "/v1/topics/{topic}"),
    ("POST", "/v1/produce"),
    ("POST", "/v1/topics/{topic}/records"),
    ("POST", "/v1/fetch"),
    ("GET", "/v1/topics/{topic}/partitions/{partition}/records"),
    ("POST", "/v1/offsets/list"),
    ("GET", "/metrics"),
    ("POST", "/v1/coordinators/find"),
    ("POST", "/v1/producers/init"),
    ("POST", "/v1/txn/add-partitions"),
    ("POST", "/v1/txn/add-offsets"),
    ("POST", "/v1/txn/offset-commit"),
    ("POST", "/v1/txn/end"),
    ("POST", "/v1/txn/prepare"),
    ("POST", "/v1/groups/{group_id}/heartbeat"),
    ("POST", "/v1/groups/{group_id}/leave"),
    ("POST", "/v1/groups/{group_id}/offsets/commit"),
    ("POST", "/v1/groups/{group_id}/offsets/fetch"),
    ("GET", "/v1/groups"),
    ("GET", "/v1/groups/{group_id}"),
    ("GET", "/v1/transactions"),
    ("GET", "/v1/transactions/{transactional_id}"),
    ("POST", "/v1/transactions/{transactional_id}/abort"),
    ("GET", "/v1/topics/{topic}/partitions/{partition}/producers"),
    ("GET", "/v1/topics/{topic}/partitions/{partition}/markers"),
    ("POST", "/v1/topics/{topic}/partitions"),
]
REQUIRED_SO_FAR = API_MD_ENDPOINTS[:12]


def _routed(client, method, path):
    """Whether the server has a route for this method and path (probed with harmless values: an empty
    body, an unknown topic/group/transactional id)."""
    concrete = (
        path.replace("{topic}", "openapi-probe-missing")
        .replace("{partition}", "0")
        .replace("{group_id}", "openapi-probe-group")
        .replace("{transactional_id}", "openapi-probe-txn")
    )
    response = client.request(method, concrete, json={} if method == "POST" else None)
    if response.status_code in (404, 405) and response.headers.get("content-type", "").startswith("application/json"):
        return response.json().get("error", {}).get("code") not in ("NOT_FOUND", "METHOD_NOT_ALLOWED")
    return True


def test_openapi_lists_every_api_md_endpoint_the_server_routes(client):
    response = client.get("/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for method, path in REQUIRED_SO_FAR:
        assert _routed(client, method, path), (method, path)
    missing = [
        (method, path)
        for method, path in API_MD_ENDPOINTS
        if _routed(client, method, path) and method.lower() not in paths.get(path, {})
    ]
    assert missing == []


def test_metrics_is_prometheus_text_with_request_counter_and_high_watermark(server):
    create(server.client, "metered", 2)
    produce(server.client, "metered", 1, ["a", "b"])
    response = server.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert "# TYPE txbroker_http_requests_total counter" in text
    assert re.search(
        r'^txbroker_http_requests_total\{[^}]*route="/v1/produce"[^}]*status="200"[^}]*\} 1\.0$', text, re.M
    ), text
    lines = {line for line in text.splitlines() if line.startswith("txbroker_partition_high_watermark{")}
    assert any('topic="metered"' in line and 'partition="1"' in line and line.endswith(" 2.0") for line in lines), lines
    assert any('topic="metered"' in line and 'partition="0"' in line and line.endswith(" 0.0") for line in lines), lines


def test_metrics_drop_deleted_topics(client):
    name = fresh("ephemeral")
    create(client, name)
    assert f'topic="{name}"' in client.get("/metrics").text
    client.delete(f"/v1/topics/{name}")
    assert f'topic="{name}"' not in client.get("/metrics").text


def test_metrics_count_requests_by_route_template_not_raw_path(server):
    server.client.get("/v1/topics/one-unknown")
    server.client.get("/v1/topics/another-unknown")
    # A group id may hold "/" (its routes match it with a convertor): the label is the template still.
    server.client.get("/v1/groups/some/group")
    text = server.client.get("/metrics").text
    assert re.search(
        r'^txbroker_http_requests_total\{[^}]*route="/v1/topics/\{topic\}"[^}]*status="404"[^}]*\} 2\.0$', text, re.M
    ), text
    assert re.search(
        r'^txbroker_http_requests_total\{[^}]*route="/v1/groups/\{group_id\}"[^}]*status="404"[^}]*\} 1\.0$', text, re.M
    ), text
    assert "one-unknown" not in text and "some/group" not in text


def test_metrics_count_methods_the_api_does_not_serve_as_one(server):
    """HTTP's parser takes dozens of methods (WebDAV's, ...): each was a series of its own per route
    and status, which any client could add; they are counted as `_OTHER`."""
    for method in ("PROPFIND", "MKCOL", "SEARCH", "UNLOCK"):
        assert server.client.request(method, "/v1/topics").status_code == 405
    server.client.request("PROPPATCH", "/no/such/path")
    text = server.client.get("/metrics").text
    methods = set(re.findall(r'^txbroker_http_requests_total\{[^}]*method="([^"]*)"', text, re.M))
    assert methods <= {"GET", "POST", "_OTHER"}, methods
    assert re.search(
        r'^txbroker_http_requests_total\{method="_OTHER",route="/v1/topics",status="405"\} 4\.0$', text, re.M
    ), text
    assert re.search(
        r'^txbroker_http_requests_total\{method="_OTHER",route="unmatched",status="\d+"\} 1\.0$', text, re.M
    )


def test_metrics_have_the_same_series_with_one_worker_as_with_several(server):
    """The `_created` series prometheus-client adds in one process, not in the multiprocess mode of
    `serve --workers N`, are left out: a dashboard or alert sees the same series either way."""
    server.client.get("/v1/topics")
    text = server.client.get("/metrics").text
    assert "txbroker_http_requests_total{" in text
    assert "_created" not in text, [line for line in text.splitlines() if "_created" in line][:5]


def test_metrics_count_the_requests_refused_before_routing(server):
    """A request to a name that is not loopback's (DNS rebinding) and a cross-site write are refused
    by middlewares before any route: they were answered 400 and counted nowhere."""
    rebound = server.client.get("/v1/topics", headers={"Host": "attacker.example"})
    assert rebound.status_code == 400
    cross_site = server.client.post("/v1/topics", json={"name": "x"}, headers={"Origin": "https://attacker.example"})
    assert cross_site.status_code == 400
    text = server.client.get("/metrics").text
    for method in ("GET", "POST"):
        assert re.search(
            rf'^txbroker_http_requests_total\{{method="{method}",route="unmatched",status="400"\}} 1\.0$', text, re.M
        ), text
