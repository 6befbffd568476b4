"""Admin and the two-phase client built on it, with no server: an `httpx.MockTransport` plays the
contract's ListTransactions paging (`limit`, `after`) and the guarded admin abort."""

from __future__ import annotations

import httpx
import pytest

from txbroker import Admin, PreparedTransaction, TwoPhaseClient, errors
from txbroker.admin import ABORTABLE_STATES, LIST_PAGE

FAST = {"retry_backoff_ms": 1, "retry_backoff_max_ms": 5}


class FakeTransactions:
    """`count` transactions named tx-00000.., listed in pages as the server does; records every query."""

    def __init__(self, count: int) -> None:
        self.ids = [f"tx-{i:05d}" for i in range(count)]
        self.queries: list[dict] = []
        self.transport = httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        query = dict(request.url.params)
        self.queries.append({"path": request.url.path, **query})
        if request.url.path == "/v1/transactions":
            after, limit = query.get("after", ""), int(query.get("limit", 1000))
            page = [tid for tid in self.ids if tid > after][:limit]
            return httpx.Response(
                200,
                json={
                    "transactions": [
                        {"transactional_id": tid, "producer_id": 1, "producer_epoch": 0, "state": query.get("state")}
                        for tid in page
                    ]
                },
            )
        if request.url.path.endswith("/abort"):
            return httpx.Response(200, json={"producer_id": 1, "producer_epoch": 1, "state": "CompleteAbort"})
        return httpx.Response(
            404, json={"error": {"code": "TRANSACTIONAL_ID_NOT_FOUND", "message": "unknown", "retriable": False}}
        )


def test_list_transactions_reads_every_page():
    fake = FakeTransactions(2 * LIST_PAGE + 5)
    with Admin("http://fake", transport=fake.transport, **FAST) as admin:
        listed = admin.list_transactions(states=["Ongoing"], transactional_id_prefix="tx-")
    assert [t["transactional_id"] for t in listed] == fake.ids
    pages = [q for q in fake.queries if q["path"] == "/v1/transactions"]
    assert [q.get("after") for q in pages] == [None, fake.ids[LIST_PAGE - 1], fake.ids[2 * LIST_PAGE - 1]]
    assert all(q["limit"] == str(LIST_PAGE) and q["state"] == "Ongoing" for q in pages)


def test_two_phase_client_lists_abortable_states_through_admin_and_aborts_with_the_producer_guard():
    fake = FakeTransactions(LIST_PAGE + 1)
    with TwoPhaseClient("http://fake", transport=fake.transport, **FAST) as coordinator:
        listed = coordinator.list("tx-")
        assert len(listed) == LIST_PAGE + 1 and listed[0]["state"] == ",".join(ABORTABLE_STATES)
        assert coordinator.abort_open("tx-00001", 1, 0) is True
        assert coordinator.describe("nobody") is None
    abort = next(q for q in fake.queries if q["path"].endswith("/abort"))
    assert abort == {"path": "/v1/transactions/tx-00001/abort", "producer_id": "1", "producer_epoch": "0"}


def test_prepared_transaction_is_one_type_wherever_it_is_imported():
    from txbroker.records import PreparedTransaction as from_records
    from txbroker.two_phase import PreparedTransaction as from_two_phase

    assert from_records is from_two_phase is PreparedTransaction


def test_a_proxys_refusal_is_raised_as_the_class_of_its_code():
    """A 4xx without a txbroker error body (a proxy's 413, an auth proxy's 401) is INVALID_REQUEST
    and raised as InvalidRequestError, so `except InvalidRequestError` catches it as it catches the
    server's own; before, it was the base TxbrokerError carrying that code."""

    def proxy(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            413, headers={"Content-Type": "text/html"}, text="<html>413 Request Entity Too Large</html>"
        )

    with Admin("http://fake", transport=httpx.MockTransport(proxy), **FAST) as admin:
        with pytest.raises(
            errors.InvalidRequestError, match="answered HTTP 413 without a txbroker error body"
        ) as raised:
            admin.create_topic("big")
    assert raised.value.code == "INVALID_REQUEST" and not raised.value.retriable and raised.value.status == 413


class FirstAnswersLost:
    """A server that applies every change, but whose answer to the first request of each path is
    lost on its way back (the connection drops): the client cannot know it was applied. A change
    sent again is answered as the server would, knowing it was applied."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.transport = httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        key = (request.method, request.url.path)
        again = key in self.requests
        self.requests.append(key)
        if not again:
            raise httpx.ReadError("connection dropped before the answer", request=request)
        if request.url.path == "/v1/txn/end":
            return httpx.Response(200, json={"producer_id": 7, "producer_epoch": 0, "state": "CompleteCommit"})
        if request.url.path == "/v1/topics":
            code, status = "TOPIC_ALREADY_EXISTS", 409
        else:
            code, status = "INVALID_TXN_STATE", 409
        return httpx.Response(status, json={"error": {"code": code, "message": "done before", "retriable": False}})


@pytest.mark.parametrize("client", [Admin, TwoPhaseClient])
@pytest.mark.parametrize(
    "change",
    [lambda client: client.create_topic("orders"), lambda client: client.abort_transaction("tx-1")],
    ids=["create_topic", "abort_transaction"],
)
def test_admins_changes_are_sent_once_after_a_lost_answer_by_a_two_phase_client_too(client, change):
    """A change whose answer was lost raises TxbrokerConnectionError (not retriable): look, then
    decide. A TwoPhaseClient's inherited Admin calls do as Admin's. Before, a TwoPhaseClient sent
    them again and reported what its first attempt did as an error (TopicAlreadyExistsError)."""
    server = FirstAnswersLost()
    with client("http://fake", transport=server.transport, **FAST) as admin:
        with pytest.raises(errors.TxbrokerConnectionError) as raised:
            change(admin)
    assert not raised.value.retriable
    assert len(server.requests) == 1


def test_a_two_phase_clients_own_changes_are_sent_again_after_a_lost_answer():
    """commit() and abort_open() are safe to repeat: sent again after a lost answer, the commit
    succeeds and the abort finds nothing open any more (False: it is not open either way)."""
    server = FirstAnswersLost()
    with TwoPhaseClient("http://fake", transport=server.transport, **FAST) as coordinator:
        coordinator.commit(PreparedTransaction("tx-1", 7, 0))
        assert coordinator.abort_open("tx-1") is False
    assert server.requests == [("POST", "/v1/txn/end")] * 2 + [("POST", "/v1/transactions/tx-1/abort")] * 2
