"""SASL/SCRAM-SHA-256 and -512 on the Kafka listener of a server with `--auth required`, beside
PLAIN (app/kafka/sasl.py), and the credentials' administration by both doors: Kafka's
AlterUserScramCredentials and DescribeUserScramCredentials (KIP-554, app/kafka/handlers/scram.py)
and HTTP's /v1/principals/{name}/scram-credentials. Raw requests for Kafka's rules (scramp's client
plays the SCRAM exchange), then the real clients; one server for the module."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import asyncpg
import httpx
import pytest
from confluent_kafka import KafkaError as ConfluentError
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from kafka.net.sasl.scram import ScramClient as KafkaPythonScramClient
from kio.schema.errors import ErrorCode as KafkaError
from scramp import ScramClient

from app.kafka import api_table
from app.kafka.sasl import INVALID_CREDENTIALS
from tests.concurrency.lock_waits import wait_for_lock_waits
from tests.conftest import start_server_on_fresh_database, stop_in_process_server
from tests.kafka.clients import WAIT_S, ConfluentKafka
from tests.kafka.raw import RawConnection, nested, request_of
from tests.kafka.test_security import (
    GROUP_PREFIX,
    aiokafka_consume,
    aiokafka_produce,
    assert_confluent_kafka_fails_authentication,
    confluent_produce,
    handshake,
    kafka_python_consume,
    kafka_python_produce,
    log_in,
    reader_and_writer,
    rule,
    sasl_authenticate,
    topic_error,
)

ADMIN_TOKEN = "admin-secret"
TOPIC = "scram-guarded"
OTHER_TOPIC = "scram-unreadable"
SHA_256, SHA_512 = "SCRAM-SHA-256", "SCRAM-SHA-512"
MECHANISMS = [SHA_256, SHA_512]
KAFKA_CODES = {SHA_256: 1, SHA_512: 2}
PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def secured(postgres):
    server = start_server_on_fresh_database(
        postgres, "kafka_scram", kafka_listener="127.0.0.1:0", auth="required", admin_token=ADMIN_TOKEN
    )
    with admin_http(server) as admin:
        for topic in (TOPIC, OTHER_TOPIC):
            admin.post("/v1/topics", json={"name": topic, "partitions": 1, "config": {}}).raise_for_status()
    yield server
    stop_in_process_server(server)


def admin_http(server) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)


def new_principal(server, name: str, *rules: dict) -> str:
    """The API key of a new principal with these ACL rules."""
    with admin_http(server) as admin:
        admin.post("/v1/principals", json={"name": name}).raise_for_status()
        for acl in rules:
            admin.post("/v1/acls", json={"principal": name, **acl}).raise_for_status()
        return admin.post(f"/v1/principals/{name}/keys").json()["token"]


def set_password(server, name: str, mechanism: str, password: str = PASSWORD, iterations: int = 4096):
    with admin_http(server) as admin:
        return admin.put(
            f"/v1/principals/{name}/scram-credentials/{mechanism}",
            json={"password": password, "iterations": iterations},
        )


@pytest.fixture(scope="module")
def scram_reader(secured) -> str:
    """A principal that may read and write TOPIC only, with a credential for both mechanisms."""
    new_principal(secured, "scram-reader", *reader_and_writer(TOPIC))
    for mechanism in MECHANISMS:
        set_password(secured, "scram-reader", mechanism).raise_for_status()
    return "scram-reader"


# ---- raw: the exchange


def scram_log_in(connection: RawConnection, username: str, password: str, mechanism: str):
    """SCRAM's two round trips with scramp's client; the last SaslAuthenticate answer (the server's
    signature checked when it succeeded)."""
    assert handshake(connection, mechanism).error_code == KafkaError.none
    client = ScramClient([mechanism], username, password)
    first = sasl_authenticate(connection, client.get_client_first().encode())
    if first.error_code != KafkaError.none:
        return first
    client.set_server_first(first.auth_bytes.decode())
    final = sasl_authenticate(connection, client.get_client_final().encode())
    if final.error_code == KafkaError.none:
        client.set_server_final(final.auth_bytes.decode())  # raises unless the server knew the key
    return final


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_scram_authenticates_and_the_principals_acls_apply(secured, scram_reader, mechanism):
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        answer = scram_log_in(connection, scram_reader, PASSWORD, mechanism)
        assert (answer.error_code, answer.error_message) == (KafkaError.none, None)
        assert topic_error(connection, TOPIC) == KafkaError.none
        assert topic_error(connection, OTHER_TOPIC) == KafkaError.topic_authorization_failed


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_wrong_password_or_unknown_user_fails_with_plains_message(secured, scram_reader, mechanism):
    bootstrap = secured.extra["kafka_bootstrap"]
    for username, password in [(scram_reader, "wrong"), ("nobody", PASSWORD)]:
        with RawConnection(bootstrap) as connection:
            answer = scram_log_in(connection, username, password, mechanism)
            assert (answer.error_code, answer.error_message) == (
                KafkaError.sasl_authentication_failed,
                INVALID_CREDENTIALS,
            )
            assert connection.closed_by_peer()


def test_a_first_message_with_an_authorization_id_is_refused(secured, scram_reader):
    """scramp takes no authzid in the GS2 header (Kafka takes one equal to the username); no Kafka
    client sends one."""
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert handshake(connection, SHA_256).error_code == KafkaError.none
        answer = sasl_authenticate(connection, f"n,a={scram_reader},n={scram_reader},r=nonce".encode())
        assert answer.error_code == KafkaError.sasl_authentication_failed
        assert answer.error_message.startswith(
            "Invalid SCRAM-SHA-256 client first message: The GS2 authzid must be empty"
        )
        assert connection.closed_by_peer()


def test_a_principal_without_a_credential_for_the_mechanism_is_refused(secured):
    new_principal(secured, "sha256-only")
    set_password(secured, "sha256-only", SHA_256).raise_for_status()
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert scram_log_in(connection, "sha256-only", PASSWORD, SHA_512).error_code == (
            KafkaError.sasl_authentication_failed
        )


def test_scram_over_the_unframed_tokens_of_sasl_handshake_v0(secured, scram_reader):
    """After SaslHandshake v0 (before Kafka 1.0) SASL's messages come unframed, each answered with
    the server's token framed."""
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert handshake(connection, SHA_256, version=0).error_code == KafkaError.none
        client = ScramClient([SHA_256], scram_reader, PASSWORD)
        for send, receive in [
            (client.get_client_first, client.set_server_first),
            (client.get_client_final, client.set_server_final),
        ]:
            token = send().encode()
            connection.send_bytes(len(token).to_bytes(4, "big") + token)
            receive(connection.read_exactly(int.from_bytes(connection.read_exactly(4), "big")).decode())
        assert topic_error(connection, TOPIC) == KafkaError.none


