"""With `--auth required`, a Kafka connection has no credentials to offer (SASL is not built yet):
it is refused everything, never served as the anonymous super user of `--auth off`."""

from __future__ import annotations

from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.kafka.raw import RawConnection, nested, request_of
from tests.kafka.test_api_versions import TRANSACTIONAL, errors_in, sample_request
from tests.kafka.test_produce_raw import answer_of, produce_request, record_batch, records


def test_with_auth_required_a_kafka_connection_is_refused_everything(make_server):
    server = make_server(kafka_listener="127.0.0.1:0", auth="required", admin_token="admin-secret")
    response = server.client.post(
        "/v1/topics",
        json={"name": "guarded", "partitions": 1, "config": {}},
        headers={"Authorization": "Bearer admin-secret"},
    )
    assert response.status_code == 201, response.text
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        metadata = connection.call(
            request_of(
                api_table.METADATA,
                12,
                topics=(nested(api_table.METADATA, 12, "MetadataRequestTopic", name="guarded", topic_id=None),),
                allow_auto_topic_creation=True,
                include_topic_authorized_operations=False,
            )
        )
        assert [t.error_code for t in metadata.topics] == [KafkaError.topic_authorization_failed]
        everything = connection.call(
            request_of(api_table.METADATA, 12, topics=None, include_topic_authorized_operations=False)
        )
        assert everything.topics == ()
        produced = connection.call(produce_request("guarded", 0, record_batch(records(1))))
        assert answer_of(produced)[0] == KafkaError.topic_authorization_failed
        fetched = connection.call(sample_request(api_table.FETCH, 12))
        assert [p.error_code for t in fetched.responses for p in t.partitions] == [
            KafkaError.topic_authorization_failed
        ]
        init = connection.call(sample_request(api_table.INIT_PRODUCER_ID, 4))
        assert init.error_code == KafkaError.cluster_authorization_failed
        for api_key in TRANSACTIONAL:  # the transactional id is refused before anything is looked at
            refused = connection.call(sample_request(api_key, 3))
            assert set(errors_in(refused)) == {KafkaError.transactional_id_authorization_failed}, refused
        described = connection.call(sample_request(api_table.DESCRIBE_TRANSACTIONS, 0))
        assert set(errors_in(described)) == {KafkaError.transactional_id_authorization_failed}
        assert connection.call(sample_request(api_table.LIST_TRANSACTIONS, 2)).transaction_states == ()
        producers = connection.call(sample_request(api_table.DESCRIBE_PRODUCERS, 0))
        assert set(errors_in(producers)) == {KafkaError.topic_authorization_failed}
        grown = connection.call(sample_request(api_table.CREATE_PARTITIONS, 3))
        assert [r.error_code for r in grown.results] == [KafkaError.topic_authorization_failed]
    topic = server.client.get("/v1/topics/guarded", headers={"Authorization": "Bearer admin-secret"}).json()
    assert topic["partitions"][0]["high_watermark"] == 0 and len(topic["partitions"]) == 1
