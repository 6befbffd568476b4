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