@pytest.mark.parametrize("change", ["changed", "deleted", "principal deleted"])
def test_a_connection_is_closed_once_its_credential_changes_or_goes(secured, change):
    name = f"scram-{change.replace(' ', '-')}"
    new_principal(secured, name, rule("Topic", TOPIC, "Describe"))
    set_password(secured, name, SHA_512).raise_for_status()
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert scram_log_in(connection, name, PASSWORD, SHA_512).error_code == KafkaError.none
        assert topic_error(connection, TOPIC) == KafkaError.none
        with admin_http(secured) as admin:
            if change == "changed":
                set_password(secured, name, SHA_512, "a new password").raise_for_status()
            elif change == "deleted":
                admin.delete(f"/v1/principals/{name}/scram-credentials/{SHA_512}").raise_for_status()
            else:
                admin.delete(f"/v1/principals/{name}").raise_for_status()
        connection.send(request_of(api_table.API_VERSIONS, 3, client_software_name="t", client_software_version="1"))
        assert connection.closed_by_peer()


# ---- SASL/PLAIN with the SCRAM password (the core's scram_credentials.authenticate_password)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_plain_takes_the_password_of_either_scram_credential_and_the_principals_acls_apply(secured, mechanism):
    name = f"plain-{mechanism}".lower()
    new_principal(secured, name, *reader_and_writer(TOPIC))
    set_password(secured, name, mechanism, iterations=5000).raise_for_status()
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        answer = log_in(connection, name, PASSWORD)
        assert (answer.error_code, answer.error_message) == (KafkaError.none, None)
        assert topic_error(connection, TOPIC) == KafkaError.none
        assert topic_error(connection, OTHER_TOPIC) == KafkaError.topic_authorization_failed


