"""Administration: topics, transactions (kafka-transactions.sh: list, describe, abort, find-hanging),
producers, markers, consumer groups, offsets. `AsyncAdmin` is the one implementation; `txbroker.Admin`
runs it on a private event loop thread.

Results are the contract's JSON objects (docs/api.md), as dicts: the shapes are documented there once.
Reads retry retriable errors; `create_topic`, `delete_topic`, `delete_group`, `delete_group_offsets`
and `abort_transaction` are sent once (a retry after a lost answer would report
TOPIC_ALREADY_EXISTS, UNKNOWN_TOPIC_OR_PARTITION, GROUP_ID_NOT_FOUND or INVALID_TXN_STATE for what
did happen).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from operator import itemgetter
from typing import Any
from urllib.parse import quote

import httpx

from txbroker.connection import DEFAULT_URL, Connection
from txbroker.errors import TxbrokerConnectionError, from_body
from txbroker.metadata import topic_path
from txbroker.records import TopicPartition, listed_offsets, offset_errors
from txbroker.retry import Backoff, retrying
from txbroker.wire import LATEST_TIMESTAMP, READ_COMMITTED

OPEN_STATES = ("Ongoing", "Prepared", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")
ABORTABLE_STATES = ("Ongoing", "Prepared")  # the open states abort_transaction() aborts
LIST_PAGE = 1000  # transactions per ListTransactions request; list_transactions() reads every page
DEFAULT_HANGING_MS = 900_000  # the server's default transaction_max_timeout_ms


def _id_path(transactional_id: str) -> str:
    # Transactional ids may contain '/', which the server's route accepts as is.
    return "/v1/transactions/" + quote(transactional_id, safe="/")


class AsyncAdmin:
    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | httpx.BaseTransport | None = None,
        request_timeout_ms: int = 30_000,
        default_api_timeout_ms: int = 60_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
    ) -> None:
        self.url = url
        self._connection = Connection(
            url, token=token, headers=headers, transport=transport, request_timeout_ms=request_timeout_ms
        )
        self._backoff = Backoff(retry_backoff_ms, retry_backoff_max_ms)
        self._api_timeout_s = default_api_timeout_ms / 1000

    async def __aenter__(self) -> AsyncAdmin:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self) -> None:
        await self._connection.close()

    async def _read(
        self,
        path: str,
        *,
        params: Mapping | None = None,
        body: Any = None,
        method: str = "GET",
        what: str | None = None,
        answered: Callable[[Any], Any] | None = None,
    ) -> Any:
        """A read, retried for default_api_timeout_ms; `answered(answer)`, when given, is the
        result, and a retriable error it raises (a partition's, an answer's field missing) is
        retried too."""

        return await retrying(
            lambda: self._connection.request(method, path, body, params=params, read=answered),
            what=what or f"{method} {path}",
            timeout_s=self._api_timeout_s,
            backoff=self._backoff,
        )

    async def _once(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping | None = None,
        what: str | None = None,
        read: Callable[[Any], Any] | None = None,
        resend_unanswered: bool = False,
    ) -> Any:
        """A change, sent again after a retriable error answer (the server did nothing). After a lost
        answer, or one that is not the contract's (the fields `read` reads missing), its outcome is
        unknown and a retry of one that was applied may be refused (TOPIC_ALREADY_EXISTS), so it is
        sent again only when the caller says it is safe to repeat (`resend_unanswered`: EndTxn)."""

        async def call() -> Any:
            try:
                return await self._connection.request(method, path, body, params=params, read=read)
            except TxbrokerConnectionError as error:
                if resend_unanswered:
                    raise
                raise error.with_category() from error

        return await retrying(
            call, what=what or f"{method} {path}", timeout_s=self._api_timeout_s, backoff=self._backoff
        )

    # ---- cluster and topics

    async def health(self) -> dict:
        """`{"status": "ok", "database": "ok"}` once the server serves; its 503 body before that."""
        return await self._connection.request("GET", "/v1/health", accept=(503,))

    async def cluster(self) -> dict:
        return await self._read("/v1/cluster")

    async def create_topic(self, name: str, partitions: int = 1, config: Mapping[str, Any] | None = None) -> dict:
        return await self._once(
            "POST", "/v1/topics", {"name": name, "partitions": partitions, "config": dict(config or {})}
        )

    async def create_partitions(self, name: str, partitions: int) -> dict:
        """[CreatePartitions] Raises the topic's partition count to `partitions` (the total, more than
        it has); returns the topic. Not retried: a retry of a growth that was made is refused."""
        return await self._once("POST", f"{topic_path(name)}/partitions", {"partitions": partitions})

    async def list_topics(self) -> list[dict]:
        return await self._read("/v1/topics", answered=itemgetter("topics"))

    async def describe_topic(self, name: str) -> dict:
        return await self._read(topic_path(name))

    async def delete_topic(self, name: str) -> None:
        await self._once("DELETE", topic_path(name))

    async def delete_records(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """[DeleteRecords] Deletes every record before each partition's offset (-1: up to the high
        watermark; at most the last stable offset); returns each partition's new log start (low
        watermark). Safe to retry: a log start never moves back. Raises the first partition's error."""
        by_topic: dict[str, list[dict]] = {}
        for tp, offset in offsets.items():
            by_topic.setdefault(tp[0], []).append({"partition": tp[1], "offset": offset})
        result = {}
        for topic, partitions in by_topic.items():
            outcomes = await self._read(
                f"{topic_path(topic)}/delete-records",
                method="POST",
                body={"partitions": partitions},
                answered=_log_starts,
            )
            for partition, error, low_watermark in outcomes:
                if error is not None:
                    raise from_body(error)
                result[TopicPartition(topic, partition)] = low_watermark
        return result

    # ---- transactions

    async def list_transactions(
        self,
        *,
        states: Iterable[str] | str | None = None,
        min_duration_ms: int | None = None,
        producer_id: int | None = None,
        transactional_id_prefix: str | None = None,
    ) -> list[dict]:
        """Every matching transaction (all pages), ordered by transactional id."""
        if states is not None and not isinstance(states, str):
            states = ",".join(states)
        params = {
            "state": states or None,
            "min_duration_ms": min_duration_ms,
            "producer_id": producer_id,
            "transactional_id_prefix": transactional_id_prefix,
            "limit": LIST_PAGE,
        }
        found: list[dict] = []
        while True:
            page, last_id = await self._read(
                "/v1/transactions",
                params=params,
                what=f"ListTransactions({transactional_id_prefix or ''!r})",
                answered=_transactions_page,
            )
            found += page
            if len(page) < LIST_PAGE:
                return found
            params["after"] = last_id

    async def describe_transaction(self, transactional_id: str) -> dict:
        return await self._read(_id_path(transactional_id), what=f"describe {transactional_id!r}")

    async def abort_transaction(
        self,
        transactional_id: str,
        producer_id: int | None = None,
        producer_epoch: int | None = None,
        start_time_ms: int | None = None,
    ) -> dict:
        """Fences the current producer of the id and aborts its open (Ongoing or Prepared) transaction;
        with `producer_id` and `producer_epoch` (as listed), only if the producer is still that one;
        with `start_time_ms` (as listed), only if the open transaction is still the one that started
        then (a Kafka client's producer id and epoch carry over from one transaction to the next)."""
        return await self._abort(transactional_id, producer_id, producer_epoch, start_time_ms)

    async def _abort(
        self,
        transactional_id: str,
        producer_id: int | None = None,
        producer_epoch: int | None = None,
        start_time_ms: int | None = None,
        *,
        resend_unanswered: bool = False,
    ) -> dict:
        params: dict | None = None
        if producer_id is not None:
            params = {"producer_id": producer_id, "producer_epoch": producer_epoch}
        if start_time_ms is not None:
            params = {**(params or {}), "start_time_ms": start_time_ms}
        return await self._once(
            "POST",
            _id_path(transactional_id) + "/abort",
            params=params,
            what=f"abort {transactional_id!r}",
            resend_unanswered=resend_unanswered,
        )

    async def find_hanging_transactions(self, min_duration_ms: int = DEFAULT_HANGING_MS) -> list[dict]:
        """Transactions open for longer than `min_duration_ms`: they hold back the last stable offset of
        every partition they wrote, so read_committed consumers of those partitions stall."""
        return await self.list_transactions(min_duration_ms=min_duration_ms, states=OPEN_STATES)

    async def describe_producers(self, topic: str, partition: int) -> list[dict]:
        return await self._read(
            f"{topic_path(topic)}/partitions/{int(partition)}/producers", answered=itemgetter("producers")
        )

    async def list_markers(self, topic: str, partition: int, offset: int = 0, limit: int = 100) -> list[dict]:
        return await self._read(
            f"{topic_path(topic)}/partitions/{int(partition)}/markers",
            params={"offset": offset, "limit": limit},
            answered=itemgetter("markers"),
        )

    # ---- groups and offsets

    async def list_groups(self) -> list[dict]:
        return await self._read("/v1/groups", answered=itemgetter("groups"))

    async def describe_group(self, group_id: str) -> dict:
        """Members, generation, assignment, committed offsets and lag."""
        return await self._read(f"/v1/groups/{quote(group_id, safe='')}")

    async def delete_group(self, group_id: str) -> None:
        """[DeleteGroups] Deletes a group without members and all its offsets (NonEmptyGroupError
        while it has members, GroupIdNotFoundError when there is none)."""
        await self._once("DELETE", f"/v1/groups/{quote(group_id, safe='')}")

    async def delete_group_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        """[OffsetDelete] Deletes the group's offsets of these partitions (committed and pending
        transactional). Raises the first partition's error (GroupSubscribedToTopicError while a
        member subscribes to its topic). Sent once, as delete_group: a group left without members
        and offsets is deleted, so a retry after a lost answer could report GroupIdNotFoundError."""
        entry_errors = await self._once(
            "POST",
            f"/v1/groups/{quote(group_id, safe='')}/offsets/delete",
            {"partitions": [{"topic": tp[0], "partition": tp[1]} for tp in partitions]},
            read=offset_errors,
        )
        for entry_error in entry_errors:
            if entry_error is not None:
                raise from_body(entry_error)

    async def list_group_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        return await self._read(
            f"/v1/groups/{quote(group_id, safe='')}/offsets/fetch",
            method="POST",
            body={"partitions": None, "require_stable": False},
            answered=_committed_offsets,
        )

    async def list_offsets(
        self,
        partitions: Iterable[TopicPartition],
        timestamp: int = LATEST_TIMESTAMP,
        isolation_level: str = READ_COMMITTED,
    ) -> dict[TopicPartition, int]:
        """-1 latest (the LSO under read_committed), -2 earliest, or a time in ms."""
        return await self._read(
            "/v1/offsets/list",
            method="POST",
            body={
                "isolation_level": isolation_level,
                "partitions": [{"topic": tp[0], "partition": tp[1], "timestamp": timestamp} for tp in partitions],
            },
            answered=listed_offsets,
        )

    # ---- security (needs Describe or Alter on the Cluster: super users)

    async def whoami(self) -> dict:
        return await self._read("/v1/whoami")

    async def create_principal(self, name: str, super_user: bool = False) -> dict:
        return await self._once("POST", "/v1/principals", {"name": name, "super_user": super_user})

    async def list_principals(self) -> list[dict]:
        return await self._read("/v1/principals", answered=itemgetter("principals"))

    async def delete_principal(self, name: str) -> None:
        await self._once("DELETE", f"/v1/principals/{quote(name, safe='')}")

    async def add_key(self, principal: str) -> dict:
        """A new API key: {"key_id", "token"}; the token is shown this once."""
        return await self._once("POST", f"/v1/principals/{quote(principal, safe='')}/keys")

    async def list_keys(self, principal: str) -> list[dict]:
        return await self._read(f"/v1/principals/{quote(principal, safe='')}/keys", answered=itemgetter("keys"))

    async def revoke_key(self, principal: str, key_id: str) -> None:
        await self._once("DELETE", f"/v1/principals/{quote(principal, safe='')}/keys/{quote(key_id, safe='')}")

    async def set_scram_credential(self, principal: str, mechanism: str, password: str, iterations: int = 4096) -> None:
        """Sets the principal's SASL/SCRAM password for the Kafka listener (`mechanism`
        SCRAM-SHA-256 or SCRAM-SHA-512; iterations 4096..16384). Setting it again is harmless: the
        same password under a new salt."""
        await self._once(
            "PUT",
            f"/v1/principals/{quote(principal, safe='')}/scram-credentials/{quote(mechanism, safe='')}",
            {"password": password, "iterations": iterations},
        )

    async def list_scram_credentials(self, principal: str) -> list[dict]:
        """[{"mechanism", "iterations", "updated_ms"}]: no salt, no key."""
        return await self._read(
            f"/v1/principals/{quote(principal, safe='')}/scram-credentials", answered=itemgetter("credentials")
        )

    async def delete_scram_credential(self, principal: str, mechanism: str) -> None:
        await self._once(
            "DELETE", f"/v1/principals/{quote(principal, safe='')}/scram-credentials/{quote(mechanism, safe='')}"
        )

    async def add_acl(
        self,
        principal: str,
        resource_type: str,
        resource_name: str,
        operation: str,
        *,
        pattern_type: str = "literal",
        permission: str = "allow",
    ) -> dict:
        return await self._once(
            "POST",
            "/v1/acls",
            {
                "principal": principal,
                "resource_type": resource_type,
                "resource_name": resource_name,
                "operation": operation,
                "pattern_type": pattern_type,
                "permission": permission,
            },
        )

    async def list_acls(self, principal: str | None = None, resource_type: str | None = None) -> list[dict]:
        return await self._read(
            "/v1/acls", params={"principal": principal, "resource_type": resource_type}, answered=itemgetter("acls")
        )

    async def remove_acl(self, acl_id: int) -> None:
        await self._once("DELETE", f"/v1/acls/{int(acl_id)}")

    async def audit_log(self, limit: int = 100) -> list[dict]:
        return await self._read("/v1/audit", params={"limit": limit}, answered=itemgetter("entries"))


# Readers of answers (`answered=`), read within the retried attempt (Connection.request's `read`).


def _transactions_page(answer: dict) -> tuple[list[dict], str | None]:
    """A ListTransactions page and the transactional id the next page starts after."""
    page = answer["transactions"]
    return page, page[-1]["transactional_id"] if page else None


def _log_starts(answer: dict) -> list[tuple[int, dict | None, int | None]]:
    """(partition, error, new log start) of each partition of a DeleteRecords answer."""
    return [
        (entry["partition"], entry["error"], entry["low_watermark"] if entry["error"] is None else None)
        for entry in answer["partitions"]
    ]


def _committed_offsets(answer: dict) -> dict[TopicPartition, int]:
    """The committed offset of each partition of an OffsetFetch answer that has one."""
    return {
        TopicPartition(e["topic"], e["partition"]): e["offset"]
        for e in answer["offsets"]
        if e["error"] is None and e["offset"] >= 0
    }
