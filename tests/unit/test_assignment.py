"""Pure tests of the server-side range assignor (Kafka's RangeAssignor): per topic, the members
subscribed to it, sorted by member id, get consecutive ranges of its partitions, and the first
`partitions % members` of them get one partition more. No I/O."""

from __future__ import annotations

import itertools
import random

import pytest

from app.coordinator.assignment import range_assignment


def nonempty(assignment: dict[str, dict[str, list[int]]]) -> dict[str, dict[str, list[int]]]:
    """The assignment without empty partition lists (a member left with nothing of a topic may be
    given `[]` or no entry at all: both mean the same)."""
    return {member: {topic: parts for topic, parts in topics.items() if parts} for member, topics in assignment.items()}


def kafka_range(partitions: int, members: list[str]) -> dict[str, list[int]]:
    """Kafka's RangeAssignor.assign for one topic, transcribed: start = per * i + min(i, extra)."""
    per, extra = divmod(partitions, len(members))
    result = {}
    for i, member in enumerate(sorted(members)):
        start = per * i + min(i, extra)
        length = per + (1 if i < extra else 0)
        result[member] = list(range(start, start + length))
    return result


def assert_each_partition_once(assignment, subscriptions, partition_counts) -> None:
    for topic, count in partition_counts.items():
        subscribers = [m for m, topics in subscriptions.items() if topic in topics]
        owners = [(p, m) for m in assignment for p in assignment[m].get(topic, [])]
        if not subscribers:
            assert owners == [], f"{topic} has no subscriber yet is assigned: {owners}"
            continue
        assert sorted(p for p, _ in owners) == list(range(count)), f"{topic}: {owners}"
        assert all(topic in subscriptions[m] for _, m in owners), "only subscribers get a topic's partitions"


def test_single_member_gets_every_partition_of_every_topic():
    assert nonempty(range_assignment({"m1": ["a", "b"]}, {"a": 3, "b": 1})) == {"m1": {"a": [0, 1, 2], "b": [0]}}


def test_even_split_gives_consecutive_ranges_in_member_id_order():
    result = range_assignment({"m2": ["t"], "m1": ["t"]}, {"t": 4})
    assert nonempty(result) == {"m1": {"t": [0, 1]}, "m2": {"t": [2, 3]}}


def test_first_partitions_mod_members_members_get_one_more():
    # 7 partitions over 3 members: 3, 2, 2 (Kafka's example shape)
    result = range_assignment({"c": ["t"], "a": ["t"], "b": ["t"]}, {"t": 7})
    assert nonempty(result) == {"a": {"t": [0, 1, 2]}, "b": {"t": [3, 4]}, "c": {"t": [5, 6]}}
    # 5 partitions over 3: 2, 2, 1
    result = range_assignment({"c": ["t"], "a": ["t"], "b": ["t"]}, {"t": 5})
    assert nonempty(result) == {"a": {"t": [0, 1]}, "b": {"t": [2, 3]}, "c": {"t": [4]}}


def test_range_is_per_topic_so_the_first_member_gets_the_extra_of_each_topic():
    """The RangeAssignor's known skew: with 2 topics of 3 partitions and 2 members, the first
    member gets 2 partitions of each topic (4 in total) and the second 1 of each."""
    result = range_assignment({"m1": ["t0", "t1"], "m2": ["t0", "t1"]}, {"t0": 3, "t1": 3})
    assert nonempty(result) == {"m1": {"t0": [0, 1], "t1": [0, 1]}, "m2": {"t0": [2], "t1": [2]}}


def test_more_members_than_partitions_leaves_the_last_members_without_partitions():
    result = range_assignment({"m3": ["t"], "m1": ["t"], "m2": ["t"], "m4": ["t"]}, {"t": 2})
    assert set(result) == {"m1", "m2", "m3", "m4"}, "every member is present in the result"
    assert nonempty(result) == {"m1": {"t": [0]}, "m2": {"t": [1]}, "m3": {}, "m4": {}}