def test_plain_refuses_a_wrong_password_another_principals_password_and_an_unknown_user(secured, scram_reader):
    other = "plain-other"
    new_principal(secured, other)
    set_password(secured, other, SHA_256, "the other one's password").raise_for_status()
    bootstrap = secured.extra["kafka_bootstrap"]
    for username, password in [
        (scram_reader, "wrong"),
        (scram_reader, "the other one's password"),
        (other, PASSWORD),
        ("nobody", PASSWORD),
    ]:
        with RawConnection(bootstrap) as connection:
            answer = log_in(connection, username, password)
            assert (answer.error_code, answer.error_message) == (
                KafkaError.sasl_authentication_failed,
                INVALID_CREDENTIALS,
            ), (username, password)
            assert connection.closed_by_peer()


def test_plain_still_takes_an_api_key_of_a_principal_with_a_scram_credential(secured):
    api_key = new_principal(secured, "plain-both", *reader_and_writer(TOPIC))
    set_password(secured, "plain-both", SHA_512).raise_for_status()
    for password in (api_key, PASSWORD):
        with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
            assert log_in(connection, "plain-both", password).error_code == KafkaError.none
            assert topic_error(connection, TOPIC) == KafkaError.none


def test_a_plain_connection_by_scram_password_is_closed_once_the_credential_changes(secured):
    name = "plain-changed"
    new_principal(secured, name, rule("Topic", TOPIC, "Describe"))
    set_password(secured, name, SHA_256).raise_for_status()
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        assert log_in(connection, name, PASSWORD).error_code == KafkaError.none
        assert topic_error(connection, TOPIC) == KafkaError.none
        set_password(secured, name, SHA_256, "a new password").raise_for_status()
        connection.send(request_of(api_table.API_VERSIONS, 3, client_software_name="t", client_software_version="1"))
        assert connection.closed_by_peer()


# (the real clients' tests are after round_trip, below)


# ---- raw: Kafka's AlterUserScramCredentials and DescribeUserScramCredentials


def admin_connection(secured) -> RawConnection:
    connection = RawConnection(secured.extra["kafka_bootstrap"])
    assert log_in(connection, "admin", ADMIN_TOKEN).error_code == KafkaError.none
    return connection


def upsertion(name: str, mechanism: int = 1, iterations: int = 4096, salt: bytes = b"s" * 16, salted=b"p" * 32):
    key = api_table.ALTER_USER_SCRAM_CREDENTIALS
    return nested(
        key, 0, "ScramCredentialUpsertion", name=name, mechanism=mechanism, iterations=iterations, salt=salt,
        salted_password=salted,
    )  # fmt: skip


def deletion(name: str, mechanism: int = 1):
    return nested(api_table.ALTER_USER_SCRAM_CREDENTIALS, 0, "ScramCredentialDeletion", name=name, mechanism=mechanism)


def alter(connection: RawConnection, deletions=(), upsertions=()) -> dict[str, tuple[KafkaError, str | None]]:
    answer = connection.call(
        request_of(api_table.ALTER_USER_SCRAM_CREDENTIALS, 0, deletions=tuple(deletions), upsertions=tuple(upsertions))
    )
    return {result.user: (result.error_code, result.error_message) for result in answer.results}


def describe(connection: RawConnection, users: list[str] | None):
    key = api_table.DESCRIBE_USER_SCRAM_CREDENTIALS
    named = None if users is None else tuple(nested(key, 0, "UserName", name=user) for user in users)
    return connection.call(request_of(key, 0, users=named))


