"""With the server's certificate (`ssl_certfile`, `ssl_keyfile`, as HTTPS) the Kafka listener speaks TLS:
SASL_SSL with `--auth required`, SSL with auth off; the certificate is the self-signed one HTTPS's
test makes, for 127.0.0.1, which the clients check."""

from __future__ import annotations

import ssl

import pytest
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.api.test_tls import NEEDS_OPENSSL, make_certificate
from tests.conftest import start_server_on_fresh_database, stop_in_process_server
from tests.kafka.clients import ConfluentKafka
from tests.kafka.raw import RawConnection, request_of
from tests.kafka.test_security import (
    ADMIN_TOKEN,
    CLIENTS,
    admin_client,
    api_versions,
    new_principal,
    reader_and_writer,
    round_trip,
)

pytestmark = NEEDS_OPENSSL

TOPIC = "over-tls"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    return make_certificate(tmp_path_factory.mktemp("kafka-tls"))


@pytest.fixture(scope="module")
def sasl_ssl(postgres, certificate):
    cert, key = certificate
    server = start_server_on_fresh_database(
        postgres,
        "kafka_sasl_ssl",
        kafka_listener="127.0.0.1:0",
        auth="required",
        admin_token=ADMIN_TOKEN,
        ssl_certfile=cert,
        ssl_keyfile=key,
    )
    yield server
    stop_in_process_server(server)


@pytest.fixture(scope="module")
def ssl_only(postgres, certificate):
    cert, key = certificate
    server = start_server_on_fresh_database(
        postgres, "kafka_ssl", kafka_listener="127.0.0.1:0", ssl_certfile=cert, ssl_keyfile=key
    )
    yield server
    stop_in_process_server(server)


def tls_settings(client: str, cert) -> dict:
    """What each client's config adds to its SASL_PLAINTEXT one for SASL_SSL, trusting `cert`."""
    if client == "confluent-kafka":
        return {"security.protocol": "SASL_SSL", "ssl.ca.location": str(cert)}
    if client == "kafka-python":
        return {"security_protocol": "SASL_SSL", "ssl_cafile": str(cert)}
    from aiokafka.helpers import create_ssl_context

    return {"security_protocol": "SASL_SSL", "ssl_context": create_ssl_context(cafile=str(cert))}


@pytest.mark.parametrize("client", CLIENTS)
def test_sasl_ssl_produce_and_consume(sasl_ssl, certificate, client):
    topic = f"{TOPIC}-{client}"
    with admin_client(sasl_ssl) as admin:
        admin.post("/v1/topics", json={"name": topic, "partitions": 1, "config": {}}).raise_for_status()
    username = f"tls-{client}"
    _, api_key = new_principal(sasl_ssl, username, *reader_and_writer(topic))
    values = [f"{client}-tls-{i}".encode() for i in range(3)]
    tls = tls_settings(client, certificate[0])
    assert round_trip(client, sasl_ssl, username, api_key, topic, values, **tls) == values


def tls_connection(server, cert) -> RawConnection:
    connection = RawConnection(server.extra["kafka_bootstrap"])
    context = ssl.create_default_context(cafile=str(cert))
    connection.sock = context.wrap_socket(connection.sock, server_hostname="127.0.0.1")
    return connection


def test_ssl_without_auth_serves_anonymous_and_answers_sasl_with_illegal_state(ssl_only, certificate):
    cert = certificate[0]
    ssl_only.client.post("/v1/topics", json={"name": TOPIC, "partitions": 1, "config": {}}).raise_for_status()
    tls = {"security.protocol": "SSL", "ssl.ca.location": str(cert)}
    ConfluentKafka().produce(ssl_only, TOPIC, [{"value": b"over-ssl"}], **tls)
    assert [r.value for r in ConfluentKafka().consume(ssl_only, TOPIC, 0, 1, **tls)] == [b"over-ssl"]
    # A client configured for SASL against a listener without it: Kafka's answer on a PLAINTEXT / SSL listener.
    with tls_connection(ssl_only, cert) as connection:
        assert connection.call(api_versions()).error_code == KafkaError.none
        handshake = connection.call(request_of(api_table.SASL_HANDSHAKE, 1, mechanism="PLAIN"))
        assert handshake.error_code == KafkaError.illegal_sasl_state
        authenticate = connection.call(request_of(api_table.SASL_AUTHENTICATE, 2, auth_bytes=b"\0u\0p"))
        assert authenticate.error_code == KafkaError.illegal_sasl_state
        assert connection.call(api_versions()).error_code == KafkaError.none


def test_plaintext_on_the_tls_listener_gets_no_kafka_answer(ssl_only):
    with RawConnection(ssl_only.extra["kafka_bootstrap"]) as connection:
        connection.send(api_versions())
        assert connection.closed_by_peer()