def test_members_subscribed_to_different_topics():
    subscriptions = {"a": ["x"], "b": ["x", "y"], "c": ["y", "z"]}
    counts = {"x": 3, "y": 4, "z": 2}
    result = range_assignment(subscriptions, counts)
    assert nonempty(result) == {
        "a": {"x": [0, 1]},
        "b": {"x": [2], "y": [0, 1]},
        "c": {"y": [2, 3], "z": [0, 1]},
    }
    assert_each_partition_once(result, subscriptions, counts)


def test_unknown_topics_are_skipped():
    result = range_assignment({"m1": ["known", "missing"], "m2": ["missing"]}, {"known": 2})
    assert set(result) == {"m1", "m2"}
    assert nonempty(result) == {"m1": {"known": [0, 1]}, "m2": {}}
    assert "missing" not in result["m1"] and "missing" not in result["m2"]


def test_topic_with_zero_partitions_is_skipped():
    assert nonempty(range_assignment({"m1": ["empty", "t"]}, {"empty": 0, "t": 1})) == {"m1": {"t": [0]}}


def test_topics_nobody_subscribes_to_are_not_assigned():
    result = range_assignment({"m1": ["t"]}, {"t": 1, "other": 5})
    assert nonempty(result) == {"m1": {"t": [0]}}


def test_no_members_gives_an_empty_assignment():
    assert range_assignment({}, {"t": 3}) == {}


def test_member_without_topics_is_present_with_nothing():
    result = range_assignment({"idle": [], "busy": ["t"]}, {"t": 2})
    assert nonempty(result) == {"idle": {}, "busy": {"t": [0, 1]}}


def test_deterministic_whatever_the_order_of_members_and_topics():
    subscriptions = {f"member-{i:02d}": [f"t{j}" for j in range(4) if (i + j) % 3] for i in range(7)}
    counts = {"t0": 5, "t1": 11, "t2": 3, "t3": 8}
    expected = range_assignment(subscriptions, counts)
    rng = random.Random(7)
    for _ in range(20):
        members = list(subscriptions.items())
        rng.shuffle(members)
        shuffled = {member: rng.sample(topics, len(topics)) for member, topics in members}
        counts_items = list(counts.items())
        rng.shuffle(counts_items)
        assert nonempty(range_assignment(shuffled, dict(counts_items))) == nonempty(expected)
    # and repeated calls with the very same input agree
    assert range_assignment(subscriptions, counts) == expected


def test_the_input_is_not_modified():
    subscriptions = {"b": ["y", "x"], "a": ["x"]}
    counts = {"x": 3, "y": 2}
    range_assignment(subscriptions, counts)
    assert subscriptions == {"b": ["y", "x"], "a": ["x"]}
    assert counts == {"x": 3, "y": 2}


@pytest.mark.parametrize("partitions,members", list(itertools.product([1, 2, 3, 7, 10, 64], [1, 2, 3, 5, 8])))
def test_matches_kafkas_range_assignor_formula(partitions, members):
    ids = [f"consumer-{i}" for i in range(members)]
    result = range_assignment({m: ["t"] for m in reversed(ids)}, {"t": partitions})
    expected = kafka_range(partitions, ids)
    assert {m: result[m].get("t", []) for m in ids} == expected
    sizes = [len(expected[m]) for m in sorted(ids)]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True), "the members with one more come first"


def test_every_partition_assigned_exactly_once_random_subscriptions():
    rng = random.Random(2024)
    topics = [f"topic-{i}" for i in range(6)]
    for _ in range(200):
        counts = {t: rng.randint(0, 12) for t in topics}
        subscriptions = {
            f"m{rng.randint(0, 10**6):07d}-{i}": rng.sample(topics + ["unknown"], rng.randint(0, 4))
            for i in range(rng.randint(1, 9))
        }
        result = range_assignment(subscriptions, counts)
        assert set(result) == set(subscriptions)
        assert_each_partition_once(result, subscriptions, {t: c for t, c in counts.items() if c})
        for assigned in result.values():
            assert "unknown" not in assigned
            for parts in assigned.values():
                assert parts == list(range(parts[0], parts[0] + len(parts))) if parts else True, "consecutive"