def test_alter_refuses_as_kafkas_controller_and_alters_the_rest(secured):
    new_principal(secured, "altered")
    with admin_connection(secured) as connection:
        answers = alter(
            connection,
            deletions=[deletion("altered", 2), deletion("twice")],
            upsertions=[
                # Named again after a refusal (no credential to delete): that refusal stays, as Kafka's.
                upsertion("altered"),
                upsertion("twice", 2),
                upsertion("few", iterations=4095),
                upsertion("many", iterations=16385),
                upsertion(""),
                upsertion("unknown-mechanism", mechanism=0),
                upsertion("not-a-principal"),
                upsertion("short-salt", salt=b"s" * 11),
            ],
        )
        assert {user: code for user, (code, _) in answers.items()} == {
            "altered": KafkaError.resource_not_found,
            "twice": KafkaError.resource_not_found,
            "few": KafkaError.unacceptable_credential,
            "many": KafkaError.unacceptable_credential,
            "": KafkaError.unacceptable_credential,
            "unknown-mechanism": KafkaError.unsupported_sasl_mechanism,
            "not-a-principal": KafkaError.resource_not_found,
            "short-salt": KafkaError.unacceptable_credential,
        }
        assert answers["few"][1] == "4095 iterations: expected 4096 to 16384 (Kafka's bounds)"
        assert "principal 'not-a-principal' does not exist" in answers["not-a-principal"][1]

        assert alter(connection, deletions=[deletion("altered")]) == {
            "altered": (KafkaError.resource_not_found, "principal 'altered' has no SCRAM-SHA-256 credential to delete")
        }
        assert alter(connection, upsertions=[upsertion("altered", 2, iterations=8192)]) == {
            "altered": (
                KafkaError.unacceptable_credential,
                "a salted password of 32 bytes: SCRAM-SHA-512's is 64 bytes",
            )
        }
        assert alter(connection, upsertions=[upsertion("altered", 2, iterations=8192, salted=b"p" * 64)]) == {
            "altered": (KafkaError.none, None)
        }
        (result,) = describe(connection, ["altered"]).results
        assert [(info.mechanism, info.iterations) for info in result.credential_infos] == [(2, 8192)]
        assert alter(connection, deletions=[deletion("altered", 2)]) == {"altered": (KafkaError.none, None)}
        with admin_http(secured) as admin:  # audited as HTTP's changes, the door named
            entries = admin.get("/v1/audit", params={"limit": 2}).json()["entries"]
        assert [(e["action"], e["resource"], e["details"], e["source"]) for e in entries] == [
            ("delete scram credential", "altered", SHA_512, "kafka"),
            ("set scram credential", "altered", f"{SHA_512}, 8192 iterations", "kafka"),
        ]
        (result,) = describe(connection, ["altered"]).results
        assert result.error_code == KafkaError.resource_not_found


def test_a_user_named_again_is_refused_as_kafkas_controller_refuses_it(secured):
    """ScramControlManager.alterCredentials reads the deletions, then the upsertions, in order: a user
    named again after a change that passed its checks is DUPLICATE_RESOURCE, that change undone; named
    again after a refusal, or after DUPLICATE_RESOURCE, the first answer stays."""
    for name in ("dup-upserted", "dup-deleted", "dup-refused"):
        new_principal(secured, name)
    set_password(secured, "dup-deleted", SHA_256).raise_for_status()
    with admin_connection(secured) as connection:
        answers = alter(
            connection,
            deletions=[deletion("dup-deleted"), deletion("dup-deleted", 2)],
            upsertions=[
                upsertion("dup-upserted"),
                upsertion("dup-upserted", 2, salted=b"p" * 64),
                upsertion("dup-upserted"),
                upsertion("dup-refused", iterations=100),
                upsertion("dup-refused"),
                upsertion("", mechanism=0),
                upsertion(""),
            ],
        )
        assert {user: code for user, (code, _) in answers.items()} == {
            "dup-deleted": KafkaError.duplicate_resource,
            "dup-upserted": KafkaError.duplicate_resource,
            "dup-refused": KafkaError.unacceptable_credential,
            "": KafkaError.unacceptable_credential,
        }
        assert answers["dup-upserted"][1] == (
            "user 'dup-upserted' altered more than once in one request: alter each user at most once per request"
        )
        described = {r.user: (r.error_code, len(r.credential_infos)) for r in describe(connection, None).results}
        assert described["dup-deleted"] == (KafkaError.none, 1)  # the refused deletion undone
        assert "dup-upserted" not in described and "dup-refused" not in described


