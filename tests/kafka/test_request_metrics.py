"""/metrics counts the Kafka door's requests as a Kafka broker's RequestMetrics do
(app/kafka/request_metrics.py): by API, with the error codes their answers carry and the time to
answer them; only fixed label values (a topic or client id a client sends never makes a series)."""

from __future__ import annotations

import struct

from kio.schema.errors import ErrorCode as KafkaError
from prometheus_client.parser import text_string_to_metric_families

from app.kafka import api_table
from tests.kafka.clients import ConfluentKafka, create_topic
from tests.kafka.raw import RawConnection, nested, request_of, response_class_of

HOSTILE_TOPIC = 'no"such\\topic\nname'


def scrape(server) -> dict[str, dict[tuple, float]]:
    """Each sample's value by metric name, then by its labels (sorted (name, value) pairs)."""
    response = server.client.get("/metrics")
    assert response.status_code == 200, response.text
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def requests_by_api(samples) -> dict[str, float]:
    return {dict(labels)["api"]: value for labels, value in samples.get("txbroker_kafka_requests_total", {}).items()}


def errors_by_api(samples) -> dict[tuple[str, str], float]:
    return {
        (dict(labels)["api"], dict(labels)["error"]): value
        for labels, value in samples.get("txbroker_kafka_request_errors_total", {}).items()
    }


def metadata_of(topic: str):
    return request_of(
        api_table.METADATA,
        12,
        topics=(nested(api_table.METADATA, 12, "MetadataRequestTopic", name=topic, topic_id=None),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def test_kafka_requests_are_counted_by_api_with_the_errors_their_answers_carry(kafka_server):
    create_topic(kafka_server, "counted", partitions=2)
    with RawConnection(kafka_server.extra["kafka_bootstrap"]) as connection:
        api_versions = request_of(
            api_table.API_VERSIONS, 3, client_software_name="raw-test", client_software_version="1"
        )
        assert connection.call(api_versions).error_code == KafkaError.none
        for topic in ("counted", "absent", HOSTILE_TOPIC):
            connection.call(metadata_of(topic))
    samples = scrape(kafka_server)
    assert requests_by_api(samples) == {"ApiVersions": 1, "Metadata": 3}
    # One per occurrence, by Kafka's name of the code; NONE is not an error.
    assert errors_by_api(samples) == {
        ("Metadata", "UNKNOWN_TOPIC_OR_PARTITION"): 1,
        ("Metadata", "INVALID_TOPIC_EXCEPTION"): 1,
    }
    assert samples["txbroker_kafka_request_seconds_count"] == {(("api", "ApiVersions"),): 1, (("api", "Metadata"),): 3}
    text = kafka_server.client.get("/metrics").text
    assert "# TYPE txbroker_kafka_requests_total counter" in text
    assert "# TYPE txbroker_kafka_request_seconds histogram" in text
    assert "absent" not in text and "such" not in text and "raw-test" not in text  # no topic or client id as a label


def test_a_real_clients_produce_and_fetch_are_counted_without_errors(kafka_server):
    create_topic(kafka_server, "traffic")
    client = ConfluentKafka()
    client.produce(kafka_server, "traffic", [{"value": b"one"}, {"value": b"two"}])
    assert [received.value for received in client.consume(kafka_server, "traffic", 0, 2)] == [b"one", b"two"]
    samples = scrape(kafka_server)
    served = requests_by_api(samples)
    assert served["Produce"] >= 1 and served["Fetch"] >= 1 and served["InitProducerId"] == 1, served
    assert not [key for key in errors_by_api(samples) if key[0] in ("Produce", "InitProducerId")], samples


def test_a_request_answered_by_closing_its_connection_is_counted_so(kafka_server):
    bootstrap = kafka_server.extra["kafka_bootstrap"]
    with RawConnection(bootstrap) as connection:  # a Metadata version this broker does not serve
        header = struct.pack(">hhih", api_table.METADATA, 99, 1, -1)
        connection.send_bytes(struct.pack(">i", len(header)) + header)
        assert connection.closed_by_peer()
    with RawConnection(bootstrap) as connection:  # ApiVersions of a version it does not know: v0's answer
        header = struct.pack(">hhih", api_table.API_VERSIONS, 99, 7, -1)
        connection.send_bytes(struct.pack(">i", len(header)) + header)
        answer = connection.receive(api_table.API_VERSIONS, 0, 7, response_class_of(api_table.API_VERSIONS, 0))
        assert answer.error_code == KafkaError.unsupported_version
    samples = scrape(kafka_server)
    assert requests_by_api(samples) == {"Metadata": 1, "ApiVersions": 1}
    assert errors_by_api(samples) == {("Metadata", "CONNECTION_CLOSED"): 1, ("ApiVersions", "UNSUPPORTED_VERSION"): 1}
