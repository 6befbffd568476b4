"""A Kafka consumer group (the classic protocol, over the Kafka listener) on the console's group
pages, over real HTTP on real PostgreSQL: its own rebalance state, the assignor its members chose,
its leader and each member's client, beside an HTTP group's server-side range assignment."""

from __future__ import annotations

import re
from html import unescape

from kio.schema.errors import ErrorCode as KafkaError

from tests.conftest import RunningServer
from tests.kafka.clients import create_topic
from tests.kafka.raw import RawConnection
from tests.kafka.raw_groups import commit, join, sync


def _text(page: str) -> str:
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", page)))


def _state_card(page: str) -> str:
    return re.search(r"State (\w+)", _text(page)).group(1)


def _listed_state(page: str, group: str) -> str:
    row = re.search(
        rf'href="/console/groups/{group}">{group}</a></td>\s*<td><span class="badge[^"]*">(\w+)</span>', page
    )
    return row.group(1)


def test_a_kafka_group_shows_its_rebalance_state_assignor_leader_and_clients(kafka_server: RunningServer) -> None:
    """Regression: the console called every group with members Stable and said its assignment was
    the server's range assignment; a Kafka group awaiting its leader's assignment (CompletingRebalance)
    showed as Stable, and its assignor, leader and clients were nowhere."""
    client = kafka_server.client
    create_topic(kafka_server, "kafka-grouped", 2)
    group = "kafka-rebalancing"
    with RawConnection(kafka_server.extra["kafka_bootstrap"]) as connection:
        first = join(connection, group)  # MEMBER_ID_REQUIRED: the id to join with
        joined = join(connection, group, first.member_id)
        member, generation = joined.member_id, joined.generation_id
        assert joined.leader == member

        page = client.get(f"/console/groups/{group}").text
        assert _state_card(page) == "CompletingRebalance"
        assert _listed_state(client.get("/console/groups").text, group) == "CompletingRebalance"
        protocol = _text(re.search(r'<span class="hint" id="group-protocol">.*?</span></div>', page, re.S).group(0))
        assert "assignor range" in protocol and f"the leader {member}" in protocol, protocol
        assert "computed by the server" not in protocol
        assert "rebalance is under way" in protocol
        members = _text(page.split('id="members"')[1].split("</table>")[0])
        assert f"{member} leader" in members and "from /127.0.0.1" in members, members

        assert sync(connection, group, member, generation, {member: b""}).error_code == KafkaError.none
        page = client.get(f"/console/groups/{group}").text
        assert _state_card(page) == "Stable"
        assert "rebalance is under way" not in page
        assert _listed_state(client.get("/console/groups").text, group) == "Stable"

    # An HTTP group: the server assigns.
    client.post(
        "/v1/groups/http-grouped/heartbeat", json={"member_id": "", "topics": ["kafka-grouped"]}
    ).raise_for_status()
    page = client.get("/console/groups/http-grouped").text
    assert _state_card(page) == "Stable"
    assert "Range assignment, computed by the server" in page
    assert "HTTP" in _text(page.split('id="members"')[1].split("</table>")[0])


def test_a_negative_committed_offset_has_no_lag(kafka_server: RunningServer) -> None:
    """Regression: Kafka's OffsetCommit stores a negative offset as given (an admin tool's -1), and the
    console counted its lag from below offset 0: the high watermark plus one. It is no position, so
    it has no lag ("—", as kafka-consumer-groups.sh shows none), and adds none to the group's."""
    client = kafka_server.client
    create_topic(kafka_server, "negative-committed", 1)
    client.post(
        "/v1/topics/negative-committed/records",
        json={"partition": 0, "records": [{"value": "a"}, {"value": "b"}, {"value": "c"}]},
    ).raise_for_status()
    with RawConnection(kafka_server.extra["kafka_bootstrap"]) as connection:
        assert commit(connection, "negative-readers", "", -1, None, "negative-committed", -1) == KafkaError.none

    page = client.get("/console/groups/negative-readers").text
    row = _text(page.split('id="offsets"')[1].split("</table>")[0])
    assert "negative-committed-0 -1 — 3 — —" in row, row  # leader epoch, high watermark, lag, pending
    assert re.search(r"Lag 0 records past", _text(page))
    listed = client.get("/console/groups").text.split('href="/console/groups/negative-readers"')[1].split("</tr>")[0]
    assert re.findall(r'<td class="num mono[^"]*">([^<]*)</td>', listed)[1] == "0"  # generation, then lag