def test_two_alterations_naming_the_same_users_in_other_orders_both_succeed(secured):
    """Each AlterUserScramCredentials locks its users' rows in one order (by name), whatever the
    order it names them in: two naming two users in opposite orders, which deadlocked (PostgreSQL
    aborting one, whose connection was closed unanswered), both succeed. The interleaving that deadlocked:
    the first upserts 'lock-a' then waits for principal 'lock-b' (its existence check, held by the
    test); the second deletes 'lock-b''s credential then waits for 'lock-a''s."""
    for name in ("lock-a", "lock-b"):
        new_principal(secured, name)
    set_password(secured, "lock-b", SHA_256).raise_for_status()

    def altered(deletions, upsertions) -> dict:
        with admin_connection(secured) as connection:
            return {user: code for user, (code, _) in alter(connection, deletions, upsertions).items()}

    async def interleaved() -> tuple[dict, dict]:
        observer = await asyncpg.connect(secured.database_url)
        holder = await asyncpg.connect(secured.database_url)
        try:
            transaction = holder.transaction()
            await transaction.start()
            await holder.execute("SELECT 1 FROM principals WHERE name = 'lock-b' FOR UPDATE")
            first = asyncio.create_task(asyncio.to_thread(altered, [], [upsertion("lock-a"), upsertion("lock-b")]))
            await wait_for_lock_waits(observer, 1)
            second = asyncio.create_task(asyncio.to_thread(altered, [deletion("lock-b")], [upsertion("lock-a")]))
            await wait_for_lock_waits(observer, 2)
            await transaction.rollback()
            return await first, await second
        finally:
            await holder.close()
            await observer.close()

    first, second = asyncio.run(interleaved())
    assert first == {"lock-a": KafkaError.none, "lock-b": KafkaError.none}
    assert second == {"lock-b": KafkaError.none, "lock-a": KafkaError.none}


def test_describe_answers_each_user_named_or_every_user_with_a_credential(secured, scram_reader):
    with admin_connection(secured) as connection:
        answer = describe(connection, [scram_reader, "admin", scram_reader, "nobody"])
        assert answer.error_code == KafkaError.none
        results = {result.user: result for result in answer.results}
        assert [(r.user, r.error_code) for r in answer.results] == [
            (scram_reader, KafkaError.duplicate_resource),
            ("admin", KafkaError.resource_not_found),
            ("nobody", KafkaError.resource_not_found),
        ]
        assert results["admin"].error_message.startswith("user 'admin' has no SCRAM credential")
        everyone = {
            r.user: {(i.mechanism, i.iterations) for i in r.credential_infos}
            for r in describe(connection, None).results
        }
        assert everyone[scram_reader] == {(1, 4096), (2, 4096)}
        assert "admin" not in everyone
        assert {r.user for r in describe(connection, []).results} == set(everyone)


def test_altering_needs_alter_and_describing_describe_on_the_cluster(secured):
    api_key = new_principal(secured, "describer", rule("Cluster", "txbroker-cluster", "Describe"))
    bootstrap = secured.extra["kafka_bootstrap"]
    with RawConnection(bootstrap) as connection:
        assert log_in(connection, "describer", api_key).error_code == KafkaError.none
        ((code, message),) = alter(connection, upsertions=[upsertion("describer")]).values()
        assert code == KafkaError.cluster_authorization_failed
        assert describe(connection, None).error_code == KafkaError.none
    other_key = new_principal(secured, "no-cluster-rights")
    with RawConnection(bootstrap) as connection:
        assert log_in(connection, "no-cluster-rights", other_key).error_code == KafkaError.none
        answer = describe(connection, None)
        assert (answer.error_code, answer.results) == (KafkaError.cluster_authorization_failed, ())


# ---- HTTP


def test_http_sets_lists_and_deletes_credentials_and_audits_them(secured):
    new_principal(secured, "http-user")
    with admin_http(secured) as admin:
        assert set_password(secured, "http-user", SHA_512, iterations=5000).status_code == 204
        listed = admin.get("/v1/principals/http-user/scram-credentials").json()["credentials"]
        assert [(c["mechanism"], c["iterations"]) for c in listed] == [(SHA_512, 5000)]
        assert admin.delete(f"/v1/principals/http-user/scram-credentials/{SHA_512}").status_code == 204
        assert admin.get("/v1/principals/http-user/scram-credentials").json() == {"credentials": []}
        gone = admin.delete(f"/v1/principals/http-user/scram-credentials/{SHA_512}")
        assert (gone.status_code, gone.json()["error"]["message"]) == (
            404,
            f"principal 'http-user' has no {SHA_512} credential to delete",
        )
        entries = admin.get("/v1/audit", params={"limit": 2}).json()["entries"]
        assert [(e["action"], e["resource"], e["details"]) for e in entries] == [
            ("delete scram credential", "http-user", SHA_512),
            ("set scram credential", "http-user", f"{SHA_512}, 5000 iterations"),
        ]


