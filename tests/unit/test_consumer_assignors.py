"""KIP-848's server-side assignors: uniform balances to one partition and is sticky; range is
Kafka's ranges; the group's assignor is the one most members prefer."""

from __future__ import annotations

from app.coordinator.consumer_assignors import preferred_assignor, target_assignment, uniform_assignment


def _counts(assignment) -> list[int]:
    return sorted(sum(len(p) for p in topics.values()) for topics in assignment.values())


def _owners(assignment) -> dict:
    return {(t, p): m for m, topics in assignment.items() for t, ps in topics.items() for p in ps}


def test_uniform_balances_every_partition_once():
    subscriptions = {"a": ["t", "u"], "b": ["t", "u"], "c": ["t", "u"]}
    assignment = uniform_assignment(subscriptions, {"t": 4, "u": 3}, {})
    assert _counts(assignment) == [2, 2, 3]
    assert sorted(_owners(assignment)) == [("t", p) for p in range(4)] + [("u", p) for p in range(3)]


def test_uniform_moves_only_what_a_new_member_needs():
    before = uniform_assignment({"a": ["t"], "b": ["t"]}, {"t": 6}, {})
    after = uniform_assignment({"a": ["t"], "b": ["t"], "c": ["t"]}, {"t": 6}, before)
    assert _counts(after) == [2, 2, 2]
    moved = {tp for tp, member in _owners(after).items() if _owners(before).get(tp) != member}
    assert len(moved) == 2 and all(_owners(after)[tp] == "c" for tp in moved)
    # One leaving: its partitions go to the others, theirs stay.
    left = uniform_assignment({"a": ["t"], "c": ["t"]}, {"t": 6}, after)
    assert all(left["a"]["t"].count(p) for p in after["a"]["t"]) and all(p in left["c"]["t"] for p in after["c"]["t"])


def test_uniform_gives_each_partition_to_a_subscriber_of_its_topic():
    assignment = uniform_assignment({"a": ["t"], "b": ["u"]}, {"t": 3, "u": 1, "missing": 5}, {})
    assert assignment == {"a": {"t": [0, 1, 2]}, "b": {"u": [0]}}


def test_range_is_kafkas_ranges_and_the_preferred_assignor_is_the_most_named():
    assert target_assignment("range", {"a": ["t"], "b": ["t"]}, {"t": 3}, {}) == {"a": {"t": [0, 1]}, "b": {"t": [2]}}
    assert preferred_assignor([None, None]) == "uniform"
    assert preferred_assignor(["range", None, "uniform", "range"]) == "range"
