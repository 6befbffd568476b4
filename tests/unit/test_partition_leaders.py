"""Which live node leads a partition, or coordinates a group or a transactional id
(app/coordinator/cluster_nodes.py: partition_leader, ListedNodes): the same on every node and in
every process, one of the live nodes, a topic's partitions dealt evenly over them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from app.coordinator.cluster_nodes import ListedNodes, LiveNode, partition_leader

PARTITIONS = 600
NODES = [0, 1, 2]


def leaders(node_ids: list[int], topic: str = "orders") -> dict[int, int]:
    return {partition: partition_leader(topic, partition, node_ids) for partition in range(PARTITIONS)}


def test_the_leader_is_the_same_whatever_the_process_and_the_order_of_the_nodes():
    """Python's str hash is salted per process: a leader computed from it would differ by node."""
    code = (
        "from app.coordinator.cluster_nodes import partition_leader; "
        "print([partition_leader('orders', p, [2, 0, 1]) for p in range(50)])"
    )
    answers = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert answers == {str([partition_leader("orders", p, NODES) for p in range(50)])}


def test_a_topics_partitions_are_dealt_evenly_over_the_live_nodes():
    for topic in ("orders", "payments", "t"):
        for nodes in (NODES, [4, 9], [3, 1, 8, 5]):
            counts = Counter(leaders(nodes, topic).values())
            assert counts == dict.fromkeys(nodes, PARTITIONS // len(nodes)), (topic, nodes, counts)


@pytest.mark.parametrize("leaving", NODES)
def test_a_node_that_leaves_leads_nothing_and_back_leads_what_it_led(leaving):
    before = leaders(NODES)
    survivors = [n for n in NODES if n != leaving]
    after = leaders(survivors)
    assert Counter(after.values()) == dict.fromkeys(survivors, PARTITIONS // len(survivors))
    assert leaders(NODES) == before


def test_a_lapsed_node_leads_nothing_and_one_node_leads_everything():
    listing = ListedNodes(live=[LiveNode(5, "h", 1)], lapsed=[LiveNode(3, "h", 2), LiveNode(9, "h", 3)])
    assert {listing.leader("orders", p) for p in range(PARTITIONS)} == {5}
    assert {listing.coordinator("__consumer_offsets", f"group-{n}") for n in range(50)} == {LiveNode(5, "h", 1)}
    with pytest.raises(ValueError, match="no live node to lead orders-0"):
        partition_leader("orders", 0, [])


def test_coordinators_spread_over_the_live_nodes_and_name_their_address():
    listing = ListedNodes(live=[LiveNode(n, f"host-{n}", 9092 + n) for n in NODES], lapsed=[])
    named = {listing.coordinator("__consumer_offsets", f"group-{n}") for n in range(50)}
    assert named == set(listing.live)