@pytest.mark.parametrize(
    ("mechanism", "body", "expected"),
    [
        ("SCRAM-SHA-1", {"password": "p"}, "SCRAM mechanism SCRAM-SHA-1: expected one of SCRAM-SHA-256, SCRAM-SHA-512"),
        (SHA_256, {"password": "p", "iterations": 4095}, "4095 iterations: expected 4096 to 16384"),
        (SHA_256, {"password": "p", "iterations": 16385}, "16385 iterations: expected 4096 to 16384"),
        (SHA_256, {"password": ""}, "a password of 0 characters: expected 1 to 1024"),
        (SHA_256, {}, "password"),
    ],
)
def test_http_refuses_bad_input_with_400_saying_what_was_wrong(secured, scram_reader, mechanism, body, expected):
    with admin_http(secured) as admin:
        answer = admin.put(f"/v1/principals/{scram_reader}/scram-credentials/{mechanism}", json=body)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "INVALID_REQUEST"
    assert expected in answer.json()["error"]["message"]


def kafka_clients_log_in(connection: RawConnection, username: str, password: str, mechanism: str):
    """SCRAM's two round trips as Kafka's clients play them (kafka-python's client here; Kafka's
    ScramFormatter, librdkafka and aiokafka alike): the password's UTF-8 bytes salted, no SASLprep."""
    assert handshake(connection, mechanism).error_code == KafkaError.none
    client = KafkaPythonScramClient(username, password, mechanism)
    first = sasl_authenticate(connection, client.first_message())
    assert first.error_code == KafkaError.none
    client.process_server_first_message(first.auth_bytes)
    final = sasl_authenticate(connection, client.final_message())
    if final.error_code == KafkaError.none:
        client.process_server_final_message(final.auth_bytes)  # raises unless the server knew the key
    return final


@pytest.mark.parametrize(
    "password",
    [
        "pass\u00a0word",  # a no-break space, which SASLprep maps to a space
        "e\u0301t\u00e9",  # a decomposed é, which SASLprep's NFKC composes
        "\u0007bell",  # a control character, which SASLprep refuses and Kafka takes
    ],
)
def test_a_password_set_over_http_authenticates_kafkas_clients_whatever_saslprep_would_make_of_it(secured, password):
    username = "unicode-password"
    with admin_http(secured) as admin:
        admin.post("/v1/principals", json={"name": username})  # 400 once it exists: the module's server
    set_password(secured, username, SHA_256, password).raise_for_status()
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:
        answer = kafka_clients_log_in(connection, username, password, SHA_256)
        assert (answer.error_code, answer.error_message) == (KafkaError.none, None)


def test_http_answers_404_for_a_principal_that_does_not_exist(secured):
    answer = set_password(secured, "ghost", SHA_256)
    assert answer.status_code == 404
    assert "principal 'ghost' does not exist" in answer.json()["error"]["message"]
    with admin_http(secured) as admin:
        assert admin.get("/v1/principals/ghost/scram-credentials").status_code == 404


def test_deleting_a_principal_deletes_its_credentials(secured):
    new_principal(secured, "recreated")
    set_password(secured, "recreated", SHA_256).raise_for_status()
    with admin_http(secured) as admin:
        admin.delete("/v1/principals/recreated").raise_for_status()
        admin.post("/v1/principals", json={"name": "recreated"}).raise_for_status()
        assert admin.get("/v1/principals/recreated/scram-credentials").json() == {"credentials": []}


# ---- the real clients


def confluent_scram(username: str, password: str, mechanism: str, **extra) -> dict:
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": username,
        "sasl.password": password,
        **extra,
    }


