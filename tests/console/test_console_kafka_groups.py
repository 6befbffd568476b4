"""A Kafka consumer group (the classic protocol, over the Kafka listener) on the console's group
pages, over real HTTP on real PostgreSQL: its own rebalance state, the assignor its members chose,
its leader and each member's client, beside an HTTP group's server-side range assignment."""

from __future__ import annotations

import datetime
import re
from html import unescape

from kio.schema.errors import ErrorCode as KafkaError

from tests.conftest import RunningServer
from tests.kafka.clients import create_topic
from tests.kafka.raw import RawConnection
from tests.kafka.raw_groups import commit, heartbeat, join, leave, second_member_joins, sync


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


def test_the_group_list_and_the_group_page_show_one_state_in_every_phase(kafka_server: RunningServer) -> None:
    """The console's group list reads a group's state in its own query (a page of groups in one
    statement) and the group page from the group row: both apply classic_groups.kind_of, the rule of
    HTTP's and Kafka's listings, so they show one state for a Kafka group in each phase of a
    rebalance and after its members left, and for an HTTP group with and without members."""
    client = kafka_server.client
    bootstrap = kafka_server.extra["kafka_bootstrap"]
    create_topic(kafka_server, "phased", 1)
    group = "kafka-phased"
    rebalance = datetime.timedelta(seconds=30)

    def shown(group_id: str) -> tuple[str, str]:
        """(the list's state, the group page's state) of the group."""
        listed = _listed_state(client.get("/console/groups").text, group_id)
        return listed, _state_card(client.get(f"/console/groups/{group_id}").text)

    with RawConnection(bootstrap) as connection:
        first = join(connection, group, rebalance=rebalance)  # MEMBER_ID_REQUIRED: the id to join with
        joined = join(connection, group, first.member_id, rebalance=rebalance)
        member = joined.member_id
        assert shown(group) == ("CompletingRebalance",) * 2
        assert sync(connection, group, member, joined.generation_id, {member: b""}).error_code == KafkaError.none
        assert shown(group) == ("Stable",) * 2

        answers = {}
        joiner = second_member_joins(bootstrap, group, answers, rebalance=rebalance)
        while heartbeat(connection, group, member, joined.generation_id).error_code == KafkaError.none:
            pass  # until the second's join has begun the rebalance
        assert shown(group) == ("PreparingRebalance",) * 2
        rejoined = join(connection, group, member, rebalance=rebalance)
        joiner.join()
        assert shown(group) == ("CompletingRebalance",) * 2
        second = answers["second"].member_id
        assignments = {member: b"", second: b""}
        assert sync(connection, group, member, rejoined.generation_id, assignments).error_code == KafkaError.none
        assert shown(group) == ("Stable",) * 2
        assert leave(connection, group, [(member, None), (second, None)]) == [KafkaError.none] * 2
        assert shown(group) == ("Empty",) * 2

    joined = client.post("/v1/groups/http-phased/heartbeat", json={"member_id": "", "topics": ["phased"]}).json()
    assert shown("http-phased") == ("Stable",) * 2
    client.post("/v1/groups/http-phased/leave", json={"member_id": joined["member_id"]}).raise_for_status()
    assert shown("http-phased") == ("Empty",) * 2


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
