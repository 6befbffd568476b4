"""Which live node leads a partition, or coordinates a group or a transactional id
(app/coordinator/cluster_nodes.py: partition_leader, ListedNodes): the same on every node and in
every process, one of the live nodes, spread over them, and moved only off a node that leaves."""

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


def test_the_leaders_spread_over_the_live_nodes():
    counts = Counter(leaders(NODES).values())
    assert set(counts) == set(NODES)
    assert all(count > PARTITIONS / len(NODES) * 0.8 for count in counts.values()), counts


@pytest.mark.parametrize("leaving", NODES)
def test_only_the_partitions_of_a_node_that_leaves_move_and_they_come_back(leaving):
    before = leaders(NODES)
    survivors = [n for n in NODES if n != leaving]
    after = leaders(survivors)
    assert {p: leader for p, leader in before.items() if leader != leaving} == {
        p: after[p] for p, leader in before.items() if leader != leaving
    }
    assert set(after.values()) == set(survivors)
    assert leaders(NODES) == before  # back: it leads what it led


def test_a_lapsed_node_leads_nothing_and_one_node_leads_everything():
    listing = ListedNodes(live=[LiveNode(5, "h", 1)], lapsed=[LiveNode(3, "h", 2), LiveNode(9, "h", 3)])
    assert {listing.leader("orders", p) for p in range(PARTITIONS)} == {5}
    assert {listing.coordinator("__consumer_offsets", f"group-{n}") for n in range(50)} == {LiveNode(5, "h", 1)}


def test_coordinators_spread_over_the_live_nodes_and_name_their_address():
    listing = ListedNodes(live=[LiveNode(n, f"host-{n}", 9092 + n) for n in NODES], lapsed=[])
    named = {listing.coordinator("__consumer_offsets", f"group-{n}") for n in range(50)}
    assert named == set(listing.live)
    # A group and a transactional id of one name are told apart.
    keys = [f"id-{n}" for n in range(50)]
    groups = [listing.coordinator("__consumer_offsets", key) for key in keys]
    transactions = [listing.coordinator("__transaction_state", key) for key in keys]
    assert groups != transactions
    with pytest.raises(ValueError, match="no live node for"):
        partition_leader("orders", 0, [])