def python_scram(bootstrap: str, username: str, password: str, mechanism: str, **extra) -> dict:
    """kafka-python's and aiokafka's (SCRAM takes PLAIN's username and password settings)."""
    return {
        "bootstrap_servers": bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": username,
        "sasl_plain_password": password,
        **extra,
    }


def confluent_admin(secured) -> AdminClient:
    return AdminClient(
        {
            "bootstrap.servers": secured.extra["kafka_bootstrap"],
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "admin",
            "sasl.password": ADMIN_TOKEN,
        }
    )


def test_confluent_kafkas_admin_client_sets_describes_and_deletes_credentials(secured):
    new_principal(secured, "confluent-admin-made")
    admin = confluent_admin(secured)
    alterations = [
        UserScramCredentialUpsertion(
            "confluent-admin-made", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), PASSWORD.encode()
        )
    ]
    for future in admin.alter_user_scram_credentials(alterations).values():
        future.result(WAIT_S)
    described = admin.describe_user_scram_credentials(["confluent-admin-made"])["confluent-admin-made"].result(WAIT_S)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_512, 4096)
    ]
    with RawConnection(secured.extra["kafka_bootstrap"]) as connection:  # its salted password authenticates
        assert scram_log_in(connection, "confluent-admin-made", PASSWORD, SHA_512).error_code == KafkaError.none
    deleted = admin.alter_user_scram_credentials(
        [UserScramCredentialDeletion("confluent-admin-made", ScramMechanism.SCRAM_SHA_512)]
    )
    deleted["confluent-admin-made"].result(WAIT_S)
    with pytest.raises(KafkaException) as missing:
        admin.describe_user_scram_credentials(["confluent-admin-made"])["confluent-admin-made"].result(WAIT_S)
    assert missing.value.args[0].code() == ConfluentError.RESOURCE_NOT_FOUND


CLIENTS = ["confluent-kafka", "kafka-python", "aiokafka"]


def round_trip(client: str, server, username: str, mechanism: str, topic: str, values: list[bytes]) -> list[bytes]:
    if client == "confluent-kafka":
        security = confluent_scram(username, PASSWORD, mechanism)
        ConfluentKafka().produce(server, topic, [{"value": value} for value in values], **security)
        received = ConfluentKafka().consume(
            server, topic, 0, len(values), **{"group.id": GROUP_PREFIX + "confluent", **security}
        )
        return [record.value for record in received]
    config = python_scram(server.extra["kafka_bootstrap"], username, PASSWORD, mechanism)
    if client == "kafka-python":
        kafka_python_produce(config, topic, values)
        return kafka_python_consume(config, topic, len(values))
    asyncio.run(aiokafka_produce(config, topic, values))
    return asyncio.run(aiokafka_consume(config, topic, len(values)))


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("client", CLIENTS)
def test_each_client_produces_and_consumes_with_scram(secured, client, mechanism):
    topic = f"scram-{client}-{mechanism}".lower()
    username = f"user-{client}-{mechanism}".lower()
    with admin_http(secured) as admin:
        admin.post("/v1/topics", json={"name": topic, "partitions": 1, "config": {}}).raise_for_status()
    new_principal(secured, username, *reader_and_writer(topic))
    if client == "confluent-kafka":  # set over Kafka, by confluent-kafka's AdminClient
        upsert = UserScramCredentialUpsertion(
            username, ScramCredentialInfo(ScramMechanism[mechanism.replace("-", "_")], 4096), PASSWORD.encode()
        )
        admin = confluent_admin(secured)  # kept until the answer: a destroyed client fails its futures
        admin.alter_user_scram_credentials([upsert])[username].result(WAIT_S)
    else:  # over HTTP
        set_password(secured, username, mechanism).raise_for_status()
    values = [f"{client}-{mechanism}-{i}".encode() for i in range(3)]
    assert round_trip(client, secured, username, mechanism, topic, values) == values


