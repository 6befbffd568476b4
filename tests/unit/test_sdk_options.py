"""The SDK's clients refuse, when made, a numeric option that cannot work, with a ValueError naming
it (as Kafka's clients refuse such a config), and a refused client leaves no loop thread behind."""

from __future__ import annotations

import threading

import pytest

from txbroker import Admin, AsyncConsumer, AsyncProducer, Consumer, Producer, TwoPhaseClient


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_in_flight_requests", 0),  # before: a record was never sent and never failed
        ("linger_ms", -1),
        ("batch_size", -1),
        ("max_batch_records", 0),
        ("max_buffered_records", 0),
        ("delivery_timeout_ms", 0),
        ("request_timeout_ms", 0),
        ("max_block_ms", -5),
        ("retry_backoff_ms", -1),
        ("transaction_timeout_ms", 0),
        ("linger_ms", "5"),
        ("max_in_flight_requests", True),
    ],
)
def test_the_producer_refuses_an_option_that_cannot_work(option, value):
    with pytest.raises(ValueError, match=f"^{option} is {value!r}: expected a number of at least"):
        AsyncProducer("http://127.0.0.1:1", **{option: value})


def test_the_producer_takes_the_least_values_kafka_takes():
    """0 where Kafka's producer takes 0: no linger, a record per batch, no backoff, no wait."""
    AsyncProducer("http://127.0.0.1:1", linger_ms=0, batch_size=0, retry_backoff_ms=0, max_block_ms=0)


@pytest.mark.parametrize(
    ("options", "sum_text"),
    [
        ({"delivery_timeout_ms": 20_000}, "(5 + 30000 = 30005)"),  # the defaults of linger and request timeouts
        ({"delivery_timeout_ms": 1_000, "linger_ms": 0, "request_timeout_ms": 1_001}, "(0 + 1001 = 1001)"),
        ({"delivery_timeout_ms": 120_000, "linger_ms": 100_000, "request_timeout_ms": 30_000}, "= 130000)"),
    ],
)
def test_the_producer_refuses_a_delivery_timeout_below_linger_and_request_timeouts(options, sum_text):
    """As Kafka's KafkaProducer (ConfigException): a delivery_timeout_ms given must leave a batch the
    time to linger and to wait for one request's answer. Before, it was taken: a batch expired
    before its first request could be answered."""
    with pytest.raises(
        ValueError, match="^delivery_timeout_ms is .*: expected at least linger_ms \\+ request_timeout_ms"
    ) as e:
        AsyncProducer("http://127.0.0.1:1", **options)
    assert sum_text in str(e.value)


@pytest.mark.parametrize(
    ("options", "delivery_timeout_s"),
    [
        ({}, 120),  # the default
        ({"linger_ms": 0, "request_timeout_ms": 1_000, "delivery_timeout_ms": 1_000}, 1),  # equal: taken
        ({"request_timeout_ms": 200_000}, 200.005),  # not given: linger_ms + request_timeout_ms, larger
        ({"linger_ms": 100_000, "request_timeout_ms": 30_000}, 130),
    ],
)
def test_the_producers_delivery_timeout_is_at_least_linger_and_request_timeouts_when_not_given(
    options, delivery_timeout_s
):
    """Kafka's producer, delivery.timeout.ms not configured, uses linger.ms + request.timeout.ms when
    that is larger than its default. Before, the default held: a batch could expire before its
    request's answer was due."""
    producer = AsyncProducer("http://127.0.0.1:1", **options)
    assert producer._sender._delivery_timeout_s == pytest.approx(delivery_timeout_s)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("session_timeout_ms", 0),
        ("heartbeat_interval_ms", -1),
        ("max_poll_interval_ms", 0),
        ("auto_commit_interval_ms", 0),
        ("request_timeout_ms", 0),
    ],
)
def test_the_consumer_refuses_an_option_that_cannot_work(option, value):
    with pytest.raises(ValueError, match=f"^{option} is {value!r}: expected a number of at least"):
        AsyncConsumer("http://127.0.0.1:1", group_id="g", **{option: value})


@pytest.mark.parametrize(
    ("client", "options"),
    [
        (Producer, {"max_in_flight_requests": 0}),
        (Consumer, {"session_timeout_ms": 0}),
        (Admin, {"no_such_option": 1}),
        (TwoPhaseClient, {"no_such_option": 1}),
    ],
)
def test_a_sync_client_refused_when_made_leaves_no_thread(client, options):
    """Before, Admin and TwoPhaseClient left their loop thread running when their construction failed."""
    before = set(threading.enumerate())
    with pytest.raises((ValueError, TypeError)):
        client("http://127.0.0.1:1", **options)
    left = [thread for thread in threading.enumerate() if thread not in before and thread.is_alive()]
    assert left == [], left