def test_each_client_is_refused_a_wrong_password_and_a_topic_without_its_acl(secured, scram_reader, caplog):
    bootstrap = secured.extra["kafka_bootstrap"]
    assert_confluent_kafka_fails_authentication(
        {"bootstrap.servers": bootstrap, **confluent_scram(scram_reader, "wrong", SHA_256)}
    )

    from aiokafka.errors import KafkaConnectionError
    from aiokafka.errors import TopicAuthorizationFailedError as AioTopicAuthorizationFailed
    from kafka.errors import KafkaTimeoutError, TopicAuthorizationFailedError

    with pytest.raises(KafkaTimeoutError):
        kafka_python_produce(
            python_scram(bootstrap, scram_reader, "wrong", SHA_512, bootstrap_timeout_ms=2000), TOPIC, [b"x"]
        )
    assert INVALID_CREDENTIALS in caplog.text
    caplog.clear()
    with pytest.raises(KafkaConnectionError):
        asyncio.run(aiokafka_produce(python_scram(bootstrap, scram_reader, "wrong", SHA_256), TOPIC, [b"x"]))
    assert INVALID_CREDENTIALS in caplog.text

    # The right password, a topic the principal may not write: refused as with PLAIN.
    errors = confluent_produce(
        {
            "bootstrap.servers": bootstrap,
            **confluent_scram(scram_reader, PASSWORD, SHA_512, **{"message.timeout.ms": 30000}),
        },
        OTHER_TOPIC,
        [b"x"],
    )
    assert [error.code() for error in errors] == [ConfluentError.TOPIC_AUTHORIZATION_FAILED]
    with pytest.raises(TopicAuthorizationFailedError):
        kafka_python_produce(python_scram(bootstrap, scram_reader, PASSWORD, SHA_256), OTHER_TOPIC, [b"x"])
    with pytest.raises(AioTopicAuthorizationFailed):
        asyncio.run(aiokafka_produce(python_scram(bootstrap, scram_reader, PASSWORD, SHA_512), OTHER_TOPIC, [b"x"]))


@pytest.mark.parametrize("client", CLIENTS)
def test_each_client_produces_and_consumes_over_plain_with_the_scram_password(secured, client):
    topic = f"plain-scram-{client}"
    username = f"plain-user-{client}"
    with admin_http(secured) as admin:
        admin.post("/v1/topics", json={"name": topic, "partitions": 1, "config": {}}).raise_for_status()
    new_principal(secured, username, *reader_and_writer(topic))
    set_password(secured, username, SHA_512).raise_for_status()
    values = [f"{client}-{i}".encode() for i in range(3)]
    assert round_trip(client, secured, username, "PLAIN", topic, values) == values


def test_each_client_is_refused_a_wrong_scram_password_over_plain(secured, scram_reader, caplog):
    bootstrap = secured.extra["kafka_bootstrap"]
    assert_confluent_kafka_fails_authentication(
        {"bootstrap.servers": bootstrap, **confluent_scram(scram_reader, "wrong", "PLAIN")}
    )

    from kafka.errors import KafkaTimeoutError

    with pytest.raises(KafkaTimeoutError):
        kafka_python_produce(
            python_scram(bootstrap, scram_reader, "wrong", "PLAIN", bootstrap_timeout_ms=2000), TOPIC, [b"x"]
        )
    assert INVALID_CREDENTIALS in caplog.text


@pytest.mark.skipif(shutil.which("kcat") is None, reason="needs kcat")
def test_kcat_produces_and_consumes_with_scram(secured):
    new_principal(secured, "kcat-scram", *reader_and_writer("scram-kcat"))
    set_password(secured, "kcat-scram", SHA_512).raise_for_status()
    with admin_http(secured) as admin:
        admin.post("/v1/topics", json={"name": "scram-kcat", "partitions": 1, "config": {}}).raise_for_status()
    kcat = ["kcat", "-b", secured.extra["kafka_bootstrap"], "-X", "security.protocol=SASL_PLAINTEXT"]
    kcat += ["-X", f"sasl.mechanisms={SHA_512}", "-X", "sasl.username=kcat-scram", "-X", f"sasl.password={PASSWORD}"]
    produced = subprocess.run(
        [*kcat, "-P", "-t", "scram-kcat"], input=b"one\ntwo\n", capture_output=True, timeout=WAIT_S
    )
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run([*kcat, "-C", "-t", "scram-kcat", "-e"], capture_output=True, timeout=WAIT_S)
    assert (consumed.returncode, consumed.stdout) == (0, b"one\ntwo\n"), consumed.stderr
